#!/usr/bin/env bash
# The GPU check for a bare GPU machine with no network: CUDA torch, pytest, pytest-xdist, pandas, Jinja2 and
# Hypothesis installed, the harness a checkout (run from it with PYTHONPATH, nothing pip-installed), FlashInfer
# only as the pack scripts/pack_flashinfer.py writes (flashinfer-pack.tar.gz beside the checkout).
#
#   scripts/gpu_check.sh [OUT_DIR]      (default: $OUT, else ./gpu-check)
#
# Tier 1 (CUDA torch only, within TIER1_S = 180 s): the library on the cuda engine with the torch-native backend
# (WORKERS pytest-xdist processes on the GPU, default min(12, cores)),
# the same runs under the tape engine on CUDA tensors and their verdict-by-verdict agreement, the graph
# semantics tests (tests/graphs) on both engines, the decode benchmark (replay against eager per bucket).
# Tier 2 (FlashInfer, within TOTAL_S = 480 s for both): unpack the pack, build the harness's kernel modules in
# parallel, the GPU suite (every test marked gpu), FlashInfer against torch-native in the benchmark. Without
# the pack, or without nvcc for FlashInfer's JIT, tier 2 is skipped with the reason.
# Every step runs under `timeout` and what is left of its tier; the log is OUT_DIR/gpu_check.log and the results
# table OUT_DIR/results.md (one row per step: status, seconds, note). Exit 1 when a step failed or timed out.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT_DIR=${1:-${OUT:-$ROOT/gpu-check}}
PY=${PYTHON:-python3}
PACK=${FLASHINFER_PACK:-$ROOT/flashinfer-pack.tar.gz}
TIER1_S=${TIER1_S:-180}
TOTAL_S=${TOTAL_S:-480}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT_DIR"
LOG=$OUT_DIR/gpu_check.log
TABLE=$OUT_DIR/results.md
: >"$LOG"
printf '| step | status | seconds | note |\n|---|---|---|---|\n' >"$TABLE"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# the JIT cache outside OUT_DIR: what a device run returns stays small
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-${TMPDIR:-/tmp}/harness-flashinfer}
export MAX_JOBS=${MAX_JOBS:-$JOBS}
cd "$ROOT" || exit 1
START=$(date +%s)
FAILED=0

log() { echo "$*" | tee -a "$LOG"; }
row() { printf '| %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4" >>"$TABLE"; }

# step NAME LIMIT_S DEADLINE_EPOCH CMD...: run CMD under the smaller of LIMIT_S and what is left before DEADLINE
step() {
  local name=$1 limit=$2 deadline=$3; shift 3
  local left=$((deadline - $(date +%s)))
  if [ "$left" -lt "$limit" ]; then limit=$left; fi
  if [ "$limit" -le 0 ]; then
    log "== $name: skipped, the tier's time is spent"; row "$name" skipped 0 "tier time spent"; FAILED=1; return
  fi
  log "== $name (limit ${limit} s): $*"
  local t0=$(date +%s%N) code
  timeout -k 10 "$limit" "$@" >>"$LOG" 2>&1
  code=$?
  local secs=$(( ($(date +%s%N) - t0) / 1000000 ))
  secs=$(printf '%d.%03d' $((secs / 1000)) $((secs % 1000)))
  case $code in
    0) log "== $name: passed in $secs s"; row "$name" passed "$secs" "" ;;
    124|137) log "== $name: timed out after $limit s"; row "$name" "timed out" "$secs" "limit $limit s"; FAILED=1 ;;
    *) log "== $name: failed (exit $code) in $secs s"; row "$name" failed "$secs" "exit $code"; FAILED=1 ;;
  esac
}

skip() { log "== $1: skipped: $2"; row "$1" skipped 0 "$2"; }

log "== machine"
# the environment block of GPU CI's dry run: python, torch and its CUDA build, FlashInfer, driver, devices
MACHINE=$("$PY" -m harness.gpuci --dry-run --no-flashinfer --out "$OUT_DIR" 2>&1)
code=$?
echo "$MACHINE" | sed -n '/^plan:/q;p' | tee -a "$LOG"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$LOG"
if [ $code -ne 0 ]; then
  log "FAILED: $PY cannot run the harness (is torch installed for it? PYTHON=... names another interpreter)"
  row machine failed 0 "harness not runnable"
  exit 1
fi
if echo "$MACHINE" | grep -q '^  no CUDA device visible'; then
  log "FAILED: no CUDA device visible to torch: this check needs a GPU"; row machine failed 0 "no CUDA device"
  exit 1
fi
row machine passed 0 ""

# ---- tier 1: CUDA torch only ----------------------------------------------------------------------------
# CUDA runs cannot be forked, so `harness run --jobs` runs them one at a time in one process: the library goes
# through pytest-xdist instead, WORKERS processes sharing the GPU (each a CUDA context of its own)
T1=$((START + TIER1_S))
WORKERS=${WORKERS:-$(( JOBS > 12 ? 12 : JOBS ))}
LIBRARY=(scenarios -q -p no:cacheprovider -n "$WORKERS" --harness-device=cuda -k "torch_native and not oracle")
# the results files stay out of OUT_DIR (about 8 MB each): the agreement step reads them here
WORK=${TMPDIR:-/tmp}/harness-gpu-check
mkdir -p "$WORK"
step t1-library-cuda 75 "$T1" "$PY" -m pytest "${LIBRARY[@]}" --harness-engine=cuda \
  --harness-json="$WORK/t1-cuda.json" --junitxml="$OUT_DIR/t1-library-cuda.xml"
step t1-library-tape 55 "$T1" "$PY" -m pytest "${LIBRARY[@]}" --harness-engine=tape \
  --harness-json="$WORK/t1-tape.json" --junitxml="$OUT_DIR/t1-library-tape.xml"
step t1-agree 10 "$T1" "$PY" -m harness.gpuci.agree "$WORK/t1-cuda.json" "$WORK/t1-tape.json"
step t1-graphs 25 "$T1" "$PY" -m pytest tests/graphs -q -p no:cacheprovider -n 4 --junitxml="$OUT_DIR/t1-graphs.xml"
step t1-bench 30 "$T1" "$PY" -m harness.bench --gpu --no-flashinfer --repeats 20 --out "$OUT_DIR/BENCHMARKS.md"

# ---- tier 2: FlashInfer from the pack ------------------------------------------------------------------
T2=$((START + TOTAL_S))
nvcc_found() { command -v nvcc >/dev/null || [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; }
if [ ! -f "$PACK" ]; then
  skip tier-2 "no FlashInfer pack at $PACK (python scripts/pack_flashinfer.py --out $PACK on a machine with FlashInfer)"
elif ! nvcc_found; then
  skip tier-2 "no nvcc (PATH or CUDA_HOME): FlashInfer's JIT cannot compile its kernels"
else
  PACK_DIR=${TMPDIR:-/tmp}/harness-flashinfer-pack
  step t2-unpack 30 "$T2" bash -c "rm -rf '$PACK_DIR' && mkdir -p '$PACK_DIR' && tar -xzf '$PACK' -C '$PACK_DIR'"
  PACK_PY=$(sed -n 's/.*"python": "\(cp[0-9]*\)".*/\1/p' "$PACK_DIR/MANIFEST.json" 2>/dev/null)
  HERE_PY=$("$PY" -c 'import sys; print(f"cp{sys.version_info.major}{sys.version_info.minor}")')
  if [ "$PACK_PY" != "$HERE_PY" ]; then
    skip tier-2 "the pack's tvm-ffi is built for ${PACK_PY:-an unknown Python}, this is $HERE_PY: repack with this Python"
  else
    export PYTHONPATH="$PYTHONPATH:$PACK_DIR/site" PATH="$PACK_DIR/bin:$PATH"
    step t2-jit 200 "$T2" "$PY" -m harness.gpuci.jit
    step t2-gpu-suite 150 "$T2" "$PY" -m pytest -m gpu tests -q -n 4 -p no:cacheprovider --harness-device=cuda \
      --junitxml="$OUT_DIR/t2-gpu-suite.xml"
    step t2-bench 45 "$T2" "$PY" -m harness.bench --gpu --repeats 20 --out "$OUT_DIR/BENCHMARKS.md"
  fi
fi

log "== results ($(( $(date +%s) - START )) s in all)"
tee -a "$LOG" <"$TABLE"
exit $FAILED

"""``python -m harness.bench`` (``make bench``): graph replay time against eager time, per model preset and bucket.

A captured graph exists to remove per-step overhead, so replaying it should cost no more than the eager
forward it replaces. This module measures both on identical batches and identical pool state:

* decode graphs (``mode="full"``): ``DecodeGraphRunner.forward`` on a decode batch of exactly ``bucket``
  requests (and, where the bucket is above 1, of ``bucket - 1`` requests padded into it), which includes
  filling the static buffers, the backend's replay-metadata hook and the replay: what an engine pays per
  decode step;
* piecewise prefill graphs (``mode="piecewise"``): ``PiecewisePrefillRunner.forward`` on one extend batch
  of exactly ``bucket`` tokens.

Each is compared with ``EagerRunner.forward`` built over the same model, backend and pool. Repeated
forwards on one batch are idempotent (the KV writes rewrite the same slots with the same values), so one
batch is timed over and over. The numbers are measurements, never assertions: a row where replay is slower
than eager is flagged in the ``ok`` column, and the command still succeeds.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from .bench_rows import GPU_GOAL_MAX_BS, GPU_GOAL_SPEEDUP, BenchRow, GpuBenchRow
from .diffbench import measure_diff
from .check.run.assemble import RunParts, assemble
from .check.run.malloc import keep_freed_memory
from .check.run.workers import collector_between_tasks
from .report.bench import (
    DIFF_BEGIN,
    DIFF_END,
    render_diff_markdown,
    render_markdown,
    render_terminal,
    write_section,
)
from .runners.base import Runner, RunnerContext
from .runners.eager import EagerRunner
from .runners.speculative import SpeculativeWorker
from .runspec import GraphSpec, RunSpec
from .serving.batch import ForwardBatch
from .serving.model import PRESETS, model_spec
from .serving.pool import PoolSpec
from .serving.timeline import RequestSpec, TimelineSpec

__all__ = ["DECODE_BUCKETS", "PREFILL_BUCKETS", "measure", "measure_gpu", "run_bench", "run_gpu_bench"]

DECODE_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16)
PREFILL_BUCKETS: tuple[int, ...] = (16, 32, 64)
_WARMUP = 10
"""calls of each path before the timed pairs: past the tape's ``COMPILE_AFTER`` (8), where a graph's replay
runs from its compiled function, the steady state a runner replaying a bucket all day sees"""

# Big enough for 16 requests of up to ~2W+16 tokens each without the allocator running dry; the
# page-table width (max_context_len) stays at the harness default so the attention kernel reads the
# same number of columns as in every scenario run.
_POOL = PoolSpec(full_size=1024, swa_size=1024, max_context_len=64, max_running_requests=16)



# ---- building the batches ---------------------------------------------------------------------------


def _spec(preset: str, timeline: TimelineSpec, *, mode: str, graphs: GraphSpec, engine: str, device: str,
          backend: str = "torch_native", dtype: str | None = None) -> RunSpec:
    model, pool = model_spec(preset), _POOL
    if dtype is not None:  # FlashInfer's shape: no float32 kernels, head dims of 64 and up
        model = dataclasses.replace(model, dtype=dtype, head_dim=max(64, model.head_dim))
        pool = dataclasses.replace(pool, kv_dtype=dtype)
    return RunSpec(model=model, pool=pool, timeline=timeline, mode=mode, engine=engine, device=device,
                   graphs=graphs, backend=backend)


def _eager_over(session: RunParts) -> EagerRunner:
    # the same model, backend and pool objects as the graph runner, so both paths do identical work
    return EagerRunner(RunnerContext(model=session.model, backend=session.backend, pool=session.pool,
                                     req_to_token_pool=session.req_to_token_pool))


def _decode_case(preset: str, bucket: int, real: int, engine: str, device: str, *, backend: str = "torch_native",
                 dtype: str | None = None) -> tuple[Runner, EagerRunner, ForwardBatch]:
    window = model_spec(preset).window
    # prompts past the window and of different lengths: SWA slots are already evicted and the page
    # table rows differ, as in a real decode batch
    requests = tuple(RequestSpec(rid=f"r{i}", prompt_len=window + 1 + i, output_len=2) for i in range(real))
    session = assemble(_spec(preset, TimelineSpec(requests=requests, seed=31), mode="full",
                                  graphs=GraphSpec(decode_buckets=(bucket,)), engine=engine, device=device,
                                  backend=backend, dtype=dtype))
    eager = _eager_over(session)
    while (step := session.scheduler.next_step()) is not None and step.kind != "decode":
        SpeculativeWorker(eager).run(step.batch)
        session.scheduler.finish_step()  # frees the SWA slots of tokens that left the window
    if step is None or step.batch.batch_size != real:
        raise RuntimeError(f"{preset}: expected a decode batch of {real} requests, got {step}")
    return session.runner.dispatch(step.batch).runner, eager, step.batch


def _prefill_case(preset: str, bucket: int, engine: str, device: str) -> tuple[Runner, EagerRunner, ForwardBatch]:
    timeline = TimelineSpec(requests=(RequestSpec(rid="p", prompt_len=bucket, output_len=0),), seed=32)
    session = assemble(_spec(preset, timeline, mode="piecewise", graphs=GraphSpec(prefill_buckets=(bucket,)),
                                  engine=engine, device=device))
    step = session.scheduler.next_step()
    if step is None or step.kind != "extend" or step.batch.num_tokens != bucket:
        raise RuntimeError(f"{preset}: expected an extend batch of {bucket} tokens, got {step}")
    return session.runner.dispatch(step.batch).runner, _eager_over(session), step.batch


# ---- timing -----------------------------------------------------------------------------------------


def _timed(fn: Callable[[], object], sync: Callable[[], None]) -> float:
    # as a library run pays it: a worker child runs each task without the cyclic collector and collects after
    # it, so a collection set off by what a capture allocates (thousands of pins and steps) is no run's cost
    with collector_between_tasks():
        sync()
        start = time.perf_counter()
        fn()
        sync()
        return (time.perf_counter() - start) * 1e3


def _compare(
    graph: Runner, eager: EagerRunner, batch: ForwardBatch, *, repeats: int, warmup: int, device: str
) -> tuple[float, float, list[float]]:
    """Median eager and graph milliseconds and the per-pair ratios; calls alternate so drift (clock,
    cache, a neighbour's load) hits both alike."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(warmup):
        eager.forward(batch)
        graph.forward(batch)
    eager_ms, graph_ms = [], []
    for _ in range(max(1, repeats)):
        eager_ms.append(_timed(lambda: eager.forward(batch), sync))
        graph_ms.append(_timed(lambda: graph.forward(batch), sync))
    return statistics.median(eager_ms), statistics.median(graph_ms), [g / e for g, e in zip(graph_ms, eager_ms)]


def _capture_ms(graph: Runner, bucket: int, *, repeats: int, device: str) -> float:
    """Median time to capture the bucket's graph again (warm-up included), as a runner does at start-up: with no
    graph of the bucket's yet, so the one the last capture left is let go before the timing, not inside it."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    capture = graph._capture  # noqa: SLF001 - the bench times the runner's own capture path

    def once() -> float:
        graph.graphs.pop(bucket, None)
        graph.outputs.pop(bucket, None)
        return _timed(lambda: capture(bucket), sync)

    return statistics.median(once() for _ in range(max(1, repeats)))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _targets() -> list[tuple[str, str]]:
    """(engine, device) pairs this machine can measure: the tape on CPU always, real graphs where CUDA is."""
    out = [("tape", "cpu")]
    if torch.cuda.is_available():
        out.append(("cuda", "cuda"))
    return out


def measure(
    *,
    presets: Sequence[str] | None = None,
    decode_buckets: Sequence[int] = DECODE_BUCKETS,
    prefill_buckets: Sequence[int] = PREFILL_BUCKETS,
    repeats: int = 60,
    warmup: int = _WARMUP,
    padded: bool = True,
    targets: Sequence[tuple[str, str]] | None = None,
    progress: Callable[[BenchRow], None] | None = None,
) -> list[BenchRow]:
    """One row per (target, preset, graph kind, bucket[, padded]); ``targets`` defaults to what is available."""
    rows: list[BenchRow] = []
    for engine, device in targets or _targets():
        for preset in presets or tuple(PRESETS):
            cases: list[tuple[str, int, int]] = []
            for bucket in decode_buckets:
                cases.append(("decode", bucket, bucket))
                if padded and bucket > 1:
                    cases.append(("decode", bucket, bucket - 1))
            cases.extend(("prefill", bucket, bucket) for bucket in prefill_buckets)
            for kind, bucket, real in cases:
                if kind == "decode":
                    graph, eager, batch = _decode_case(preset, bucket, real, engine, device)
                else:
                    graph, eager, batch = _prefill_case(preset, bucket, engine, device)
                capture_ms = _capture_ms(graph, bucket, repeats=3, device=device)
                eager_ms, replay_ms, ratios = _compare(graph, eager, batch, repeats=repeats, warmup=warmup,
                                                       device=device)
                row = BenchRow(preset=preset, kind=kind, bucket=bucket, real=real, engine=engine, device=device,
                               eager_ms=eager_ms, replay_ms=replay_ms, ratio=statistics.median(ratios),
                               ratio_p10=_percentile(ratios, 0.1), ratio_p90=_percentile(ratios, 0.9),
                               capture_ms=capture_ms)
                rows.append(row)
                if progress is not None:
                    progress(row)
    return rows


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _machine_info(targets: Sequence[tuple[str, str]], repeats: int) -> dict[str, str]:
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count() or "unknown"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch threads": str(torch.get_num_threads()),
        # other processes on a small machine skew wall-clock times (and oversubscribe torch's threads)
        "load average at start": _load_average(),
        "engine/device": ", ".join(f"{e}/{d}" for e, d in targets),
        "repeats": f"{repeats} (median), {_WARMUP} warm-up calls",
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def _load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


def run_bench(*, repeats: int = 60, out: Path = Path("BENCHMARKS.md")) -> int:
    """Measure every preset and bucket, print the table, rewrite the section of ``out``; always 0."""
    targets = _targets()
    info = _machine_info(targets, repeats)

    def progress(row: BenchRow) -> None:
        sys.stderr.write(f"  {row.engine}/{row.device} {row.preset} {row.kind} bucket={row.bucket} real={row.real}: "
                         f"{row.ratio:.2f}\n")
        sys.stderr.flush()

    rows = measure(repeats=repeats, targets=targets, progress=progress)
    info["load average at end"] = _load_average()
    print(render_terminal(rows, info))
    write_section(out, render_markdown(rows, info))
    print(f"Markdown: {out.resolve()}")
    return 0


# ---- on a GPU: decode replay against eager, FlashInfer against torch-native -----------------------------


def measure_gpu(*, preset: str = "gpt-oss-mini", buckets: Sequence[int] = DECODE_BUCKETS, repeats: int = 30,
                backends: Sequence[tuple[str, str | None]] = (("torch_native", None), ("torch_native", "bfloat16"),
                                                              ("flashinfer", "bfloat16"))) -> list[GpuBenchRow]:
    """Decode step time per bucket on CUDA, eager against the CUDA-graph replay, per (backend, dtype): the
    preset as it is, and FlashInfer against torch-native on one bfloat16, head_dim >= 64 copy of it."""
    rows = []
    for backend, dtype in backends:
        for bucket in buckets:
            graph, eager, batch = _decode_case(preset, bucket, bucket, "cuda", "cuda", backend=backend, dtype=dtype)
            eager_ms, replay_ms, _ = _compare(graph, eager, batch, repeats=repeats, warmup=_WARMUP, device="cuda")
            rows.append(GpuBenchRow(backend=backend, dtype=dtype or model_spec(preset).dtype, bucket=bucket,
                                    eager_ms=eager_ms, replay_ms=replay_ms))
            sys.stderr.write(f"  {backend}/{rows[-1].dtype} bucket={bucket}: eager {eager_ms:.3f} ms, "
                             f"replay {replay_ms:.3f} ms\n")
    return rows


def render_gpu_markdown(rows: Sequence[GpuBenchRow], device: str) -> str:
    """The GPU rows as a markdown table, then FlashInfer's step time against torch-native's per bucket."""
    lines = [f"## Decode on {device}", "",
             f"Goal: replay at least {GPU_GOAL_SPEEDUP:g}x faster than eager for batch sizes up to {GPU_GOAL_MAX_BS}.",
             "", "| backend | dtype | bucket | eager ms | replay ms | speedup | goal |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r.backend} | {r.dtype} | {r.bucket} | {r.eager_ms:.3f} | {r.replay_ms:.3f} | {r.speedup:.2f}x | "
              f"{r.goal} |" for r in rows]
    by = {(r.backend, r.dtype, r.bucket): r for r in rows}
    pairs = [(by[k], by[("torch_native", k[1], k[2])]) for k in by if k[0] == "flashinfer"
             and ("torch_native", k[1], k[2]) in by]
    if pairs:
        lines += ["", "| bucket | FlashInfer eager / torch-native eager | FlashInfer replay / torch-native replay |",
                  "|---|---|---|"]
        lines += [f"| {fi.bucket} | {fi.eager_ms / tn.eager_ms:.2f} | {fi.replay_ms / tn.replay_ms:.2f} |"
                  for fi, tn in pairs]
    return "\n".join(lines) + "\n"


def run_gpu_bench(*, repeats: int, out: Path, flashinfer: bool) -> int:
    """The GPU rows, printed and written into ``out``; 1 where a row misses the replay goal, 2 without a GPU."""
    if not torch.cuda.is_available():
        print("the GPU benchmark needs CUDA: no GPU on this machine", file=sys.stderr)
        return 2
    backends = [("torch_native", None), ("torch_native", "bfloat16")]
    if flashinfer:
        backends.append(("flashinfer", "bfloat16"))
    rows = measure_gpu(repeats=repeats, backends=backends)
    section = render_gpu_markdown(rows, torch.cuda.get_device_name())
    print(section)
    write_section(out, section, begin=GPU_BEGIN, end_marker=GPU_END)
    return 1 if any(r.goal == "missed" for r in rows) else 0


GPU_BEGIN = "<!-- bench-gpu:begin -->"
GPU_END = "<!-- bench-gpu:end -->"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.bench",
                                     description="graph replay time against eager time per preset and bucket")
    parser.add_argument("--repeats", type=int, default=60, help="interleaved eager/replay pairs per row")
    parser.add_argument("--out", default="BENCHMARKS.md", help="markdown file the table is written into")
    parser.add_argument("--diff-cache-mib", type=int, default=1024,
                        help="size of the synthetic KV cache the diff benchmark compares (it needs ~4x this in RAM)")
    parser.add_argument("--diff-only", action="store_true", help="measure only the diff (its section of --out)")
    parser.add_argument("--gpu", action="store_true",
                        help="only the GPU rows: decode replay against eager per bucket, FlashInfer against torch-native "
                             f"(exit 1 where replay is under {GPU_GOAL_SPEEDUP:g}x faster up to bucket {GPU_GOAL_MAX_BS})")
    parser.add_argument("--no-flashinfer", action="store_true", help="with --gpu: leave FlashInfer out")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    # as a worker child runs: otherwise a call's time holds however many fresh pages the allocator's history gives it
    keep_freed_memory()
    if args.gpu:
        return run_gpu_bench(repeats=min(args.repeats, 30), out=Path(args.out), flashinfer=not args.no_flashinfer)
    code = 0 if args.diff_only else run_bench(repeats=args.repeats, out=Path(args.out))
    return code or run_diff_bench(cache_mib=args.diff_cache_mib, out=Path(args.out))


def run_diff_bench(*, cache_mib: int, out: Path) -> int:
    """The diff's throughput against a plain copy of the same bytes: identical, with 1% and 10% of the live
    slots bad, and with 1k/10k/100k bad slots; each diff also timed through the judge."""
    sys.stderr.write(f"diff benchmark on a {cache_mib} MiB cache...\n")
    rows = measure_diff(cache_mib << 20)
    machine = f"{_cpu_model()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, load {_load_average()}"
    section = "## Diff throughput\n\n" + render_diff_markdown(rows, machine)
    print(section)
    write_section(out, section, begin=DIFF_BEGIN, end_marker=DIFF_END)
    return 0


if __name__ == "__main__":
    sys.exit(main())

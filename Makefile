# Every target bootstraps .venv from pyproject.toml; it is rebuilt when pyproject.toml or the
# constraints file changes.
PYTHON ?= python3
VENV ?= .venv
# CPU machines pin the local CPU build of torch; GPU CI overrides this (e.g. CONSTRAINTS=) to keep its CUDA torch.
CONSTRAINTS ?= constraints/cpu.txt
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
GPU_STAMP := $(VENV)/.installed-gpu
PYTEST_WORKERS ?= auto
# the test targets start many interpreters (xdist workers, CLI subprocesses): let them share compiled bytecode
# (in __pycache__/, ignored by git) where the environment turned that off
TEST_ENV := env -u PYTHONDONTWRITEBYTECODE

.PHONY: venv test test-slow test-all test-gpu gpu-plan gpu-durations sglang-venv test-sglang fuzz-venv fuzz-campaign report report-quick screenshots chromium bench fuzz clean

venv: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e .
	@# compile the project's modules once, as pytest rewrites them, so the test processes start from bytecode
	-@$(TEST_ENV) $(PY) -m pytest --collect-only -q >/dev/null 2>&1
	touch $(STAMP)

# everything but what is marked slow (tests/README.md says what is): every library scenario on its first backend,
# each design's every distinct expected verdict once (check/matrix/quick.py), and the harness's own tests; CI runs
# test-slow after it
test: $(STAMP) chromium
	$(TEST_ENV) $(PY) -m pytest -n $(PYTEST_WORKERS) -m "not slow"

# what test leaves out: the library's cells on its scenarios' other backends, and the tests marked slow
test-slow: $(STAMP) chromium
	$(TEST_ENV) $(PY) -m pytest -n $(PYTEST_WORKERS) -m slow

# test and test-slow in one session
test-all: $(STAMP) chromium
	$(TEST_ENV) $(PY) -m pytest -n $(PYTEST_WORKERS)

# the gpu extra (flashinfer-python) and the ci extra (pytest-split, pytest-timeout) on top of the base install,
# once per change of pyproject.toml
$(GPU_STAMP): $(STAMP)
	$(PY) -m pip install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e '.[gpu,ci]'
	touch $(GPU_STAMP)

# GPU CI (docs/gpu.md): python -m harness.gpuci prints the machine, builds FlashInfer's JIT modules, runs the
# GPU tests, tests/graphs and every scenario under the cuda and tape engines (one xdist worker per GPU), checks
# that the engines agree, and writes its log, JUnit files, HTML reports and summary.md to GPU_OUT. FlashInfer's
# JIT cache lives under FLASHINFER_WORKSPACE_BASE (FlashInfer reads it: kernels compile once per machine).
# A shard of a CI matrix: make test-gpu SPLITS=4 GROUP=2. HARNESS_REQUIRE_GPU=1: no GPU is an error, not a skip.
FLASHINFER_WORKSPACE_BASE ?= $(CURDIR)/.cache/gpu
GPU_OUT ?= reports/gpu
GPU_CI_ARGS ?=
GPU_CI = FLASHINFER_WORKSPACE_BASE=$(FLASHINFER_WORKSPACE_BASE) $(PY) -m harness.gpuci --out $(GPU_OUT) \
	$(if $(SPLITS),--splits $(SPLITS) $(if $(GROUP),--group $(GROUP))) $(GPU_CI_ARGS)

test-gpu: $(GPU_STAMP)
	$(GPU_CI)

# the steps and commands test-gpu would run here, without running them; with SPLITS=N (no GROUP), every shard's
# items and estimated time (the ci extra alone: pytest-split)
CI_STAMP := $(VENV)/.installed-ci
$(CI_STAMP): $(STAMP)
	$(PY) -m pip install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e '.[ci]'
	touch $(CI_STAMP)

gpu-plan: $(CI_STAMP)
	$(GPU_CI) --dry-run

# re-record tests/gpu_durations.json (pytest-split's balance of the shards) from a whole GPU run; commit it
gpu-durations: $(GPU_STAMP)
	$(GPU_CI) --store-durations

# The SGLang target: the installed SGLang 0.5.23 under the harness (README, "Against real SGLang"), in its own
# virtual environment. sglang goes in without its declared dependencies (they pin a CUDA torch and FlashInfer),
# then the packages its import chain needs, pinned by constraints/sglang.txt.
SGLANG_VENV ?= .venv-sglang
SGLANG_PY := $(SGLANG_VENV)/bin/python
SGLANG_STAMP := $(SGLANG_VENV)/.installed
SGLANG_IMPORT_DEPS := numpy orjson psutil pybase64 requests triton packaging pillow starlette msgspec pydantic \
	pyzmq tqdm ipython aiohttp transformers dill sentencepiece compressed-tensors gguf openai partial-json-parser \
	einops uvicorn fastapi apache-tvm-ffi

sglang-venv: $(SGLANG_STAMP)

$(SGLANG_STAMP): pyproject.toml $(CONSTRAINTS) constraints/sglang.txt
	test -x $(SGLANG_PY) || $(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_PY) -m pip install --quiet --upgrade pip
	$(SGLANG_PY) -m pip install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e .
	$(SGLANG_PY) -m pip install --quiet --no-deps -c constraints/sglang.txt sglang
	$(SGLANG_PY) -m pip install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -c constraints/sglang.txt $(SGLANG_IMPORT_DEPS)
	touch $(SGLANG_STAMP)

# importing SGLang costs each xdist worker a few seconds, far less than the items it takes over (two workers:
# 154 s where one process took 264 s, tests/README.md)
test-sglang: $(SGLANG_STAMP)
	$(TEST_ENV) $(SGLANG_PY) -m pytest -n $(PYTEST_WORKERS) tests/sglang

# the HTML report, results.json and results.csv in reports/ (exits 1 when a verdict is unexpected; the report is
# written all the same)
report: $(STAMP)
	$(PY) -m harness report

# a first look: make test's share (check/matrix/quick.py) of the scenarios that inject no fault (176 runs; 12 s idle at 155
# on two cores), into the same reports/
report-quick: $(STAMP)
	$(PY) -m harness report --quick --no-faults --report-dir reports

# docs/report-index.png and docs/report-scenario.png for the README, from reports/ (written first if missing)
screenshots: $(STAMP) chromium
	test -f reports/index.html || $(PY) -m harness report || true
	$(PY) -m harness.report.screenshots --report reports --out docs

# The browser test opens the report in headless Chromium. Install it when it is missing and the machine
# allows (Debian's package, as root); otherwise say so: the browser test then skips with that reason.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	command -v google-chrome >/dev/null 2>&1 || [ -n "$$CHROMIUM" ] || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
		echo "could not install chromium: the browser test will skip"; \
	else \
		echo "chromium is not installed (apt-get install chromium, as root): the browser test will skip"; \
	fi

# the timeline fuzzer (docs/fuzzing.md): each sound design below, clean, must give no failure in its budget, and
# each known-bad configuration must be found, shrunk and written under scenarios/regressions/ (once per
# signature: a second run replays it from Hypothesis's example database in .cache/fuzz/ and writes nothing new).
# A target is design:mode[:fault]; FUZZ="--design D --mode M ..." runs that one search instead; FUZZ_OUT=DIR
# writes the findings there instead.
FUZZ_BUDGET ?= 60
FUZZ_SEED ?= 0
FUZZ_SOUND ?= forward_batch:full translate:piecewise metadata:eager
FUZZ_KNOWN_BAD ?= stale_state:eager forward_batch:full:no_zero_swa_pad forward_batch:full:pad_slot_minus_one \
	forward_batch:eager:fused_fp8_scale_dropped forward_batch:full:draft_metadata_captured_once \
	forward_batch:eager:skip_free_rejected forward_batch:eager:draft_tree_swa_untranslated \
	forward_batch:eager:draft_extend_without_swa_window
# over the installed SGLang (design:mode[:fault]@sglang), run with its venv's interpreter
FUZZ_SOUND_SGLANG ?= forward_batch:eager@sglang
FUZZ_KNOWN_BAD_SGLANG ?= forward_batch:eager:sglang_skip_evict_mid_prefill@sglang
# SGLang's own decode graph runner against its eager run (--target sglang-graph): clean, then each fault named here
FUZZ_GRAPH_SGLANG ?= yes
FUZZ_GRAPH_FAULTS_SGLANG ?= swa_pad_tail_left_stale metadata_not_refreshed_on_replay verify_graph_swa_metadata_not_refreshed
FUZZ ?=
FUZZ_FLAGS = fuzz --budget $(FUZZ_BUDGET) --seed $(FUZZ_SEED)$(if $(FUZZ_OUT), --out $(FUZZ_OUT))
FUZZ_RUN = $(PY) -m harness $(FUZZ_FLAGS)
# design:mode[:fault...][@stack] -> the command's flags, and the interpreter: SGLang's for a target over it
FUZZ_ARGS = stack=$${t\#\#*@}; [ "$$stack" = "$$t" ] && stack=; set -- $$(echo $${t%@*} | tr : ' '); \
	args="--design $$1 --mode $$2$${3:+ --fault $$3}$${stack:+ --serving $$stack}"; \
	py=$$([ -n "$$stack" ] && echo $(SGLANG_PY) || echo $(PY))
FUZZ_SGLANG_STAMP = $(if $(strip $(FUZZ_SOUND_SGLANG)$(FUZZ_KNOWN_BAD_SGLANG)$(FUZZ_GRAPH_SGLANG)),$(SGLANG_STAMP))

fuzz: $(STAMP) $(if $(strip $(FUZZ)),,$(FUZZ_SGLANG_STAMP))
ifneq ($(strip $(FUZZ)),)
	$(FUZZ_RUN) $(FUZZ)
else
	@for t in $(FUZZ_SOUND) $(FUZZ_SOUND_SGLANG); do $(FUZZ_ARGS); echo "$$py -m harness $(FUZZ_FLAGS) $$args"; \
		$$py -m harness $(FUZZ_FLAGS) $$args || { echo "fuzz: a false alarm in $$t (above)"; exit 1; }; done
	@for t in $(FUZZ_KNOWN_BAD) $(FUZZ_KNOWN_BAD_SGLANG); do $(FUZZ_ARGS); echo "$$py -m harness $(FUZZ_FLAGS) $$args"; \
		if $$py -m harness $(FUZZ_FLAGS) $$args; then echo "fuzz: $$t gave no failure in $(FUZZ_BUDGET)s"; exit 1; fi; done
ifneq ($(strip $(FUZZ_GRAPH_SGLANG)),)
	$(SGLANG_PY) -m harness $(FUZZ_FLAGS) --target sglang-graph || { echo "fuzz: a false alarm in sglang-graph (above)"; exit 1; }
	@for f in $(FUZZ_GRAPH_FAULTS_SGLANG); do echo "$(SGLANG_PY) -m harness $(FUZZ_FLAGS) --target sglang-graph --fault $$f"; \
		if $(SGLANG_PY) -m harness $(FUZZ_FLAGS) --target sglang-graph --fault $$f; then \
		echo "fuzz: sglang-graph with $$f gave no failure in $(FUZZ_BUDGET)s"; exit 1; fi; done
endif
endif

# A long campaign (docs/fuzzing.md, "Long campaigns: HypoFuzz"): HypoFuzz fuzzes harness/fuzz/campaign.py, the same
# property as make fuzz, on HARNESS_FUZZ_TARGET (design:mode[:fault...]) with CAMPAIGN_PROCS worker processes for
# CAMPAIGN_SECONDS, then stops; whatever it found is in the example database (.cache/fuzz/), which the search then
# replays first for CAMPAIGN_REPLAY_BUDGET seconds, shrinking it further and writing it under scenarios/regressions/
# (FUZZ_OUT=DIR elsewhere). It succeeds whether or not a failure was found (the written file is the finding), and
# fails when HypoFuzz itself broke or the target is not one (harness/fuzz/campaign_run.py says how it tells).
# HypoFuzz lives in its own virtual environment: its release needs an older Hypothesis (constraints/fuzz.txt).
FUZZ_VENV ?= .venv-fuzz
FUZZ_PY := $(FUZZ_VENV)/bin/python
FUZZ_STAMP := $(FUZZ_VENV)/.installed
HARNESS_FUZZ_TARGET ?= forward_batch:full
CAMPAIGN_SECONDS ?= 120
CAMPAIGN_PROCS ?= 1
CAMPAIGN_REPLAY_BUDGET ?= 30

fuzz-venv: $(FUZZ_STAMP)

$(FUZZ_STAMP): pyproject.toml $(CONSTRAINTS) constraints/fuzz.txt
	test -x $(FUZZ_PY) || $(PYTHON) -m venv $(FUZZ_VENV)
	$(FUZZ_PY) -m pip install --quiet --upgrade pip
	$(FUZZ_PY) -m pip install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -c constraints/fuzz.txt -e '.[campaign]'
	touch $(FUZZ_STAMP)

fuzz-campaign: $(FUZZ_STAMP) $(STAMP)
	HARNESS_FUZZ_TARGET=$(HARNESS_FUZZ_TARGET) $(FUZZ_PY) -m harness.fuzz.campaign_run \
		--seconds $(CAMPAIGN_SECONDS) --procs $(CAMPAIGN_PROCS)
	@t=$(HARNESS_FUZZ_TARGET); $(FUZZ_ARGS); for f in $$(echo $$t | cut -s -d: -f4- | tr : ' '); do \
		args="$$args --fault $$f"; done; \
		echo "$(PY) -m harness fuzz --budget $(CAMPAIGN_REPLAY_BUDGET) --seed $(FUZZ_SEED) $$args"; \
		$(PY) -m harness fuzz --budget $(CAMPAIGN_REPLAY_BUDGET) --seed $(FUZZ_SEED)$(if $(FUZZ_OUT), --out $(FUZZ_OUT)) $$args; \
		[ $$? -le 1 ]

bench: $(STAMP)
	$(PY) -m harness.bench

clean:
	rm -rf $(VENV) $(SGLANG_VENV) $(FUZZ_VENV) .bench

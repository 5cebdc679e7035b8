"""The steps of a GPU CI run, as data: what ``python -m harness.gpuci --dry-run`` prints and the runner executes.

Each pytest step runs with one xdist worker per visible GPU (``HARNESS_WORKER_GPUS`` pins each, see
``pinning``), its own JUnit file, pytest-timeout's per-test limit where the plugin is installed, and the
shard's slice of the items where a CI matrix splits the suite (pytest-split over the durations recorded in
``tests/gpu_durations.json``). The two scenario steps collect the same items under the two engines, so one
shard's slice is the same runs in both and their verdicts can be paired.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DURATIONS", "STEP_NAMES", "Settings", "Step", "ci_plan"]

DURATIONS = Path("tests/gpu_durations.json")
"""pytest-split's durations, recorded from a GPU run (``make gpu-durations``)"""
SPLITTING_ALGORITHM = "duration_based_chunks"
"""contiguous slices in collection order: a scenario added moves only the items at the slices' edges to
another shard, where least_duration's greedy packing may reshuffle every shard"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    name: str
    argv: tuple[str, ...]
    """the command; ``()`` for a step the runner does itself (the environment)"""
    timeout_s: float
    """the step's own limit (the whole run's limit may cut it shorter)"""
    junit: Path | None = None
    """the JUnit file a pytest step writes"""
    gpu_tests: bool = False
    """its passed or failed tests count towards "some GPU test ran\""""
    env: Mapping[str, str] = field(default_factory=dict)
    """added to the runner's environment"""
    why: str = ""
    """the line the dry run prints under the step"""
    selection: tuple[str, ...] = ()
    """a pytest step's paths and filters: what it collects before the shard's slice is taken"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    out: Path
    gpus: tuple[str, ...]
    """the devices workers are pinned to (``CUDA_VISIBLE_DEVICES`` entries)"""
    workers_per_gpu: int = 1
    flashinfer: bool = True
    """run the FlashInfer backend too (its JIT build, its GPU tests, its scenario runs)"""
    keyword: str | None = None
    """pytest ``-k`` for the scenario steps (``torch_native``: one backend)"""
    splits: int | None = None
    group: int | None = None
    store_durations: bool = False
    test_timeout_s: float | None = 600.0
    """pytest-timeout's ``--timeout``; None where the plugin is missing"""
    step_timeouts: Mapping[str, float] = field(default_factory=dict)
    python: str = sys.executable

    def problems(self) -> list[str]:
        """Why these settings cannot make a plan; empty when they can."""
        out = []
        if self.splits is not None and self.splits < 1:
            out.append(f"--splits must be at least 1, got {self.splits}")
        elif (self.splits is None) != (self.group is None):
            out.append("--splits and --group go together (a dry run takes --splits alone: every shard's plan)")
        elif self.splits is not None and not 1 <= self.group <= self.splits:
            out.append(f"--group must be from 1 to --splits ({self.splits}), got {self.group}")
        if self.workers_per_gpu < 1:
            out.append(f"--workers-per-gpu must be at least 1, got {self.workers_per_gpu}")
        return out


# generous defaults for a CI machine; gpu_check.sh and CI matrices cut them with --step-timeout
_STEP_TIMEOUTS = {"jit": 1200.0, "gpu-tests": 1800.0, "graphs": 900.0, "scenarios-cuda": 3600.0,
                  "scenarios-tape": 3600.0, "agree": 120.0}
STEP_NAMES = tuple(_STEP_TIMEOUTS)
"""the steps a ``--step-timeout`` may name"""


def _pytest(s: Settings, name: str, selection: Sequence[str], *extra: str, store_durations: bool) -> tuple[str, ...]:
    argv = [s.python, "-m", "pytest", *selection, "-q", "-rfEs", "-n", str(max(1, len(s.gpus)) * s.workers_per_gpu),
            f"--junitxml={s.out / f'{name}.xml'}", *extra]
    if s.test_timeout_s is not None:
        argv.append(f"--timeout={s.test_timeout_s:g}")
    if s.splits is not None:
        argv += [f"--splits={s.splits}", f"--group={s.group}", f"--durations-path={DURATIONS}",
                 f"--splitting-algorithm={SPLITTING_ALGORITHM}"]
    if store_durations:
        argv += ["--store-durations", f"--durations-path={DURATIONS}"]
    return tuple(argv)


def ci_plan(s: Settings) -> list[Step]:
    """The steps of ``make test-gpu`` (or of one shard of it) under these settings."""
    env = {"HARNESS_WORKER_GPUS": ",".join(s.gpus)} if s.gpus else {}
    timeout = {**_STEP_TIMEOUTS, **s.step_timeouts}
    # the tape run's items are the cuda run's ids: recording both would overwrite one engine's times with the other's
    store = s.store_durations
    scenario_opts = ["--harness-device=cuda", *(["--harness-backend=flashinfer"] if s.flashinfer else []),
                     *(["-k", s.keyword] if s.keyword else [])]
    steps = [Step(name="environment", argv=(), timeout_s=60.0,
                  why="device, driver, torch and FlashInfer versions; refuses a promised GPU that is missing")]
    if s.flashinfer:
        steps.append(Step(name="jit", argv=(s.python, "-m", "harness.gpuci.jit"), timeout_s=timeout["jit"],
                          why="FlashInfer's kernel modules for the harness's shapes, compiled in parallel into "
                              "the JIT cache (FLASHINFER_WORKSPACE_BASE) before any test needs one"))
    gpu_tests = ("tests", "-m", "gpu", "--ignore=tests/graphs", "--harness-device=cuda")
    scenarios = ("scenarios", *scenario_opts)
    steps += [
        Step(name="gpu-tests", timeout_s=timeout["gpu-tests"], junit=s.out / "gpu-tests.xml", gpu_tests=True, env=env,
             argv=_pytest(s, "gpu-tests", gpu_tests, store_durations=store), selection=gpu_tests,
             why="every test marked gpu outside tests/graphs (the FlashInfer kernels, the flows on CUDA)"),
        # half of its tests are the tape's on the CPU: they do not count as GPU tests
        Step(name="graphs", timeout_s=timeout["graphs"], junit=s.out / "graphs.xml", env=env,
             argv=_pytest(s, "graphs", ["tests/graphs"], store_durations=store), selection=("tests/graphs",),
             why="the graph-semantics tests on both engines: the tape and real CUDA graphs"),
        Step(name="scenarios-cuda", timeout_s=timeout["scenarios-cuda"], junit=s.out / "scenarios-cuda.xml",
             gpu_tests=True, env=env, selection=scenarios,
             argv=_pytest(s, "scenarios-cuda", scenarios, "--harness-engine=cuda",
                          f"--harness-report={s.out / 'scenarios-cuda'}", store_durations=store),
             why="every scenario on CUDA tensors under real CUDA graphs, each listed backend"
                 + (" and flashinfer" if s.flashinfer else "")),
        Step(name="scenarios-tape", timeout_s=timeout["scenarios-tape"], junit=s.out / "scenarios-tape.xml",
             gpu_tests=True, env=env, selection=scenarios,
             argv=_pytest(s, "scenarios-tape", scenarios, "--harness-engine=tape",
                          f"--harness-report={s.out / 'scenarios-tape'}", store_durations=False),
             why="the same runs on CUDA tensors under the tape emulator"),
        Step(name="agree", timeout_s=timeout["agree"],
             argv=(s.python, "-m", "harness.gpuci.agree", str(s.out / "scenarios-cuda" / "results.json"),
                   str(s.out / "scenarios-tape" / "results.json")),
             why="the tape and cuda engines give every run the same verdict"),
    ]
    return steps

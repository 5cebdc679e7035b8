"""``python -m harness.gpuci`` (``make test-gpu``): the GPU suite as timed steps, with a summary and a results table.

The environment first (devices, driver, torch, FlashInfer); then each step of ``plan.ci_plan`` in its own
process group under its own limit and what is left of the whole run's, so a hung kernel ends its step, not
the job. Every step runs even after one fails (a CI log should show the whole picture); the exit status is 1
when any failed, when a GPU was promised (``--require-gpu`` or ``HARNESS_REQUIRE_GPU=1``) but none is
visible, or when a GPU is visible and no GPU test passed or failed (a selection that skipped everything
proves nothing). Without a GPU and without the promise, it prints why and exits 0: the GPU steps skip.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .machine import REQUIRE_GPU_ENV, Machine, gpu_required, probe
from .options import output_folder_problem, seconds, step_seconds
from .plan import STEP_NAMES, Settings, Step, ci_plan

_NO_TESTS_COLLECTED = 5
"""pytest's exit status when the selection is empty"""
_GRACE_S = 20.0
"""after SIGTERM, before SIGKILL: pytest writes its JUnit file and the harness its report on SIGTERM"""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepResult:
    name: str
    status: str
    """passed, failed, timed out, skipped"""
    seconds: float
    counts: tuple[int, int, int] | None = None
    """passed, failed (errors included), skipped tests from the step's JUnit file"""
    note: str = ""


def junit_counts(path: Path) -> tuple[int, int, int] | None:
    """(passed, failed or errored, skipped) in a JUnit file; None when it is missing or unreadable."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else root.iter("testsuite")
    tests = failed = skipped = 0
    for suite in suites:
        tests += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
    return tests - failed - skipped, failed, skipped


def _run(step: Step, limit_s: float, log) -> tuple[str, str]:
    """Run one step's command in its own process group; (status, note)."""
    env = {**os.environ, **step.env}
    proc = subprocess.Popen(step.argv, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    try:
        code = proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return "timed out", f"stopped after {limit_s:.0f} s"
    if code == _NO_TESTS_COLLECTED and step.junit is not None:
        return "passed", "no test selected"  # a shard whose slice holds none of this step's items
    return ("passed", "") if code == 0 else ("failed", f"exit status {code}")


class _Tee:
    """The log file and the terminal, for the runner's own lines; steps write into both through a pipe."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("a", buffering=1)

    def line(self, text: str = "") -> None:
        print(text, flush=True)
        self.file.write(text + "\n")


def _run_logged(step: Step, limit_s: float, tee: _Tee) -> tuple[str, str]:
    # both the terminal (the CI log) and the file: a reader of either sees the step's own output
    reader, writer = os.pipe()
    with os.fdopen(writer, "wb", buffering=0) as w:
        pump = subprocess.Popen(["tee", "-a", tee.file.name], stdin=reader)
        os.close(reader)
        tee.file.flush()
        status = _run(step, limit_s, w)
    pump.wait()
    return status


def summary_lines(results: Sequence[StepResult]) -> list[str]:
    """The results table (Markdown): one row per step."""
    out = ["| step | status | seconds | tests passed / failed / skipped | note |", "|---|---|---|---|---|"]
    for r in results:
        counts = " / ".join(map(str, r.counts)) if r.counts else ""
        out.append(f"| {r.name} | {r.status} | {r.seconds:.1f} | {counts} | {r.note} |")
    return out


def execute(steps: Sequence[Step], machine: Machine, *, out: Path, total_timeout_s: float, require_gpu: bool) -> int:
    """Run the steps, print and write the summary; the exit status."""
    out.mkdir(parents=True, exist_ok=True)
    tee = _Tee(out / "gpu-ci.log")
    tee.line("== environment")
    for line in machine.lines():
        tee.line(f"  {line}")
    results = [StepResult(name="environment", status="passed", seconds=0.0)]
    code = 0
    if not machine.gpus:
        if require_gpu:
            tee.line(f"FAILED: a GPU was promised ({REQUIRE_GPU_ENV}=1 or --require-gpu) but no CUDA device is visible")
            results[0] = StepResult(name="environment", status="failed", seconds=0.0, note="no CUDA device visible")
            code = 1
        else:
            tee.line(f"no CUDA device visible: every GPU step skipped ({REQUIRE_GPU_ENV}=1 makes this an error)")
        results += [StepResult(name=s.name, status="skipped", seconds=0.0, note="no GPU") for s in steps[1:]]
        _finish(tee, out, results)
        return code
    deadline = time.monotonic() + total_timeout_s
    for step in steps[1:]:
        left = deadline - time.monotonic()
        if left <= 0:
            results.append(StepResult(name=step.name, status="skipped", seconds=0.0,
                                      note=f"the run's {total_timeout_s:.0f} s were spent"))
            code = 1
            continue
        tee.line(f"== {step.name}: {' '.join(step.argv)}")
        started = time.monotonic()
        status, note = _run_logged(step, min(step.timeout_s, left), tee)
        seconds = time.monotonic() - started
        counts = junit_counts(step.junit) if step.junit else None
        results.append(StepResult(name=step.name, status=status, seconds=seconds, counts=counts, note=note))
        tee.line(f"== {step.name}: {status} in {seconds:.1f} s")
        code = code or int(status != "passed")
    ran = sum(r.counts[0] + r.counts[1] for r, s in zip(results[1:], steps[1:]) if r.counts and s.gpu_tests)
    if ran == 0:
        tee.line("FAILED: a GPU is visible but no GPU test passed or failed (all skipped or none selected)")
        code = 1
    _finish(tee, out, results)
    return code


def _finish(tee: _Tee, out: Path, results: Sequence[StepResult]) -> None:
    table = summary_lines(results)
    (out / "summary.md").write_text("\n".join(table) + "\n")
    tee.line("== summary")
    for line in table:
        tee.line(line)
    tee.line(f"log: {tee.file.name}; table: {out / 'summary.md'}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.gpuci", description=__doc__.splitlines()[0].split(": ", 1)[1])
    p.add_argument("--out", type=Path, default=Path("reports/gpu"), help="log, JUnit files, reports, summary.md")
    p.add_argument("--dry-run", action="store_true", help="print the steps and their commands, run nothing")
    p.add_argument("--require-gpu", action="store_true", help=f"fail without a GPU (also {REQUIRE_GPU_ENV}=1)")
    p.add_argument("--splits", type=int,
                   help="shards of a CI matrix (pytest-split); with --group, or alone with --dry-run: every shard's plan")
    p.add_argument("--group", type=int, help="this machine's shard, 1 to --splits")
    p.add_argument("--store-durations", action="store_true",
                   help="record the tests' durations into tests/gpu_durations.json (make gpu-durations)")
    p.add_argument("--workers-per-gpu", type=int, default=1, help="pytest-xdist workers pinned to each GPU")
    p.add_argument("--no-flashinfer", action="store_true", help="leave the FlashInfer backend out (no JIT build)")
    p.add_argument("-k", dest="keyword", help="pytest -k for the scenario steps (e.g. torch_native)")
    p.add_argument("--test-timeout", type=seconds, default=600.0, help="seconds per test (pytest-timeout)")
    p.add_argument("--total-timeout", type=seconds, default=5400.0, help="seconds for the whole run")
    p.add_argument("--step-timeout", type=step_seconds(STEP_NAMES), action="append", default=[],
                   metavar="STEP=SECONDS", help=f"one step's limit (repeatable; steps: {', '.join(STEP_NAMES)})")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.dry_run and (problem := output_folder_problem(args.out)) is not None:
        parser.error(problem)  # before any step: the log and JUnit files of an hour's run go there
    has_timeout = importlib.util.find_spec("pytest_timeout") is not None
    if args.splits is not None and importlib.util.find_spec("pytest_split") is None and not args.dry_run:
        print("--splits needs pytest-split, the optional extra ci (make test-gpu installs it)", file=sys.stderr)
        return 2
    machine = probe()
    # a dry run with --splits alone plans every shard; the commands it prints are the first shard's
    every_shard = args.dry_run and args.splits is not None and args.group is None
    settings = Settings(out=args.out, gpus=machine.gpus, workers_per_gpu=args.workers_per_gpu,
                        flashinfer=not args.no_flashinfer, keyword=args.keyword, splits=args.splits,
                        group=1 if every_shard else args.group,
                        store_durations=args.store_durations, test_timeout_s=args.test_timeout if has_timeout else None,
                        step_timeouts=dict(args.step_timeout))
    if problems := settings.problems():
        for line in problems:
            print(line, file=sys.stderr)
        return 2
    steps = ci_plan(settings)
    if args.dry_run:
        for line in machine.lines():
            print(f"  {line}")
        print_plan(steps, settings, total_timeout_s=args.total_timeout)
        if every_shard:
            return print_shards(steps, settings)
        return 0
    return execute(steps, machine, out=args.out, total_timeout_s=args.total_timeout,
                   require_gpu=gpu_required(args.require_gpu))


def print_plan(steps: Sequence[Step], s: Settings, *, total_timeout_s: float) -> None:
    """The dry run: each step, why, its limit and its command."""
    gpus = ", ".join(s.gpus) or "none visible (the steps would skip)"
    shard = f"shard {s.group} of {s.splits}" if s.splits else "the whole suite"
    print(f"plan: {len(steps)} steps, {shard}, GPUs {gpus}, {s.workers_per_gpu} worker(s) per GPU, "
          f"{total_timeout_s:.0f} s for the run, "
          + (f"{s.test_timeout_s:g} s per test" if s.test_timeout_s else "no per-test limit (pytest-timeout missing)"))
    for i, step in enumerate(steps, 1):
        print(f"{i}. {step.name} (limit {step.timeout_s:.0f} s): {step.why}")
        if step.argv:
            env = " ".join(f"{k}={v}" for k, v in step.env.items())
            print(f"   {env + ' ' if env else ''}{' '.join(step.argv)}")


def print_shards(steps: Sequence[Step], s: Settings) -> int:
    """Each pytest step's items split into the shards, as every shard's pytest-split will split them."""
    if importlib.util.find_spec("pytest_split") is None:
        print("the shards' plan needs pytest-split, the optional extra ci (make test-gpu installs it)", file=sys.stderr)
        return 2
    from . import shards
    from .plan import DURATIONS, SPLITTING_ALGORITHM

    durations = shards.read_durations(DURATIONS)
    print(f"shards: {s.splits}, {SPLITTING_ALGORITHM} over {len(durations)} recorded durations ({DURATIONS})")
    seen: dict[tuple[str, ...], list[str]] = {}
    for step in steps:
        if not step.selection:
            continue
        if step.selection in seen:  # the tape step collects the cuda step's items
            print(f"   {step.name}: the shards of {seen[step.selection][0]}")
            continue
        plan = shards.split(shards.collect(s.python, step.selection), durations, splits=s.splits,
                            algorithm=SPLITTING_ALGORITHM)
        seen[step.selection] = [step.name]
        for line in shards.lines(step.name, plan):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

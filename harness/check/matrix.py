"""The matrix executor: the cases of a selection run, each isolated in a child process under its time limit,
each judged against its scenario's reference run, computed once per process and inherited by the forks."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from ..backends.registry import reference_backend
from ..runspec import Outcome, RunSpec
from ..scenario.spec import ScenarioSpec
from .case import Case, CaseResult
from .drive import execute
from .result import RunError, RunResult
from .judgement import judge_one
from .verdict import Verdict
from .workers import WorkerDied, run_grouped, run_one_isolated


def limit_threads() -> None:
    """One intra-op thread per process: the tensors are tiny, and pytest-xdist or --jobs already use every
    core; oversubscribed torch threads made runs fifty times slower on a loaded 2-core machine."""
    torch.set_num_threads(1)


_REFERENCES: OrderedDict[RunSpec, RunResult] = OrderedDict()
_REFERENCES_KEPT = 32


def scenario_reference(scenario: ScenarioSpec, *, backend: str, device: str = "cpu",
                       isolate: bool = False, timeout_s: float | None = None) -> RunResult:
    """The reference run of a scenario, whichever designs and modes it lists, cached per process.

    With ``isolate`` it runs in a child process (a third-party backend may crash or hang too) and comes back
    to the cache here, so that case runs forked afterwards inherit it.
    """
    spec = scenario.run_spec(design=scenario.designs[0], mode=scenario.modes[0], backend=reference_backend(backend),
                             device=device, with_faults=False).reference()
    if spec not in _REFERENCES:
        if isolate and _forkable(spec.device):
            outcome = run_one_isolated(execute, spec, timeout_s=timeout_s or scenario.timeout_s)
            _REFERENCES[spec] = _died_run(spec, outcome) if isinstance(outcome, WorkerDied) else outcome
        else:
            _REFERENCES[spec] = execute(spec)
        while len(_REFERENCES) > _REFERENCES_KEPT:
            _REFERENCES.popitem(last=False)
    return _REFERENCES[spec]


def run_case(case: Case) -> CaseResult:
    """Run the subject, judge it against the (cached) reference run. Never raises for a run's failure."""
    start = time.perf_counter()
    reference = scenario_reference(case.scenario, backend=case.backend, device=case.device)
    judged = judge_one(case.run_spec(), case.judgement, reference=reference)
    return CaseResult(case=case, verdict=judged.verdict, duration_s=time.perf_counter() - start)


def run_cases(cases: Sequence[Case], *, jobs: int, done: Callable[[int, CaseResult], None] | None = None,
              output: Callable[[int, str], None] | None = None) -> list[CaseResult]:
    """Every case in a child process (``jobs`` children at a time), each under its time limit.

    A scenario's built-in cases (``Case.builtin``) share one child, one after the other: a fork and the
    memory its child touches cost about as much as a small run, and the harness's own code leaves the
    process as it found it. A case naming anything by import path gets a child of its own, as third-party
    code may exit, hang or leave state behind. References are computed (isolated too) in this process just
    before the first child that needs one forks, so each is computed once. Cases on CUDA run here, in
    order: a CUDA context cannot be forked. ``output(index, text)``: what a forked case's run printed,
    captured (``workers.run_grouped``).
    """
    forked = [c for c in cases if _forkable(c.device)]
    position = {id(c): i for i, c in enumerate(cases)}
    results: dict[int, CaseResult] = {}

    def finished(index: int, outcome: CaseResult | WorkerDied) -> None:
        case = forked[index]
        result = _died_case(case, outcome) if isinstance(outcome, WorkerDied) else outcome
        results[id(case)] = result
        if done is not None:
            done(position[id(case)], result)

    def reference_first(case: Case) -> None:
        scenario_reference(case.scenario, backend=case.backend, device=case.device, isolate=True,
                           timeout_s=case.timeout_s)

    run_grouped(run_case, forked, _groups(forked), jobs=jobs, timeout_s=lambda c: c.timeout_s, done=finished,
                before_start=reference_first,
                output=None if output is None else lambda i, text: output(position[id(forked[i])], text))
    for index, case in enumerate(cases):
        if id(case) not in results:
            results[id(case)] = run_case(case)
            if done is not None:
                done(index, results[id(case)])
    return [results[id(c)] for c in cases]


def _groups(cases: Sequence[Case]) -> list[list[int]]:
    """Indices of ``cases`` by child: each scenario's built-in cases together (in order), every other alone."""
    together: dict[int, list[int]] = {}
    groups: list[list[int]] = []
    for index, case in enumerate(cases):
        if not case.builtin:
            groups.append([index])
        elif (group := together.get(id(case.scenario))) is not None:
            group.append(index)
        else:
            together[id(case.scenario)] = group = [index]
            groups.append(group)
    return groups


def _forkable(device: str) -> bool:
    return device == "cpu"


def _died_error(died: WorkerDied) -> RunError:
    return RunError(type="Timeout" if died.timed_out else "WorkerDied", message=died.reason, step=None)


def _died_run(spec: RunSpec, died: WorkerDied) -> RunResult:
    return RunResult(spec=spec, snapshots=(), error=_died_error(died))


def _died_case(case: Case, died: WorkerDied) -> CaseResult:
    return CaseResult(case=case, verdict=Verdict(outcome=Outcome.ERROR, diff=None, error=_died_error(died)))

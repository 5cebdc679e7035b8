"""The matrix executor: the cases of a selection run, each isolated in a child process under its time limit,
each judged against its scenario's reference run, computed once per process and inherited by the forks."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from ...runspec import Outcome, RunSpec
from ...scenario.spec import ScenarioSpec
from .case import Case, CaseResult, plugged_in, reference_backend_of
from ..run.drive import execute
from ..run.frames import dumped_frames
from ..run.oracle import certify_run
from ..run.result import RunError, RunResult
from .judgement import judge_one
from .verdict import Verdict
from ..run.workers import WorkerDied, run_grouped, run_one_isolated


def limit_threads() -> None:
    """One intra-op thread per process: the tensors are tiny, and pytest-xdist or --jobs already use every
    core; oversubscribed torch threads made runs fifty times slower on a loaded 2-core machine."""
    torch.set_num_threads(1)


_REFERENCES: OrderedDict[RunSpec, RunResult] = OrderedDict()
_REFERENCES_KEPT = 32
_CERTIFIED: set[RunSpec] = set()
"""references of runs with plug-ins checked against the dense oracle in this process (one walk each)"""
NOT_CERTIFIED = "ReferenceNotCertified"
"""the error type of a reference run the dense oracle disagrees with"""


def scenario_reference(scenario: ScenarioSpec, *, backend: str, device: str = "cpu",
                       isolate: bool = False, timeout_s: float | None = None) -> RunResult:
    """The reference run of a scenario, whichever designs and modes it lists, cached per process.

    With ``isolate`` it runs in a child process (a third-party backend may crash or hang too) and comes back
    to the cache here, so that case runs forked afterwards inherit it.
    """
    spec = scenario.run_spec(design=scenario.designs[0], mode=scenario.modes[0],
                             backend=reference_backend_of(scenario, backend, device),
                             device=device, with_faults=False).reference()
    if spec not in _REFERENCES:
        if isolate and _forkable(spec.device):
            outcome = run_one_isolated(execute, spec, timeout_s=timeout_s or scenario.timeout_s)
            if isinstance(outcome, WorkerDied) and outcome.timed_out:
                # a reference that ran out of time says so to the case that asked, under that case's limit;
                # cached, it would fail the scenario's every later case, some with a longer limit or on a
                # machine less loaded by the time they start
                return _died_run(spec, outcome)
            _REFERENCES[spec] = _died_run(spec, outcome) if isinstance(outcome, WorkerDied) else outcome
        else:
            _REFERENCES[spec] = execute(spec)
        while len(_REFERENCES) > _REFERENCES_KEPT:
            _CERTIFIED.discard(_REFERENCES.popitem(last=False)[0])
    if (plugged := plugged_in(scenario, backend)) and spec not in _CERTIFIED:
        # a plug-in's runs are judged by a reference the library's oracle items never walked (one that runs the
        # plug-in's stack or policy, or its declared backend): a wrong reference is named as such, not diffed
        _CERTIFIED.add(spec)
        _REFERENCES[spec] = _certified(_REFERENCES[spec], plugged)
    return _REFERENCES[spec]


def _certified(reference: RunResult, plugged: list[str]) -> RunResult:
    """``reference``, or an error saying where the dense oracle disagrees with it."""
    if reference.error is not None or reference.breach is not None:
        return reference
    cert = certify_run(reference.snapshots, reference.spec)
    if cert.ok:
        return reference
    s = reference.spec
    more = f", and elsewhere ({len(cert.problems) - 1} more at least)" if len(cert.problems) > 1 else ""
    message = (f"the dense oracle disagrees with it (eager {s.design} on {s.backend}, serving stack {s.serving}, "
               f"eviction policy {s.eviction.policy}, judging the runs of {', '.join(plugged)}): "
               f"{cert.problems[0] if cert.problems else 'no detail'}{more}")
    return RunResult(spec=s, snapshots=reference.snapshots, steps=reference.steps,
                     error=RunError(type=NOT_CERTIFIED, message=message, step=None))


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
    code may exit, hang or leave state behind. Its reference is computed (isolated too) in this process just
    before the first child that needs one forks, so each is computed once; with more than one job a built-in
    group's child computes its scenario's references itself, so that no other child waits on them. Cases on CUDA run here, in
    order: a CUDA context cannot be forked. ``output(index, text)``: what a forked case's run printed,
    captured (``workers.run_grouped``).
    """
    position = {id(c): i for i, c in enumerate(cases)}
    results: dict[int, CaseResult] = {}
    for index, case in enumerate(cases):  # a plug-in that does not load: nothing to run, its error is known
        if case.declaration_error is not None:
            results[id(case)] = declaration_failed(case)
            if done is not None:
                done(index, results[id(case)])
    forked = [c for c in cases if _forkable(c.device) and id(c) not in results]

    def finished(index: int, outcome: CaseResult | WorkerDied) -> None:
        case = forked[index]
        result = _died_case(case, outcome) if isinstance(outcome, WorkerDied) else outcome
        results[id(case)] = result
        if done is not None:
            done(position[id(case)], result)

    def reference_first(case: Case) -> None:
        if jobs > 1 and case.builtin:
            # its group's own child computes it: in this process it would hold up the next fork while a child
            # slot stands idle, and come back pickled; the harness's own code needs no child of its own for it
            return
        scenario_reference(case.scenario, backend=case.backend, device=case.device, isolate=True,
                           timeout_s=case.timeout_s)

    groups = _groups(forked)
    if jobs > 1:
        # the largest groups first, so that the last child to finish is a short one and no slot idles long at
        # the end (results still come back in argument order)
        groups.sort(key=len, reverse=True)
    run_grouped(run_case, forked, groups, jobs=jobs, timeout_s=lambda c: c.timeout_s, done=finished,
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
    # a timeout names where its main thread was when it was stopped, shown as an error's frames are
    return RunError(type="Timeout" if died.timed_out else "WorkerDied", message=died.reason, step=None,
                    frames=dumped_frames(died.stack))


def _died_run(spec: RunSpec, died: WorkerDied) -> RunResult:
    return RunResult(spec=spec, snapshots=(), error=_died_error(died))


def declaration_failed(case: Case) -> CaseResult:
    """The error verdict of a case whose plug-in does not load or keep its contract (``Case.declaration_error``)."""
    error = RunError(type="DeclarationError", message=case.declaration_error or "", step=None)
    return CaseResult(case=case, verdict=Verdict(outcome=Outcome.ERROR, diff=None, error=error), duration_s=0.0)


def _died_case(case: Case, died: WorkerDied) -> CaseResult:
    return CaseResult(case=case, verdict=Verdict(outcome=Outcome.ERROR, diff=None, error=_died_error(died)))

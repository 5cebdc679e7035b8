"""One run: build model, pool, backend and runner from a ``RunSpec``, drive the scheduler, snapshot every step;
and one case: its subject run judged against its scenario's (cached) reference run."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..backends.base import AttentionBackend
from ..backends.registry import backend_class
from ..graphs.registry import get_engine
from ..runners.base import Runner, RunnerContext
from ..runners.decode_graph import DecodeGraphRunner
from ..runners.eager import EagerRunner
from ..runners.observations import ForwardPath, ForwardRecord
from ..runners.piecewise import PiecewisePrefillRunner
from ..runspec import Mode, Outcome, RunSpec
from ..scenario.spec import ScenarioSpec
from ..serving.allocator import SWATokenToKVPoolAllocator
from ..serving.designs import resolve_design
from ..serving.model import SyntheticModel
from ..serving.pool import HybridSWAKVPool, ReqToTokenPool
from ..serving.scheduler import ScheduledStep, Scheduler, StepEnd
from ..serving.speculative import SpeculativeWorker
from ..serving.timeline import LiveToken, TokenKey
from .case import Case, CaseResult
from .result import RunError, RunResult, StepRecord
from .snapshot import KVSnapshot, take_snapshot
from .verdict import Verdict, judge
from .workers import WorkerDied, run_isolated, run_one_isolated


@dataclass(slots=True)
class Session:
    """Everything one run builds; tests use it to drive steps by hand."""

    spec: RunSpec
    model: SyntheticModel
    pool: HybridSWAKVPool
    req_to_token_pool: ReqToTokenPool
    allocator: SWATokenToKVPoolAllocator
    scheduler: Scheduler
    backend: AttentionBackend
    runner: Runner
    worker: SpeculativeWorker

    def run_batch(self, batch) -> list[torch.Tensor]:
        """Hidden states of every forward the batch takes (one per draft step for a draft batch)."""
        return self.worker.run(self.runner.forward, batch)


def build_session(spec: RunSpec) -> Session:
    mode = Mode(spec.mode)
    device = torch.device(spec.device)
    model = SyntheticModel(spec.model, device)
    pool = HybridSWAKVPool(
        spec=spec.pool,
        layer_is_swa=spec.model.layer_is_swa,
        num_kv_heads=spec.model.num_kv_heads,
        head_dim=spec.model.head_dim,
        kv_scales=model.kv_scales(),
        device=device,
    )
    req_to_token_pool = ReqToTokenPool(
        max_running_requests=spec.pool.max_running_requests,
        max_context_len=spec.pool.max_context_len,
        device=device,
    )
    allocator = SWATokenToKVPoolAllocator(pool, poison_freed=True)
    scheduler = Scheduler(
        spec.timeline,
        pool=pool,
        allocator=allocator,
        req_to_token_pool=req_to_token_pool,
        window=spec.model.window,
        vocab_size=spec.model.vocab_size,
    )
    backend = backend_class(spec.backend)(
        model_spec=spec.model,
        pool=pool,
        req_to_token=req_to_token_pool.req_to_token,
        design=resolve_design(spec.design),
        kv_write=spec.kv_write,
        faults=spec.faults,
    )
    ctx = RunnerContext(model=model, backend=backend, pool=pool, req_to_token_pool=req_to_token_pool)
    runner = make_runner(spec, ctx, mode)
    pool.poison()
    return Session(spec, model, pool, req_to_token_pool, allocator, scheduler, backend, runner,
                   SpeculativeWorker(spec.faults))


def make_runner(spec: RunSpec, ctx: RunnerContext, mode: Mode) -> Runner:
    eager = EagerRunner(ctx)
    if mode is Mode.EAGER:
        return eager
    engine = get_engine(spec.engine)
    if mode is Mode.FULL:
        return DecodeGraphRunner(ctx, eager=eager, engine=engine, buckets=spec.graphs.decode_buckets,
                                 capture=spec.graphs.capture, faults=spec.faults)
    return PiecewisePrefillRunner(ctx, eager=eager, engine=engine, buckets=spec.graphs.prefill_buckets,
                                  faults=spec.faults)


def execute(spec: RunSpec) -> RunResult:
    """Run the timeline; an exception ends the run and is returned, never raised."""
    snapshots: list[KVSnapshot] = []
    steps: list[StepRecord] = []
    step_index: int | None = None
    session: Session | None = None
    running: tuple[ScheduledStep, int] | None = None
    try:
        session = build_session(spec)
        while (step := session.scheduler.next_step()) is not None:
            step_index = step.index
            running = (step, _forwards_so_far(session))
            hidden = session.run_batch(step.batch)
            live = session.scheduler.live_tokens()
            snapshots.append(take_snapshot(session.pool, step, live, hidden))
            end = session.scheduler.finish_step()
            steps.append(_step_record(step, live, _forwards(session, running[1], hidden), end))
            running = None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - any failure of the subject (sys.exit too) is a verdict
        if session is not None and running is not None:
            steps.extend(_failed_step_record(session, *running))
        return RunResult(
            spec=spec,
            snapshots=tuple(snapshots),
            error=RunError(type=type(exc).__name__, message=str(exc), step=step_index),
            observations=_observations(session),
            steps=tuple(steps),
        )
    return RunResult(spec=spec, snapshots=tuple(snapshots), observations=_observations(session), steps=tuple(steps))


def _forwards_so_far(session: Session) -> int:
    runner = session.runner
    return len(runner.log.forwards) if isinstance(runner, (DecodeGraphRunner, PiecewisePrefillRunner)) else 0


def _forwards(session: Session, mark: int, hidden: list[torch.Tensor] | None) -> tuple[ForwardRecord, ...]:
    """How the step's forwards ran: the graph runner's log from ``mark`` on; every forward of an eager run."""
    runner = session.runner
    if isinstance(runner, (DecodeGraphRunner, PiecewisePrefillRunner)):
        return tuple(runner.log.forwards[mark:])
    return tuple(ForwardRecord(path=ForwardPath.EAGER, rows=int(h.shape[0])) for h in hidden or ())


def _step_record(step: ScheduledStep, live: list[LiveToken], forwards: tuple[ForwardRecord, ...],
                 end: StepEnd | None) -> StepRecord:
    owners = [key for forward in step.forwards for key in forward]
    tokens = Counter(key.rid for key in owners)  # insertion order: batch order
    written = set(owners)
    return StepRecord(
        index=step.index, kind=step.kind, batch_size=step.batch.batch_size, tokens=tuple(tokens.items()),
        forwards=forwards, written=tuple(t for t in live if TokenKey(t.rid, t.pos) in written),
        evicted=end.evicted if end else (), finished=end.finished if end else (), aborted=step.aborted,
    )


def _failed_step_record(session: Session, step: ScheduledStep, mark: int) -> list[StepRecord]:
    """The step that raised: what was batched and the forwards that ran before the exception (none when the
    scheduler's state is too broken to say)."""
    try:
        return [_step_record(step, session.scheduler.live_tokens(), _forwards(session, mark, None), None)]
    except Exception:  # noqa: BLE001 - the timeline of a failed run is best effort; the error is the verdict
        return []


def _observations(session: Session | None):
    if session is None:
        return None
    runner = session.runner
    return runner.observations() if isinstance(runner, (DecodeGraphRunner, PiecewisePrefillRunner)) else None


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
    spec = scenario.run_spec(design=scenario.designs[0], mode=scenario.modes[0], backend=backend, device=device,
                             with_faults=False).reference()
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
    reference = scenario_reference(case.scenario, backend=case.backend, device=case.device)
    return CaseResult(case=case, verdict=judge(execute(case.run_spec()), reference))


def run_case_isolated(case: Case) -> CaseResult:
    """``run_case`` in a child process with the case's time limit: a crash or a hang is an ``error``."""
    return run_cases([case], jobs=1)[0]


def run_cases(cases: Sequence[Case], *, jobs: int, done: Callable[[int, CaseResult], None] | None = None,
              output: Callable[[int, str], None] | None = None) -> list[CaseResult]:
    """Every case, each in its own child process (``jobs`` at a time) under its time limit.

    References are computed (isolated too) in this process just before the first case that needs one
    forks, so each is computed once. Cases on CUDA run here, in order: a CUDA context cannot be forked.
    ``output(index, text)``: what a forked case's run printed, captured (``workers.run_isolated``).
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

    run_isolated(run_case, forked, jobs=jobs, timeout_s=lambda c: c.timeout_s, done=finished,
                 before_start=reference_first,
                 output=None if output is None else lambda i, text: output(position[id(forked[i])], text))
    for index, case in enumerate(cases):
        if id(case) not in results:
            results[id(case)] = run_case(case)
            if done is not None:
                done(index, results[id(case)])
    return [results[id(c)] for c in cases]


def _forkable(device: str) -> bool:
    return device == "cpu"


def _died_error(died: WorkerDied) -> RunError:
    return RunError(type="Timeout" if died.timed_out else "WorkerDied", message=died.reason, step=None)


def _died_run(spec: RunSpec, died: WorkerDied) -> RunResult:
    return RunResult(spec=spec, snapshots=(), error=_died_error(died))


def _died_case(case: Case, died: WorkerDied) -> CaseResult:
    return CaseResult(case=case, verdict=Verdict(outcome=Outcome.ERROR, diff=None, error=_died_error(died)))

"""One run: build model, pool, backend and runner from a ``RunSpec``, drive the scheduler, snapshot every step;
and one case: its subject run judged against its scenario's (cached) reference run."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

import torch

from ..backends.base import AttentionBackend
from ..backends.registry import backend_class
from ..graphs.registry import get_engine
from ..runners.base import Runner, RunnerContext
from ..runners.decode_graph import DecodeGraphRunner
from ..runners.eager import EagerRunner
from ..runners.observations import ForwardPath, ForwardRecord
from ..runners.piecewise import PiecewisePrefillRunner
from ..runspec import Mode, RunSpec
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
from .verdict import judge


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
    except Exception as exc:  # noqa: BLE001 - any failure of the subject is a verdict, not a crash
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


@lru_cache(maxsize=32)
def _reference(reference_spec) -> RunResult:
    # one reference run per (scenario, backend, device) in a process; xdist workers each keep their own
    return execute(reference_spec)


def scenario_reference(scenario: ScenarioSpec, *, backend: str, device: str = "cpu") -> RunResult:
    """The reference run of a scenario, whichever designs and modes it lists."""
    spec = scenario.run_spec(design=scenario.designs[0], mode=scenario.modes[0], backend=backend, device=device,
                             with_faults=False)
    return _reference(spec.reference())


def run_case(case: Case) -> CaseResult:
    """Run the subject, judge it against the (cached) reference run. Never raises for a run's failure."""
    reference = scenario_reference(case.scenario, backend=case.backend, device=case.device)
    return CaseResult(case=case, verdict=judge(execute(case.run_spec()), reference))

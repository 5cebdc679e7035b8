"""One run: build model, pool, backend and runner from a ``RunSpec``, drive the scheduler, snapshot every step;
and one case: its subject run judged against its scenario's (cached) reference run."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..backends.base import AttentionBackend
from ..backends.registry import backend_class
from ..graphs.registry import get_engine
from ..runners.base import Runner, RunnerContext
from ..runners.decode_graph import DecodeGraphRunner
from ..runners.eager import EagerRunner
from ..runners.piecewise import PiecewisePrefillRunner
from ..runspec import Mode, Outcome, RunSpec
from ..scenario.spec import ScenarioSpec
from ..serving.allocator import SWATokenToKVPoolAllocator
from ..serving.designs import resolve_design
from ..serving.model import SyntheticModel
from ..serving.pool import HybridSWAKVPool, ReqToTokenPool
from ..serving.scheduler import Scheduler
from ..serving.speculative import SpeculativeWorker
from .case import Case, CaseResult
from .result import RunError, RunResult
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
    step_index: int | None = None
    session: Session | None = None
    try:
        session = build_session(spec)
        while (step := session.scheduler.next_step()) is not None:
            step_index = step.index
            hidden = session.run_batch(step.batch)
            snapshots.append(take_snapshot(session.pool, step, session.scheduler.live_tokens(), hidden))
            session.scheduler.finish_step()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - any failure of the subject (sys.exit too) is a verdict
        return RunResult(
            spec=spec,
            snapshots=tuple(snapshots),
            error=RunError(type=type(exc).__name__, message=str(exc), step=step_index),
            observations=_observations(session),
        )
    return RunResult(spec=spec, snapshots=tuple(snapshots), observations=_observations(session))


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


def run_cases(cases: Sequence[Case], *, jobs: int, done: Callable[[int, CaseResult], None] | None = None
              ) -> list[CaseResult]:
    """Every case, each in its own child process (``jobs`` at a time) under its time limit.

    References are computed (isolated too) in this process just before the first case that needs one
    forks, so each is computed once. Cases on CUDA run here, in order: a CUDA context cannot be forked.
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
                 before_start=reference_first)
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

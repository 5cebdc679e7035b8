"""One run: build model, pool, backend and runner from a ``RunSpec``, drive the scheduler, snapshot every step;
and one case: its subject run judged against its scenario's (cached) reference run."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from ..backends.base import AttentionBackend
from ..backends.registry import backend_class
from ..graphs.registry import get_engine
from ..runners.base import Runner, RunnerContext
from ..runners.decode_graph import DecodeGraphRunner
from ..runners.eager import EagerRunner
from ..runners.piecewise import PiecewisePrefillRunner
from ..runspec import Mode, RunSpec
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
    step_index: int | None = None
    session: Session | None = None
    try:
        session = build_session(spec)
        while (step := session.scheduler.next_step()) is not None:
            step_index = step.index
            hidden = session.run_batch(step.batch)
            snapshots.append(take_snapshot(session.pool, step, session.scheduler.live_tokens(), hidden))
            session.scheduler.finish_step()
    except Exception as exc:  # noqa: BLE001 - any failure of the subject is a verdict, not a crash
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

"""One run: build model, pool, backend and runner from specs, drive the scheduler, snapshot every step."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from ..backends import BACKENDS, TorchNativeBackend
from ..graphs import get_engine
from ..runners import EagerRunner, Runner, run_batch
from ..runners.decode_graph import DecodeGraphRunner
from ..runners.piecewise import PiecewisePrefillRunner
from ..serving.allocator import SWATokenToKVPoolAllocator
from ..serving.designs import REFERENCE_DESIGN, resolve_design
from ..serving.model import ModelSpec, SyntheticModel
from ..serving.pool import HybridSWAKVPool, PoolSpec, ReqToTokenPool
from ..serving.scheduler import Scheduler
from ..serving.timeline import TimelineSpec
from .snapshot import KVSnapshot, take_snapshot

MODES = ("eager", "full", "piecewise")


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphSpec:
    decode_buckets: tuple[int, ...] = (1, 2, 4, 8, 16)
    """batch sizes the decode runner captures"""
    capture: str = "startup"
    """decode graphs: "startup" captures every bucket before the first batch, largest first;
    "on_demand" captures a bucket the first time a batch needs it, with the pool state of that moment"""
    prefill_buckets: tuple[int, ...] = (8, 16, 32, 64)
    """token counts the piecewise prefill runner captures"""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSpec:
    model: ModelSpec
    pool: PoolSpec
    timeline: TimelineSpec
    design: str = REFERENCE_DESIGN
    mode: str = "eager"
    backend: str = "torch_native"
    engine: str = "tape"
    faults: frozenset[str] = frozenset()
    kv_write: str = "plain"
    graphs: GraphSpec = GraphSpec()
    device: str = "cpu"

    def reference(self) -> "RunSpec":
        """The run every subject is compared against: eager, the forward_batch design, no faults."""
        return dataclasses.replace(self, design=REFERENCE_DESIGN, mode="eager", engine="tape", faults=frozenset())


@dataclass(frozen=True, slots=True, kw_only=True)
class RunError:
    type: str
    message: str
    step: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    spec: RunSpec
    snapshots: tuple[KVSnapshot, ...]
    error: RunError | None = None
    notes: tuple[str, ...] = field(default=())
    """what the runner observed on the way: graph audits, stale inputs, eager fallbacks"""


@dataclass(slots=True)
class Session:
    """Everything one run builds; tests use it to drive steps by hand."""

    spec: RunSpec
    model: SyntheticModel
    pool: HybridSWAKVPool
    req_to_token_pool: ReqToTokenPool
    allocator: SWATokenToKVPoolAllocator
    scheduler: Scheduler
    backend: TorchNativeBackend
    runner: Runner


def build_session(spec: RunSpec) -> Session:
    if spec.mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {spec.mode!r}")
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
        keep_stale_swa_on_reassign="stale_swa_after_reassign" in spec.faults,
    )
    backend = BACKENDS[spec.backend](
        model_spec=spec.model,
        pool=pool,
        req_to_token=req_to_token_pool.req_to_token,
        design=resolve_design(spec.design),
        kv_write=spec.kv_write,
        faults=spec.faults,
    )
    runner = make_runner(spec, model=model, backend=backend, pool=pool, req_to_token_pool=req_to_token_pool)
    pool.poison()
    return Session(spec, model, pool, req_to_token_pool, allocator, scheduler, backend, runner)


def make_runner(
    spec: RunSpec,
    *,
    model: SyntheticModel,
    backend: TorchNativeBackend,
    pool: HybridSWAKVPool,
    req_to_token_pool: ReqToTokenPool,
) -> Runner:
    if spec.mode == "eager":
        return EagerRunner(model=model, backend=backend, pool=pool)
    engine = get_engine(spec.engine)
    if spec.mode == "full":
        return DecodeGraphRunner(
            model=model, backend=backend, pool=pool, req_to_token_pool=req_to_token_pool, engine=engine,
            buckets=spec.graphs.decode_buckets, capture=spec.graphs.capture, faults=spec.faults,
        )
    return PiecewisePrefillRunner(
        model=model, backend=backend, pool=pool, req_to_token_pool=req_to_token_pool, engine=engine,
        buckets=spec.graphs.prefill_buckets, faults=spec.faults,
    )


def execute(spec: RunSpec) -> RunResult:
    """Run the timeline; an exception ends the run and is returned, never raised."""
    snapshots: list[KVSnapshot] = []
    step_index: int | None = None
    session: Session | None = None
    try:
        session = build_session(spec)
        while (step := session.scheduler.next_step()) is not None:
            step_index = step.index
            hidden = run_batch(session.runner, step.batch)
            snapshots.append(take_snapshot(session.pool, step, session.scheduler.live_tokens(), hidden))
            session.scheduler.finish_step()
    except Exception as exc:  # noqa: BLE001 - any failure of the subject is a verdict, not a crash
        return RunResult(
            spec=spec,
            snapshots=tuple(snapshots),
            error=RunError(type=type(exc).__name__, message=str(exc), step=step_index),
            notes=_notes(session),
        )
    return RunResult(spec=spec, snapshots=tuple(snapshots), notes=_notes(session))


def _notes(session: Session | None) -> tuple[str, ...]:
    if session is None:
        return ()
    report = getattr(session.runner, "observations", None)
    return tuple(report()) if callable(report) else ()

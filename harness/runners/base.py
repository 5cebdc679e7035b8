"""What every runner shares: the serving pieces it drives, the one method a run calls, and for the graph
runners their buckets, captured graphs, static-buffer fill and log."""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from ..backends.base import AttentionBackend
from ..graphs.engine import CapturedGraph, GraphEngine, StaleInput, module_roots
from ..serving.batch import ForwardBatch
from ..serving.faults import Component, faults_acting_on
from ..serving.model import SyntheticModel
from ..serving.pool import HybridSWAKVPool, ReqToTokenPool
from .observations import (
    AuditFinding,
    FindingKind,
    ForwardPath,
    ForwardRecord,
    GraphObservations,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunnerContext:
    """The model, attention backend and pools one run's runners drive."""

    model: SyntheticModel
    backend: AttentionBackend
    pool: HybridSWAKVPool
    req_to_token_pool: ReqToTokenPool


class Runner(Protocol):
    """What a run asks of a runner: forwards, and afterwards what they did."""

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Final hidden states [num_tokens, hidden] of one forward of ``batch``."""
        ...

    def forward_log(self) -> Sequence[ForwardRecord]:
        """How each completed forward ran, in order (a run's timeline reads them per step)."""
        ...

    def observations(self) -> GraphObservations | None:
        """Graph statistics and input-audit findings; None for a runner without graphs."""
        ...


class GraphLog:
    """Counts captures and replays, keeps the input audit's findings as data, and records how each forward
    ran (``forwards``, in order: a run's timeline reads them per step)."""

    def __init__(self) -> None:
        self._unregistered: list[AuditFinding] = []
        self._stale: Counter[tuple[str, str, FindingKind]] = Counter()
        self._first_seen: dict[tuple[str, str, FindingKind], tuple[StaleInput, str, tuple[int, ...]]] = {}
        self.captures = 0
        self.replays = 0
        self.padded_replays = 0
        self.eager_fallbacks = 0
        self.forwards: list[ForwardRecord] = []
        self._rerun_ops: dict[str, None] = {}  # insertion-ordered sets, over every graph captured
        self._notes: dict[str, None] = {}

    def ran_eagerly(self, rows: int, *, fallback: bool) -> None:
        self.eager_fallbacks += fallback
        self.forwards.append(ForwardRecord(path=ForwardPath.FALLBACK if fallback else ForwardPath.EAGER, rows=rows))

    def captured(self, graph: CapturedGraph) -> None:
        self.captures += 1
        self._rerun_ops.update(dict.fromkeys(graph.audit.rerun_ops))
        self._notes.update(dict.fromkeys(graph.audit.notes))
        for item in graph.audit.unregistered:
            self._unregistered.append(AuditFinding(kind=FindingKind.UNREGISTERED, graph=graph.label, path=item.path,
                                                   dtype=item.dtype, shape=item.shape))

    def replayed(self, graph: CapturedGraph, stale: tuple[StaleInput, ...], *, bucket: int, rows: int,
                 captured: bool = False) -> None:
        self.replays += 1
        self.padded_replays += bucket > rows
        self.forwards.append(ForwardRecord(path=ForwardPath.REPLAY, rows=rows, bucket=bucket, captured=captured,
                                           graph=graph.label))
        if not stale:
            return
        inputs = {i.path: i for i in graph.audit.inputs if i.path}
        for item in stale:
            if item.kind == "rebound" and item.benign:
                continue  # the captured buffer is still refreshed in place before every replay: no finding
            seen = inputs.get(item.path)
            kind = FindingKind.MOVED if item.kind == "memory" else FindingKind.STALE
            key = (graph.label, item.path, kind)
            self._stale[key] += 1
            if key not in self._first_seen:
                self._first_seen[key] = (item, seen.dtype if seen else "", seen.shape if seen else ())

    def observations(self) -> GraphObservations:
        findings = list(self._unregistered)
        for (label, path, kind), n in self._stale.items():
            first, dtype, shape = self._first_seen[(label, path, kind)]
            now = _no_addresses(first.changed or first.now) if kind is FindingKind.MOVED else first.now
            findings.append(AuditFinding(kind=kind, graph=label, path=path, dtype=dtype, shape=shape, replays=n,
                                         captured=_no_addresses(first.captured), now=now))
        return GraphObservations(captures=self.captures, replays=self.replays, padded_replays=self.padded_replays,
                                 eager_fallbacks=self.eager_fallbacks, findings=tuple(findings),
                                 rerun_ops=tuple(self._rerun_ops), notes=tuple(self._notes))


def _no_addresses(text: str) -> str:
    # a storage address differs from run to run; records of the same inputs must not
    return re.sub(r"0x[0-9a-f][0-9a-f.]*", "<address>", text)


def swa_out_cache_loc(batch: ForwardBatch, pool: HybridSWAKVPool) -> torch.Tensor:
    """The SWA slots the batch's new tokens write: precomputed at batch creation, or translated here when a
    speculative draft step reassigned ``out_cache_loc`` and dropped them, as SGLang's runners do."""
    if batch.out_cache_loc_swa is not None:
        return batch.out_cache_loc_swa
    return pool.translate_loc_from_full_to_swa(batch.out_cache_loc)


def fill_static(static: torch.Tensor, real: torch.Tensor, bucket: int, pad: int) -> None:
    """Copy a batch's ``real`` rows into the head of a static buffer and ``pad`` the rest of the bucket."""
    n = real.shape[0]
    if n < bucket:
        static[n:bucket].fill_(pad)
    static[:n].copy_(real)


class GraphRunner:
    """Bucketed graphs over one model, backend and pool; batches that fit no bucket run eagerly."""

    component: ClassVar[Component]

    def __init__(
        self,
        ctx: RunnerContext,
        *,
        eager: Runner,
        engine: GraphEngine,
        buckets: tuple[int, ...],
        faults: Collection[str] = (),
    ) -> None:
        self.model = ctx.model
        self.backend = ctx.backend
        self.pool = ctx.pool
        self.req_to_token_pool = ctx.req_to_token_pool
        self.engine = engine
        self.eager = eager
        self.buckets = tuple(sorted(set(buckets)))
        self.faults = frozenset(faults) & faults_acting_on(self.component)
        self.log = GraphLog()
        self.graphs: dict[int, CapturedGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def observations(self) -> GraphObservations:
        return self.log.observations()

    def forward_log(self) -> Sequence[ForwardRecord]:
        return self.log.forwards

    def bucket_for(self, size: int) -> int | None:
        """The smallest bucket that holds ``size`` rows or tokens; None when none does."""
        index = bisect.bisect_left(self.buckets, size)
        return self.buckets[index] if index < len(self.buckets) else None

    def _capture_whole(self, bucket: int, forward: Callable[[], torch.Tensor], *,
                       backends: Sequence[AttentionBackend] | None = None) -> None:
        """Capture ``forward`` as the full graph of ``bucket`` and keep it with the output of its captured run.
        Its static inputs are the runner's buffers, the model's weights, the pool, ``backends``' graph state (the
        runner's one backend by default; a multi-step draft's per-step ones) and ``req_to_token``; its audit
        roots the pool, the first backend, the runner, the model and the module-level state of the design, the
        backend and the runner (named module.attr)."""
        backends = (self.backend,) if backends is None else tuple(backends)
        produced: list[torch.Tensor] = []

        def run() -> torch.Tensor:
            out = forward()
            produced.append(out)
            return out

        graph = self.engine.capture(
            run,
            label=self.covers[0].key(bucket).name,
            roots={"pool": self.pool, "backend": backends[0], "runner": self, "model": self.model,
                   **module_roots(self.backend.impl.design, self.backend.impl, self.backend, self)},
            static_inputs=[
                *self.static_buffers(),
                *self.model.parameters(),
                *self.model.buffers(),
                *self.pool.buffers(),
                *(t for backend in backends for t in backend.graph_static_tensors()),
                self.req_to_token_pool.req_to_token,
            ],
        )
        self._keep(bucket, graph, produced[-1])

    def _keep(self, bucket: int, graph: CapturedGraph, output: torch.Tensor) -> None:
        self.graphs[bucket] = graph
        self.outputs[bucket] = output  # the tensor of the captured run; every replay writes into it
        self.log.captured(graph)

    def _replay(self, bucket: int, real: int, *, captured: bool = False) -> torch.Tensor:
        self.log.replayed(self.graphs[bucket], self.graphs[bucket].replay(), bucket=bucket, rows=real,
                          captured=captured)
        return self.outputs[bucket][:real].clone()

    def _run_eagerly(self, batch: ForwardBatch, rows: int, *, fallback: bool) -> torch.Tensor:
        """An eager forward: a batch kind this runner has no graphs for, or (``fallback``) no bucket fits."""
        self.log.ran_eagerly(rows, fallback=fallback)
        return self.eager.forward(batch)

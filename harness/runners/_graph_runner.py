"""What the decode and piecewise graph runners share: buckets, captured graphs, and their log."""

from __future__ import annotations

import bisect
from collections import Counter
from typing import Collection

import torch

from ..backends.torch_native import TorchNativeBackend
from ..graphs import CapturedGraph, GraphEngine, StaleInput
from ..serving.model import SyntheticModel
from ..serving.pool import HybridSWAKVPool, ReqToTokenPool
from .eager import EagerRunner


class GraphLog:
    def __init__(self) -> None:
        self._lines: list[str] = []
        self._stale: Counter[tuple[str, str, bool]] = Counter()
        self._first_seen: dict[tuple[str, str, bool], StaleInput] = {}
        self.captures = 0
        self.replays = 0
        self.padded_replays = 0
        self.eager_fallbacks = 0

    def captured(self, graph: CapturedGraph) -> None:
        self.captures += 1
        for item in graph.audit.unregistered:
            path = item.path or "<no attribute path>"
            self._lines.append(f"{graph.label}: unregistered graph input {path} {item.dtype}{list(item.shape)}")

    def replayed(self, graph: CapturedGraph, stale: tuple[StaleInput, ...], *, padded: bool) -> None:
        self.replays += 1
        self.padded_replays += padded
        registered = {i.path: i.registered for i in graph.audit.inputs if i.path}
        for item in stale:
            key = (graph.label, item.path, bool(registered.get(item.path)))
            self._stale[key] += 1
            self._first_seen.setdefault(key, item)

    def lines(self) -> list[str]:
        out = [f"{self.captures} graphs captured, {self.replays} replays ({self.padded_replays} padded), "
               f"{self.eager_fallbacks} eager fallbacks", *self._lines]
        # Unregistered first: those are the graph reading data that nothing refreshes.
        for (label, path, is_registered), n in sorted(self._stale.items(), key=lambda kv: kv[0][2]):
            first = self._first_seen[(label, path, is_registered)]
            if is_registered:
                out.append(f"{label}: {path} rebound at {n} replay(s); the graph reads the registered buffer "
                           f"captured from it, correct only while that buffer is refreshed in place")
            else:
                out.append(f"{label}: stale input {path} at {n} replay(s): the graph still reads the tensor "
                           f"captured from it ({first.captured}), nothing refreshes it; it now holds {first.now}")
        return out


class GraphRunner:
    """Bucketed graphs over one model, backend and pool; batches that fit no bucket run eagerly."""

    mode: str
    known_faults: frozenset[str] = frozenset()

    def __init__(
        self,
        *,
        model: SyntheticModel,
        backend: TorchNativeBackend,
        pool: HybridSWAKVPool,
        req_to_token_pool: ReqToTokenPool,
        engine: GraphEngine,
        buckets: tuple[int, ...],
        faults: Collection[str] = (),
    ) -> None:
        self.model = model
        self.backend = backend
        self.pool = pool
        self.req_to_token_pool = req_to_token_pool
        self.engine = engine
        self.eager = EagerRunner(model=model, backend=backend, pool=pool)
        self.buckets = tuple(sorted(set(buckets)))
        self.faults = frozenset(faults) & self.known_faults
        self.log = GraphLog()
        self.graphs: dict[int, CapturedGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def observations(self) -> list[str]:
        return self.log.lines()

    def bucket_for(self, size: int) -> int | None:
        """The smallest bucket that holds ``size`` rows or tokens; None when none does."""
        index = bisect.bisect_left(self.buckets, size)
        return self.buckets[index] if index < len(self.buckets) else None

    def _keep(self, bucket: int, graph: CapturedGraph, output: torch.Tensor) -> None:
        self.graphs[bucket] = graph
        self.outputs[bucket] = output  # the tensor of the captured run; every replay writes into it
        self.log.captured(graph)

    def _replay(self, bucket: int, real: int) -> torch.Tensor:
        self.log.replayed(self.graphs[bucket], self.graphs[bucket].replay(), padded=bucket > real)
        return self.outputs[bucket][:real].clone()

"""The scheduler's request bookkeeping: each request's state (``Req``), and the queues a timeline's requests
move through (pending until they arrive, waiting until admitted, running until they finish or abort), with the
step clock. A request that leaves gives back what it owns through the run's serving stack, never a pool."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .eviction import RequestWindow
from .prefix_cache import Match, SWARadixCache
from .stack import ServingStack
from .timeline import RequestSpec, TimelineSpec, request_tokens


@dataclass(slots=True)
class Req:
    spec: RequestSpec
    tokens: torch.Tensor
    row: int = -1
    seq_len: int = 0
    swa_evicted: int = 0
    """the request's own SWA slots below this are freed (the cache's below ``cached_len`` are not its own)"""
    due: int = 0
    """where the eviction policy (without faults) has put the frontier: positions below it hold no SWA slot"""
    decoded: int = 0
    slots: list[int] = field(default_factory=list)
    cached_len: int = 0
    """positions below this are the prefix cache's (a matched prefix, or the request's own inserted between
    chunks): shared, never freed by the request"""
    lease: Match | None = None
    """the request's locked prefix in the cache: its match while it waits or runs, then what it inserted"""
    released: bool = False
    """its slots are already back in the pools while it still runs (only under ``release_before_last_batch``)"""

    @property
    def total_len(self) -> int:
        return self.spec.prompt_len + self.spec.output_len

    @property
    def prefilling(self) -> bool:
        return self.seq_len < self.spec.prompt_len

    @property
    def last_loc(self) -> int:
        return self.slots[-1] if self.slots else 0

    def window(self, *, bigram: bool = False) -> RequestWindow:
        return RequestWindow(seq_len=self.seq_len, swa_evicted=self.swa_evicted, prefilling=self.prefilling,
                             decoded=self.decoded, key_len=max(0, self.seq_len - 1) if bigram else None)


class RequestBook:
    """Every request of a timeline, by where it is, and the step clock."""

    def __init__(self, timeline: TimelineSpec, *, stack: ServingStack, cache: SWARadixCache | None,
                 vocab_size: int) -> None:
        self.stack = stack
        self.cache = cache
        self.device = stack.device
        self.vocab_size = vocab_size
        tokens = request_tokens(timeline, vocab_size)
        self.pending = [Req(spec=r, tokens=tokens[r.rid]) for r in sorted(timeline.requests, key=lambda r: r.arrive)]
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        """changed in place only: the scheduler reads it by reference"""
        self.step = 0
        self.aborted: list[str] = []
        """requests aborted since the last batch was built"""

    def take_arrivals(self) -> None:
        """Requests whose arrival step has come start waiting."""
        while self.pending and self.pending[0].spec.arrive <= self.step:
            self.waiting.append(self.pending.pop(0))

    def admit(self, req: Req) -> None:
        """A waiting request starts running, with a row of its own."""
        self.waiting.remove(req)
        req.row = self.stack.alloc_req_row()
        self.running.append(req)

    def slots(self, slots: list[int]) -> torch.Tensor:
        return torch.tensor(slots, dtype=torch.int64, device=self.device)

    def apply_aborts(self) -> None:
        for req in list(self.running):
            if req.spec.abort is not None and req.spec.abort <= self.step:
                self.free(req)
                self.aborted.append(req.spec.rid)
        for req in self.waiting:
            if req.spec.abort is not None and req.spec.abort <= self.step:
                self.release(req)
        self.waiting = [r for r in self.waiting if r.spec.abort is None or r.spec.abort > self.step]

    def free(self, req: Req) -> None:
        """A request leaves without being cached: free what it owns (all of it, without a prefix cache)."""
        if not req.released:
            self.stack.free(self.slots(req.slots[req.cached_len :]))
        self.drop(req)

    def drop(self, req: Req) -> None:
        """The request leaves, its slots already freed or cached: its lease and row go."""
        self.release(req)
        self.stack.free_req_row(req.row)
        self.running.remove(req)

    def release(self, req: Req) -> None:
        """Unlock the request's prefix in the cache."""
        if self.cache is not None and req.lease is not None:
            self.cache.release(req.lease)
            req.lease = None

"""The serving-stack seam: everything a run needs from the SGLang memory layer under test.

A run builds one stack for its spec, and the scheduler, the snapshots and the runners go through it: the
scheduler allocates and frees slots and request rows and evicts through it, snapshots read the pools' K/V
buffers through it, designs and backends receive its ``pool``. The harness's own miniature of SGLang
(``serving/miniature.py``) is the first implementation; another (the installed SGLang) is one more module
and one line in ``serving/registry.py``.

Slot numbers are the stack's own: the full pool's slots and, through ``translate``, the SWA pool's. The
dummy page (page 0, slot 0 at page size 1) is where padded rows write; it is never handed out.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from .invariants import CacheHoldings, InvariantViolation, pool_violations
from .pool import HybridSWAKVPool, PoolSpec, ReqToTokenPool
from .timeline import LiveToken


@dataclass(frozen=True, slots=True, kw_only=True)
class StackSpec:
    """What building a stack needs: the pool's knobs and the model's KV geometry."""

    pool: PoolSpec
    layer_is_swa: tuple[bool, ...]
    """per layer: the layer attends over a sliding window (its K/V live in the SWA pool)"""
    num_kv_heads: int
    head_dim: int
    kv_scales: tuple[tuple[float, float], ...] | None = None
    """per layer (k_scale, v_scale) of an FP8 pool"""
    device: str = "cpu"
    poison_freed: bool = True
    """re-poison slots as they are freed, so a read of a freed slot shows as poison"""


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolBuffers:
    """The K/V buffers of both pools, one tensor per layer of each pool, [slots, Hkv, D] in storage dtype."""

    full_k: Sequence[torch.Tensor]
    full_v: Sequence[torch.Tensor]
    swa_k: Sequence[torch.Tensor]
    swa_v: Sequence[torch.Tensor]
    full_log: Sequence[torch.Tensor] | None = None
    """per full layer, [slots] int32: the step that last wrote each slot since it was poisoned, -1 for none
    (the pool's write log); None where the stack keeps no log (snapshots then infer writes from changes)"""
    swa_log: Sequence[torch.Tensor] | None = None


class ServingStack(ABC):
    """Pools, allocator and request rows of one run, behind the operations the harness uses."""

    name: ClassVar[str]

    pool: HybridSWAKVPool
    """what designs and backends receive as the KV pool"""
    req_to_token_pool: ReqToTokenPool
    _prefix_cache: CacheHoldings | None = None

    @classmethod
    @abstractmethod
    def build(cls, spec: StackSpec) -> ServingStack:
        """A fresh stack, nothing allocated."""

    @abstractmethod
    def poison(self) -> None:
        """Fill every slot but the dummy page with poison, so slots a run never writes show as unwritten.
        A run poisons once its graphs are captured, so nothing capture did survives into the timeline."""

    @property
    def device(self) -> torch.device:
        return self.pool.device

    @property
    def page_size(self) -> int:
        return self.pool.page_size

    # ---- request rows ----------------------------------------------------------------------------------
    @abstractmethod
    def alloc_req_row(self) -> int:
        """A free row of ``req_to_token`` for a new request."""

    @abstractmethod
    def free_req_row(self, row: int) -> None: ...

    @abstractmethod
    def write_req_to_token(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Record the full slots of positions ``start ..`` of the request in ``row``."""

    # ---- token slots -----------------------------------------------------------------------------------
    @abstractmethod
    def alloc_extend(self, *, prefix_lens: Sequence[int], extend_lens: Sequence[int],
                     last_locs: Sequence[int]) -> torch.Tensor:
        """Full slots [sum(extend_lens)] int64 for each request's new tokens after its cached prefix,
        continuing the page of its last slot; each token also gets an SWA slot."""

    @abstractmethod
    def free(self, full_slots: torch.Tensor) -> None:
        """A finished or aborted request's tokens: both pools."""

    @abstractmethod
    def free_swa(self, full_slots: torch.Tensor) -> None:
        """Evict: free the SWA slots of tokens that left the window, keep their full slots."""

    @abstractmethod
    def translate(self, full_slots: torch.Tensor) -> torch.Tensor:
        """The SWA slots of full slots (0 for evicted and dummy slots, -1 for -1), int32."""

    # ---- what snapshots and checks read -----------------------------------------------------------------
    @abstractmethod
    def kv_buffers(self) -> PoolBuffers: ...

    def begin_step(self, step: int) -> None:
        """The writes from now on belong to step ``step`` (the write log ``kv_buffers`` hands out)."""
        self.pool.begin_step(step)

    @abstractmethod
    def free_slots(self) -> tuple[frozenset[int], frozenset[int]]:
        """Every slot of the full and of the SWA pool that is free now (whole free pages)."""

    def hold_prefix_cache(self, cache: CacheHoldings) -> None:
        """Count the tokens ``cache`` keeps in the invariants: slots it owns, shared by the live tokens that
        matched them (the scheduler attaches its prefix cache, which frees through this stack)."""
        self._prefix_cache = cache

    def invariant_violations(self, live: Sequence[LiveToken]) -> list[InvariantViolation]:
        """The pool invariants (``invariants.py``) that ``live``, the free lists and the prefix cache break now."""
        free_full, free_swa = self.free_slots()
        cached = self._prefix_cache.cached_tokens() if self._prefix_cache is not None else ()
        return pool_violations(live, free_full=free_full, free_swa=free_swa, page_size=self.page_size, cached=cached)

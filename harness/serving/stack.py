"""The serving-stack seam: everything a run needs from the memory layer under test.

A run builds one stack for its spec, and the scheduler, the snapshots, the backends and the runners go
through it: the scheduler allocates and frees slots and request rows and evicts through it, snapshots read
its K/V buffers group by group (``kv_groups.py``), backends are constructed with it and write and read
through its ``pool``. The harness's own miniature of SGLang (``serving/miniature.py``) is the first
implementation; another (the installed SGLang) is one more module and one line in ``serving/registry.py``,
or a ``package.module:Class`` path.

A token's slot, as the scheduler holds it (``alloc_extend``'s answer, ``out_cache_loc``), is the stack's
own number; ``group_slots`` maps it to the slot the token holds in each KV group. The dummy page (page 0,
slot 0 at page size 1) of every group is where padded rows write; it is never handed out.

``HybridSWAStack`` is SGLang's layout: a full pool and an SWA pool (two groups, ``full`` and ``swa``), the SWA
slot found by translating the full one. Only stacks with that SWA pool ask the SWA-location designs where an
SWA layer writes (``asks_swa_design``); any other stack says where each layer writes (``layer_cache_loc``).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

from .invariants import CacheHoldings, InvariantViolation, pool_violations
from .kv_groups import GroupBuffers, KVBuffers, KVGroups, hybrid_swa_groups
from .model import ModelSpec
from .pool import HybridSWAKVPool, PoolSpec, ReqToTokenPool
from .timeline import LiveToken


@dataclass(frozen=True, slots=True, kw_only=True)
class StackSpec:
    """What building a stack needs: the pool's knobs and the model's KV geometry."""

    pool: PoolSpec
    layer_is_swa: tuple[bool, ...]
    """per layer: the layer attends over a sliding window"""
    num_kv_heads: int
    head_dim: int
    kv_scales: tuple[tuple[float, float], ...] | None = None
    """per layer (k_scale, v_scale) of an FP8 pool"""
    device: str = "cpu"
    poison_freed: bool = True
    """re-poison slots as they are freed, so a read of a freed slot shows as poison"""
    layer_windows: tuple[int | None, ...] = ()
    """per layer: the keys its window holds, None for full attention (``ModelSpec.layer_window``); empty
    for a bookkeeping-only spec (the load-time dry run)"""


def stack_spec(model: ModelSpec, pool: PoolSpec, *, kv_scales: tuple[tuple[float, float], ...] | None = None,
               device: str = "cpu") -> StackSpec:
    """The stack spec of a run of ``model`` over ``pool``: what a run builds its stack from, and what the
    report asks a stack's groups for."""
    return StackSpec(pool=pool, layer_is_swa=tuple(model.layer_is_swa), num_kv_heads=model.num_kv_heads,
                     head_dim=model.head_dim, kv_scales=kv_scales, device=device,
                     layer_windows=tuple(model.layer_window(i) for i in range(model.num_layers)))


class KVPool(Protocol):
    """What backends, designs and runners use of a stack's ``pool``: SGLang's ``token_to_kv_pool`` surface,
    per layer (``HybridSWAKVPool`` is the miniature's)."""

    device: torch.device
    page_size: int
    kv_dtype: str
    kv_scales: list[tuple[float, float]]
    swa_loc: torch.Tensor | None

    def is_swa_layer(self, layer_id: int) -> bool: ...
    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]: ...
    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None: ...
    def read_kv(self, layer_id: int, slots: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]: ...
    def log_write(self, layer_id: int, loc: torch.Tensor) -> None: ...
    def translate_loc_from_full_to_swa(self, locs: torch.Tensor) -> torch.Tensor: ...
    def invalidate_translate_cache(self) -> None: ...
    def set_swa_loc(self, loc: torch.Tensor | None) -> None: ...
    def buffers(self) -> list[torch.Tensor]: ...
    def begin_step(self, step: int) -> None: ...


class ServingStack(ABC):
    """Pools, allocator and request rows of one run, behind the operations the harness uses."""

    name: ClassVar[str]
    asks_swa_design: ClassVar[bool] = False
    """an SWA layer's write locations come from the run's SWA-location design (``serving/designs.py``): a
    stack with SGLang's SWA pool asks that question; any other says where each layer writes"""

    pool: Any
    """what backends and runners read and write K/V through (``KVPool``)"""
    req_to_token_pool: ReqToTokenPool
    groups: KVGroups
    """its KV groups (``kv_groups`` for the spec it was built from)"""
    _prefix_cache: CacheHoldings | None = None

    @classmethod
    @abstractmethod
    def kv_groups(cls, spec: StackSpec) -> KVGroups:
        """The KV groups a stack built from ``spec`` has, without building it (the report names them)."""

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
        """Record the slots of positions ``start ..`` of the request in ``row``."""

    # ---- token slots -----------------------------------------------------------------------------------
    @abstractmethod
    def alloc_extend(self, *, prefix_lens: Sequence[int], extend_lens: Sequence[int],
                     last_locs: Sequence[int]) -> torch.Tensor:
        """Slots [sum(extend_lens)] int64 for each request's new tokens after its cached prefix, continuing
        the page of its last slot; each token also gets a slot in every group."""

    @abstractmethod
    def free(self, full_slots: torch.Tensor) -> None:
        """A finished or aborted request's tokens: every group."""

    @abstractmethod
    def free_swa(self, full_slots: torch.Tensor) -> None:
        """Evict: free the windowed groups' slots of tokens that left the window, keep the others."""

    @contextlib.contextmanager
    def free_group(self) -> Iterator[None]:
        """Frees made inside go back to the free lists together, when it ends, in the order they were made (as
        SGLang's ``free_group_begin`` / ``free_group_end`` around a batch build's evictions); a stack without
        groups frees each at once."""
        yield

    @abstractmethod
    def group_slots(self, slots: torch.Tensor) -> torch.Tensor:
        """[groups, n] int64: the slot each of ``slots`` (tokens' slots, int64 [n]) holds in each group, in
        the groups' order; 0 where it holds none (evicted, or the dummy)."""

    def translate(self, full_slots: torch.Tensor) -> torch.Tensor:
        """The SWA slots of full slots (0 for evicted and dummy slots, -1 for -1), int32: SGLang's
        translation, which the location plan and the prefix cache ask of a stack with an SWA pool."""
        raise NotImplementedError(f"serving stack {self.name} has no SWA pool to translate slots into")

    def layer_cache_loc(self, layer_id: int, out_cache_loc: torch.Tensor) -> torch.Tensor:
        """Where layer ``layer_id`` writes the new tokens ``out_cache_loc``: their slots in its group. A
        backend asks this of a stack that does not ask the SWA-location designs (``asks_swa_design``)."""
        row = self.groups.index(self.groups.of_layer(layer_id).name)
        return self.group_slots(out_cache_loc.to(torch.int64))[row]

    # ---- what snapshots and checks read -----------------------------------------------------------------
    @abstractmethod
    def kv_buffers(self) -> KVBuffers: ...

    def begin_step(self, step: int) -> None:
        """The writes from now on belong to step ``step`` (the write log ``kv_buffers`` hands out)."""
        self.pool.begin_step(step)

    @abstractmethod
    def free_slots(self) -> Mapping[str, frozenset[int]]:
        """Per group name, every slot of the group's pool that is free now (whole free pages)."""

    def hold_prefix_cache(self, cache: CacheHoldings) -> None:
        """Count the tokens ``cache`` keeps in the invariants: slots it owns, shared by the live tokens that
        matched them (the scheduler attaches its prefix cache, which frees through this stack)."""
        self._prefix_cache = cache

    def invariant_violations(self, live: Sequence[LiveToken]) -> list[InvariantViolation]:
        """The pool invariants (``invariants.py``) that ``live``, the free lists and the prefix cache break now."""
        cached = self._prefix_cache.cached_tokens() if self._prefix_cache is not None else ()
        return pool_violations(live, groups=self.groups, free=self.free_slots(), cached=cached)


class HybridSWAStack(ServingStack):
    """SGLang's layout: a full pool and an SWA pool behind ``HybridSWAKVPool``'s surface, two groups."""

    asks_swa_design = True
    keeps_write_log: ClassVar[bool] = True
    """the pool's write log records every K/V write (False where code the harness does not own writes)"""
    pool: HybridSWAKVPool

    @classmethod
    def kv_groups(cls, spec: StackSpec) -> KVGroups:
        return hybrid_swa_groups(
            layer_is_swa=spec.layer_is_swa, layer_windows=spec.layer_windows, full_size=spec.pool.full_size,
            swa_size=spec.pool.swa_size, page_size=spec.pool.page_size, kv_dtype=spec.pool.kv_dtype,
            num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim)

    def group_slots(self, slots: torch.Tensor) -> torch.Tensor:
        return torch.stack([slots.to(torch.int64), self.translate(slots).to(torch.int64)])

    def layer_cache_loc(self, layer_id: int, out_cache_loc: torch.Tensor) -> torch.Tensor:
        """A full layer writes at ``out_cache_loc`` itself; an SWA layer where the design says (the backend
        asks it, ``asks_swa_design``), here translated as the ``translate`` design does."""
        if not self.pool.is_swa_layer(layer_id):
            return out_cache_loc
        return self.translate(out_cache_loc)

    @abstractmethod
    def translate(self, full_slots: torch.Tensor) -> torch.Tensor: ...

    @abstractmethod
    def hybrid_free_slots(self) -> tuple[frozenset[int], frozenset[int]]:
        """Every free slot of the full and of the SWA pool."""

    def free_slots(self) -> Mapping[str, frozenset[int]]:
        free_full, free_swa = self.hybrid_free_slots()
        return {"full": free_full, "swa": free_swa}

    def poison(self) -> None:
        self.pool.poison()

    def kv_buffers(self) -> KVBuffers:
        p = self.pool
        logs = self.keeps_write_log
        return KVBuffers(groups=self.groups, buffers=(
            GroupBuffers(k=p.full_k_buffer, v=p.full_v_buffer, log=p.full_last_write if logs else None),
            GroupBuffers(k=p.swa_k_buffer, v=p.swa_v_buffer, log=p.swa_last_write if logs else None),
        ))

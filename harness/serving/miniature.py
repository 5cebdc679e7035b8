"""The harness's miniature of SGLang's SWA memory layer as a serving stack: ``HybridSWAKVPool``,
``SWATokenToKVPoolAllocator`` and ``ReqToTokenPool`` (the first implementation of ``stack.ServingStack``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from .allocator import SWATokenToKVPoolAllocator
from .kv_groups import KVGroups
from .pool import HybridSWAKVPool, ReqToTokenPool
from .stack import HybridSWAStack, StackSpec


class MiniatureStack(HybridSWAStack):
    name = "miniature"

    def __init__(self, *, pool: HybridSWAKVPool, allocator: SWATokenToKVPoolAllocator,
                 req_to_token_pool: ReqToTokenPool, groups: KVGroups | None = None) -> None:
        self.pool = pool
        self.allocator = allocator
        self.req_to_token_pool = req_to_token_pool
        if groups is None:  # a stack over a pool built by hand: its geometry read back from its buffers
            row = next(b for b in (*pool.full_k_buffer, *pool.swa_k_buffer)).shape[1:]
            groups = self.kv_groups(StackSpec(
                pool=pool.spec, layer_is_swa=tuple(pool.is_swa_layer(i) for i in sorted(pool.layers_mapping)),
                num_kv_heads=row[0], head_dim=row[1]))
        self.groups = groups

    @classmethod
    def build(cls, spec: StackSpec) -> MiniatureStack:
        pool = HybridSWAKVPool(
            spec=spec.pool, layer_is_swa=spec.layer_is_swa, num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
            kv_scales=spec.kv_scales, device=spec.device,
        )
        req_to_token_pool = ReqToTokenPool(
            max_running_requests=spec.pool.max_running_requests, max_context_len=spec.pool.max_context_len,
            device=spec.device,
        )
        return cls(pool=pool, allocator=SWATokenToKVPoolAllocator(pool, poison_freed=spec.poison_freed),
                   req_to_token_pool=req_to_token_pool, groups=cls.kv_groups(spec))

    @classmethod
    def over(cls, pool: HybridSWAKVPool, req_to_token_pool: ReqToTokenPool) -> MiniatureStack:
        """A stack over a pool and request rows built by hand (tests, benchmarks), with an allocator of its own."""
        return cls(pool=pool, allocator=SWATokenToKVPoolAllocator(pool), req_to_token_pool=req_to_token_pool)

    def alloc_req_row(self) -> int:
        return self.req_to_token_pool.alloc()

    def free_req_row(self, row: int) -> None:
        self.req_to_token_pool.free(row)

    def write_req_to_token(self, row: int, start: int, slots: torch.Tensor) -> None:
        self.req_to_token_pool.write(row, start, slots)

    def alloc_extend(self, *, prefix_lens: Sequence[int], extend_lens: Sequence[int],
                     last_locs: Sequence[int]) -> torch.Tensor:
        return self.allocator.alloc_extend(prefix_lens=prefix_lens, extend_lens=extend_lens, last_locs=last_locs)

    def free(self, full_slots: torch.Tensor) -> None:
        self.allocator.free(full_slots)

    def free_swa(self, full_slots: torch.Tensor) -> None:
        self.allocator.free_swa(full_slots)

    @contextlib.contextmanager
    def free_group(self) -> Iterator[None]:
        self.allocator.free_group_begin()
        try:
            yield
        finally:
            self.allocator.free_group_end()

    def translate(self, full_slots: torch.Tensor) -> torch.Tensor:
        return self.pool.translate_loc_from_full_to_swa(full_slots)

    def hybrid_free_slots(self) -> tuple[frozenset[int], frozenset[int]]:
        return self.allocator.free_slots()

"""The harness's miniature of SGLang's SWA memory layer as a serving stack: ``HybridSWAKVPool``,
``SWATokenToKVPoolAllocator`` and ``ReqToTokenPool`` (the first implementation of ``stack.ServingStack``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .allocator import SWATokenToKVPoolAllocator
from .pool import HybridSWAKVPool, ReqToTokenPool
from .stack import PoolBuffers, ServingStack, StackSpec


class MiniatureStack(ServingStack):
    name = "miniature"

    def __init__(self, *, pool: HybridSWAKVPool, allocator: SWATokenToKVPoolAllocator,
                 req_to_token_pool: ReqToTokenPool) -> None:
        self.pool = pool
        self.allocator = allocator
        self.req_to_token_pool = req_to_token_pool

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
                   req_to_token_pool=req_to_token_pool)

    def poison(self) -> None:
        self.pool.poison()

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

    def translate(self, full_slots: torch.Tensor) -> torch.Tensor:
        return self.pool.translate_loc_from_full_to_swa(full_slots)

    def free_slots(self) -> tuple[frozenset[int], frozenset[int]]:
        return self.allocator.free_slots()

    def kv_buffers(self) -> PoolBuffers:
        p = self.pool
        return PoolBuffers(full_k=p.full_k_buffer, full_v=p.full_v_buffer, swa_k=p.swa_k_buffer, swa_v=p.swa_v_buffer,
                           full_log=p.full_last_write, swa_log=p.swa_last_write)

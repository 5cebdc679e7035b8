"""Slot allocators: request rows of ``req_to_token`` and token slots of both KV pools.

Free slots are handed out lowest first and returned to the free set at once, so a freed SWA slot is the
next one reused. Reuse while other requests still run is exactly where stale write locations do damage.
"""

from __future__ import annotations

import torch

from .pool import FreeList, HybridSWAKVPool, PoolExhausted


class SWATokenToKVPoolAllocator:
    """Allocates a full slot and an SWA slot per token and keeps ``full_to_swa_index_mapping`` current."""

    def __init__(self, pool: HybridSWAKVPool, *, poison_freed: bool = False) -> None:
        """``poison_freed`` re-poisons slots as they are freed: a correct run never reads a freed slot
        again, so a stale read shows up as poison instead of as plausible old data."""
        self.pool = pool
        self.poison_freed = poison_freed
        self._full = FreeList(pool.full_size, "full KV pool", "full_size")
        self._swa = FreeList(pool.swa_size, "SWA KV pool", "swa_size")

    def available_size(self) -> tuple[int, int]:
        return len(self._full), len(self._swa)

    def alloc(self, n: int) -> torch.Tensor:
        """Full-pool slots for ``n`` new tokens; their SWA slots are recorded in the mapping."""
        if n == 0:
            return torch.empty(0, dtype=torch.int64, device=self.pool.device)
        if n > len(self._swa):
            raise PoolExhausted(
                "swa_size", f"SWA KV pool: need {n} slots, {len(self._swa)} free of {self.pool.swa_size - 1}"
            )
        full = self._full.take(n)
        swa = self._swa.take(n)
        full_t = torch.tensor(full, dtype=torch.int64, device=self.pool.device)
        self.pool.full_to_swa_index_mapping[full_t] = torch.tensor(swa, dtype=torch.int64, device=self.pool.device)
        return full_t

    def free_swa(self, full_slots: torch.Tensor) -> None:
        """Evict tokens that left the window of a live request: free their SWA slots, keep the full ones."""
        if full_slots.numel() == 0:
            return
        mapping = self.pool.full_to_swa_index_mapping
        swa = mapping[full_slots.long()]
        freed = swa[swa > 0].tolist()
        self._swa.give_back(freed)
        mapping[full_slots.long()] = 0
        if self.poison_freed:
            self.pool.poison_slots([], freed)

    def free(self, full_slots: torch.Tensor) -> None:
        """Free finished or aborted tokens in both pools."""
        if full_slots.numel() == 0:
            return
        self.free_swa(full_slots)
        freed = full_slots.long().tolist()
        self._full.give_back(freed)
        if self.poison_freed:
            self.pool.poison_slots(freed, [])

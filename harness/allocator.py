"""Slot allocators: request rows of ``req_to_token`` and token slots of both KV pools.

Free slots are handed out lowest first and returned to the free set at once, so a freed SWA slot is the
next one reused. Reuse while other requests still run is exactly where stale write locations do damage.
"""

from __future__ import annotations

import bisect

import torch

from .pool import HybridSWAKVPool


class PoolExhausted(RuntimeError):
    """The timeline needs more slots than the pool spec provides."""


class _FreeList:
    """Sorted free slot ids; slot 0 is the reserved dummy and never free."""

    def __init__(self, size: int, what: str) -> None:
        self._free = list(range(1, size))
        self._capacity = size - 1
        self._what = what

    def __len__(self) -> int:
        return len(self._free)

    def take(self, n: int) -> list[int]:
        if n > len(self._free):
            raise PoolExhausted(
                f"{self._what}: need {n} slots, {len(self._free)} free of {self._capacity}; "
                "raise the pool size in the scenario"
            )
        taken, self._free = self._free[:n], self._free[n:]
        return taken

    def give_back(self, slots: list[int]) -> None:
        for slot in slots:
            if slot <= 0:
                raise ValueError(f"{self._what}: cannot free reserved slot {slot}")
            bisect.insort(self._free, slot)


class ReqToTokenPool:
    """``req_to_token[req_pool_index, position] -> full-pool slot``; row 0 is the dummy row padded rows use."""

    def __init__(self, *, max_running_requests: int, max_context_len: int, device: torch.device | str = "cpu"):
        self.req_to_token = torch.zeros(
            (max_running_requests + 1, max_context_len), dtype=torch.int32, device=device
        )
        self.max_context_len = max_context_len
        self._rows = _FreeList(max_running_requests + 1, "req_to_token rows")

    def alloc(self) -> int:
        return self._rows.take(1)[0]

    def free(self, row: int) -> None:
        self.req_to_token[row] = 0
        self._rows.give_back([row])

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        end = start + slots.numel()
        if end > self.max_context_len:
            raise PoolExhausted(
                f"req_to_token: request needs {end} positions, max_context_len is {self.max_context_len}"
            )
        self.req_to_token[row, start:end] = slots.to(torch.int32)


class SWATokenToKVPoolAllocator:
    """Allocates a full slot and an SWA slot per token and keeps ``full_to_swa_index_mapping`` current."""

    def __init__(self, pool: HybridSWAKVPool, *, poison_freed: bool = False) -> None:
        """``poison_freed`` re-poisons slots as they are freed: a correct run never reads a freed slot
        again, so a stale read shows up as poison instead of as plausible old data."""
        self.pool = pool
        self.poison_freed = poison_freed
        self._full = _FreeList(pool.full_size, "full KV pool")
        self._swa = _FreeList(pool.swa_size, "SWA KV pool")

    def available_size(self) -> tuple[int, int]:
        return len(self._full), len(self._swa)


    def alloc(self, n: int) -> torch.Tensor:
        """Full-pool slots for ``n`` new tokens; their SWA slots are recorded in the mapping."""
        if n == 0:
            return torch.empty(0, dtype=torch.int64, device=self.pool.device)
        if n > len(self._swa):
            raise PoolExhausted(
                f"SWA KV pool: need {n} slots, {len(self._swa)} free of {self.pool.swa_size - 1}; "
                "raise the SWA pool size in the scenario"
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

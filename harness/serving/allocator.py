"""Slot allocators: request rows of ``req_to_token`` and token slots of both KV pools, page by page.

Both pools are allocated in lockstep, as SGLang's paged SWA allocator does: a token that opens a new page
takes a full page and an SWA page together, and every later token of that page sits at the same offset in
both, so ``full_to_swa_index_mapping`` maps a full page onto one SWA page. A request's next token continues
its last page (the full slot after ``last_loc``) until the page is full. With pages of one token every token
opens a page and this is plain slot allocation.

Frees work in whole pages, as SGLang's paged allocator frees: freeing any slot of a page gives the whole
page back. That is why eviction frontiers are floored to a page: a frontier inside a page frees the page
under tokens still in the window. No two requests share a page (each opens its own), so a request's
finished or evicted pages are its own. Free pages are handed out in the pool's ``free_order``: by default
lowest first, so a freed SWA page is the next one reused (reuse while other requests still run is exactly
where stale write locations do damage); SGLang's own orders are the others.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .pool import FreeList, HybridSWAKVPool, PoolExhausted


class SWATokenToKVPoolAllocator:
    """Allocates a full slot and an SWA slot per token and keeps ``full_to_swa_index_mapping`` current."""

    def __init__(self, pool: HybridSWAKVPool, *, poison_freed: bool = False) -> None:
        """``poison_freed`` re-poisons slots as they are freed: a correct run never reads a freed slot
        again, so a stale read shows up as poison instead of as plausible old data."""
        self.pool = pool
        self.page_size = pool.page_size
        self.poison_freed = poison_freed
        order = pool.spec.free_order
        self._full = FreeList(pool.full_size // self.page_size, "full KV pool", "full_size", unit=self.page_size,
                              order=order)
        self._swa = FreeList(pool.swa_size // self.page_size, "SWA KV pool", "swa_size", unit=self.page_size,
                             order=order)
        # pages handed out and not yet freed: freeing one that is not is a double free
        self._full_held: set[int] = set()
        self._swa_held: set[int] = set()

    def available_size(self) -> tuple[int, int]:
        """Free slots of each pool, counted in whole free pages."""
        return len(self._full) * self.page_size, len(self._swa) * self.page_size

    def free_slots(self) -> tuple[frozenset[int], frozenset[int]]:
        """The slots of every free page of the full and of the SWA pool."""
        p = self.page_size
        if p == 1:  # a page is its slot: no Python loop over the pool's free pages
            return frozenset(self._full), frozenset(self._swa)
        return tuple(frozenset(page * p + k for page in free for k in range(p)) for free in (self._full, self._swa))

    def alloc(self, n: int) -> torch.Tensor:
        """Full-pool slots for the first ``n`` tokens of one new request."""
        return self.alloc_extend(prefix_lens=[0], extend_lens=[n], last_locs=[0])

    def alloc_extend(self, *, prefix_lens: Sequence[int], extend_lens: Sequence[int],
                     last_locs: Sequence[int]) -> torch.Tensor:
        """Full-pool slots for ``extend_lens[i]`` new tokens of request i after its ``prefix_lens[i]`` cached
        ones, continuing the page of its last slot ``last_locs[i]``; concatenated in request order. The SWA
        slots are recorded in the mapping."""
        p = self.page_size
        opening = [_pages(pre + n, p) - _pages(pre, p) for pre, n in zip(prefix_lens, extend_lens)]
        need = sum(opening)
        if need > len(self._swa):
            raise PoolExhausted(
                "swa_size",
                f"SWA KV pool: need {need * p} slots, {len(self._swa) * p} free of {self.pool.swa_size - p}",
            )
        full_pages = self._full.take(need)
        swa_pages = self._swa.take(need)
        full: list[int] = []
        swa: list[int] = []
        page = 0
        for pre, n, last in zip(prefix_lens, extend_lens, last_locs):
            last_swa = int(self.pool.full_to_swa_index_mapping[last]) if pre % p else 0
            for pos in range(pre, pre + n):
                if pos % p == 0:
                    last, last_swa = full_pages[page] * p, swa_pages[page] * p
                    page += 1
                else:
                    last, last_swa = last + 1, last_swa + 1
                full.append(last)
                swa.append(last_swa)
        self._full_held.update(full_pages)
        self._swa_held.update(swa_pages)
        device = self.pool.device
        full_t = torch.tensor(full, dtype=torch.int64, device=device)
        if full:
            self.pool.full_to_swa_index_mapping[full_t] = torch.tensor(swa, dtype=torch.int64, device=device)
        # SGLang PR 25824: every allocator method that changes the mapping drops the memoized translation
        self.pool.invalidate_translate_cache()
        return full_t

    def free_group_begin(self) -> None:
        """Hold every free until ``free_group_end``, as SGLang's allocator does around a batch build's frees."""
        self._full.hold()
        self._swa.hold()

    def free_group_end(self) -> None:
        """The held frees go back, each pool's in one give-back in the order they were made."""
        self._swa.release_held()
        self._full.release_held()

    def free_swa(self, full_slots: torch.Tensor) -> None:
        """Evict tokens that left the window of a live request: free their SWA slots, keep the full ones."""
        if full_slots.numel() == 0:
            return
        mapping = self.pool.full_to_swa_index_mapping
        swa = mapping[full_slots.long()]
        pages = _release(swa[swa > 0].tolist(), self._swa_held, self.page_size)
        self._swa.give_back(pages)
        mapping[full_slots.long()] = 0
        self.pool.invalidate_translate_cache()
        if self.poison_freed:
            self.pool.poison_slots([], _slots_of(pages, self.page_size))

    def free(self, full_slots: torch.Tensor) -> None:
        """Free finished or aborted tokens in both pools, as SGLang frees a request's row
        (``free_kv_row_segments``): first the leading run its eviction already freed (full side only), then the
        rest (SWA, then full), each a give-back of its own, so with pages given back to the head of the free
        list the row's still-live pages are reused first. A page the two runs share goes back with the first."""
        if full_slots.numel() == 0:
            return
        full_slots = full_slots.long()
        mapped = (self.pool.full_to_swa_index_mapping[full_slots] > 0).tolist()
        evicted = mapped.index(True) if True in mapped else len(mapped)
        first = _release(full_slots[:evicted].tolist(), self._full_held, self.page_size)
        self._full.give_back(first)
        self.free_swa(full_slots[evicted:])
        shared = set(first)
        rest = _release([s for s in full_slots[evicted:].tolist() if s // self.page_size not in shared],
                        self._full_held, self.page_size)
        self._full.give_back(rest)
        self.pool.invalidate_translate_cache()  # also when free_swa had nothing left to free (and did not)
        if self.poison_freed:
            self.pool.poison_slots(_slots_of(first + rest, self.page_size), [])


def _pages(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


def _release(slots: list[int], held: set[int], page_size: int) -> list[int]:
    """The pages of ``slots`` (in the order the slots name them), taken off ``held``."""
    pages = list(dict.fromkeys(slot // page_size for slot in slots))
    for page in pages:
        if page == 0:
            raise ValueError(f"cannot free reserved slot {next(s for s in slots if s < page_size)}: it is in the "
                             "dummy page")
        if page not in held:
            # SGLang's invariant checker aborts here too: a second free would hand the page out twice
            raise ValueError(f"cannot free page {page}: it is not allocated (a double free)")
    held.difference_update(pages)
    return pages


def _slots_of(pages: list[int], page_size: int) -> list[int]:
    return [page * page_size + k for page in pages for k in range(page_size)]

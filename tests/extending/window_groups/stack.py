"""A serving stack of three KV groups: full attention, window 8 and window 32 (one group per window of the
model, ``model.py``), each a pool with its own free list and slot mapping.

Each token takes a slot in every group when it is allocated; leaving the eviction window (the model's widest,
32) frees its windowed groups' slots, finishing frees all. The window-8 group hands its slots out highest
first, so the two windowed groups' mappings part from the first token: a backend that read one group through
the other's mapping reads the wrong rows. Pages of one token only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from harness.serving.kv_groups import GroupBuffers, KVBuffers, KVGroup, KVGroups
from harness.serving.pool import FreeList, ReqToTokenPool
from harness.serving.stack import ServingStack, StackSpec

from .pool import WindowGroupsPool


class _HighestFirst(FreeList):
    """Free slots handed out highest first."""

    def take(self, n: int) -> list[int]:
        taken = super().take(len(self))
        keep, out = taken[: len(taken) - n], taken[len(taken) - n :][::-1]
        self.give_back(keep)
        return out


def group_name(window: int | None) -> str:
    return "full" if window is None else f"w{window}"


class WindowGroupsStack(ServingStack):
    """Full attention in the full pool (``pool.full_size`` slots), each window in a pool of its own
    (``pool.swa_size`` slots each)."""

    name = "window_groups"

    def __init__(self, *, spec: StackSpec, groups: KVGroups) -> None:
        self.spec = spec
        self.groups = groups
        self.pool = WindowGroupsPool(groups, device=spec.device)
        self.req_to_token_pool = ReqToTokenPool(max_running_requests=spec.pool.max_running_requests,
                                                max_context_len=spec.pool.max_context_len, device=spec.device)
        self.free_lists = [
            (_HighestFirst if g.window is not None and g.window < max(w.window or 0 for w in groups) else FreeList)(
                g.size, f"{g.title} KV pool", "full_size" if g.window is None else "swa_size")
            for g in groups
        ]
        self.held: list[set[int]] = [set() for _ in groups]

    @classmethod
    def kv_groups(cls, spec: StackSpec) -> KVGroups:
        if spec.pool.page_size != 1:
            raise ValueError(f"the window-groups stack keeps pages of one token, not {spec.pool.page_size}")
        windows = spec.layer_windows or tuple(None for _ in spec.layer_is_swa)
        common = {"page_size": 1, "kv_dtype": spec.pool.kv_dtype, "num_kv_heads": spec.num_kv_heads,
                  "head_dim": spec.head_dim}
        distinct = [None] + sorted({w for w in windows if w is not None})
        return KVGroups(tuple(
            KVGroup(name=group_name(w), layer_ids=tuple(i for i, lw in enumerate(windows) if lw == w), window=w,
                    size=spec.pool.full_size if w is None else spec.pool.swa_size,
                    label="full" if w is None else f"window-{w}", **common)
            for w in distinct
        ))

    @classmethod
    def build(cls, spec: StackSpec) -> WindowGroupsStack:
        if spec.pool.kv_dtype == "fp8_e4m3":
            raise ValueError("the window-groups stack stores plain dtypes only")
        return cls(spec=spec, groups=cls.kv_groups(spec))

    def poison(self) -> None:
        self.pool.poison()

    # ---- request rows ----------------------------------------------------------------------------------
    def alloc_req_row(self) -> int:
        return self.req_to_token_pool.alloc()

    def free_req_row(self, row: int) -> None:
        self.req_to_token_pool.free(row)

    def write_req_to_token(self, row: int, start: int, slots: torch.Tensor) -> None:
        self.req_to_token_pool.write(row, start, slots)

    # ---- token slots -----------------------------------------------------------------------------------
    def alloc_extend(self, *, prefix_lens: Sequence[int], extend_lens: Sequence[int],
                     last_locs: Sequence[int]) -> torch.Tensor:
        n = sum(extend_lens)
        for free in self.free_lists:
            if len(free) < n:
                free.take(n)  # raises PoolExhausted naming the group's pool
        ids = self.free_lists[0].take(n)
        self.held[0].update(ids)
        index = torch.tensor(ids, dtype=torch.int64, device=self.pool.device)
        for g_index in range(1, len(self.groups)):
            slots = self.free_lists[g_index].take(n)
            self.held[g_index].update(slots)
            self.pool.mappings[g_index][index] = torch.tensor(slots, dtype=torch.int64, device=self.pool.device)
        return index

    def free(self, full_slots: torch.Tensor) -> None:
        self.free_swa(full_slots)
        self._give_back(0, full_slots.long().tolist())

    def free_swa(self, full_slots: torch.Tensor) -> None:
        ids = full_slots.long()
        for g_index, g in enumerate(self.groups):
            if not g.has_window or not ids.numel():
                continue
            mapping = self.pool.mappings[g_index]
            slots = [s for s in mapping[ids].tolist() if s > 0]
            mapping[ids] = 0
            self._give_back(g_index, slots)

    def group_slots(self, slots: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.pool.to_group(i, slots) for i in range(len(self.groups))])

    # ---- what snapshots and checks read -----------------------------------------------------------------
    def kv_buffers(self) -> KVBuffers:
        p = self.pool
        return KVBuffers(groups=self.groups, buffers=tuple(
            GroupBuffers(k=p.k[i], v=p.v[i], log=p.logs[i]) for i in range(len(self.groups))))

    def free_slots(self) -> Mapping[str, frozenset[int]]:
        return {g.name: frozenset(free) for g, free in zip(self.groups, self.free_lists)}

    # ---- internals -------------------------------------------------------------------------------------
    def _give_back(self, g_index: int, slots: list[int]) -> None:
        held = self.held[g_index]
        twice = [s for s in slots if s not in held]
        if twice:
            raise ValueError(f"{self.groups.groups[g_index].title} KV pool: double free of slots {twice}")
        held.difference_update(slots)
        self.free_lists[g_index].give_back(slots)
        if self.spec.poison_freed:
            self.pool.poison_slots(g_index, slots)

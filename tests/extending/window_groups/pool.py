"""One pool per KV group, each with its own slot mapping: a token's slot in the full group is its id (what
the scheduler holds, ``out_cache_loc``), and each windowed group maps that id to a slot of its own, as vLLM
keeps one block table per group."""

from __future__ import annotations

import torch

from harness.serving.kv_groups import KVGroups
from harness.serving.pool import NEVER_WRITTEN, poison_, storage_dtype


class WindowGroupsPool:
    """K/V buffers per group and layer, the per-group slot mappings and the write log, behind the surface the
    harness's backends and runners use (``harness.serving.stack.KVPool``)."""

    def __init__(self, groups: KVGroups, *, device: torch.device | str = "cpu") -> None:
        self.groups = groups
        self.device = torch.device(device)
        first = groups.groups[0]
        self.page_size = first.page_size
        self.kv_dtype = first.kv_dtype
        self.store_dtype = storage_dtype(first.kv_dtype)
        self.full_size = first.size
        self.where: dict[int, tuple[int, int]] = {}
        """layer -> (group index, its index among the group's layers)"""
        self.k: list[list[torch.Tensor]] = []
        self.v: list[list[torch.Tensor]] = []
        self.logs: list[list[torch.Tensor]] = []
        for g_index, g in enumerate(groups):
            for i, layer in enumerate(g.layer_ids):
                self.where[layer] = (g_index, i)
            shape = (g.size, g.num_kv_heads, g.head_dim)
            self.k.append([torch.zeros(shape, dtype=self.store_dtype, device=self.device) for _ in g.layer_ids])
            self.v.append([torch.zeros(shape, dtype=self.store_dtype, device=self.device) for _ in g.layer_ids])
            self.logs.append([torch.full((g.size,), NEVER_WRITTEN, dtype=torch.int32, device=self.device)
                              for _ in g.layer_ids])
        # per group: token id -> the group's slot (0: none); the trailing entry maps -1 to -1, like SGLang's
        self.mappings = []
        for g in groups:
            mapping = torch.zeros(self.full_size + 1, dtype=torch.int64, device=self.device)
            mapping[-1] = -1
            self.mappings.append(mapping)
        self.mappings[0][: self.full_size] = torch.arange(self.full_size, device=self.device)  # the full group: itself
        self.write_step = torch.full((1,), NEVER_WRITTEN, dtype=torch.int32, device=self.device)
        self.kv_scales = [(1.0, 1.0)] * len(self.where)
        self.swa_loc: torch.Tensor | None = None

    # ---- slot mappings ------------------------------------------------------------------------------
    def to_group(self, g_index: int, ids: torch.Tensor) -> torch.Tensor:
        """The slots of token ids ``ids`` in group ``g_index`` (0 where none), int64."""
        return self.mappings[g_index][ids.long()]

    def translate_loc_from_full_to_swa(self, locs: torch.Tensor) -> torch.Tensor:
        """SGLang's one SWA translation has no meaning with two windowed groups: the widest one's slots, which
        no write reads (the stack does not ask the SWA-location designs, ``asks_swa_design``)."""
        widest = max(range(len(self.groups)), key=lambda i: self.groups.groups[i].window or -1)
        return self.to_group(widest, locs).to(torch.int32)

    def invalidate_translate_cache(self) -> None:
        """Nothing is memoized here."""

    def set_swa_loc(self, loc: torch.Tensor | None) -> None:
        self.swa_loc = loc

    # ---- buffers ------------------------------------------------------------------------------------
    def is_swa_layer(self, layer_id: int) -> bool:
        return self.groups.groups[self.where[layer_id][0]].has_window

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        g, i = self.where[layer_id]
        return self.k[g][i], self.v[g][i]

    def log_write(self, layer_id: int, loc: torch.Tensor) -> None:
        g, i = self.where[layer_id]
        self.logs[g][i][loc] = self.write_step

    def begin_step(self, step: int) -> None:
        self.write_step.fill_(step)

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write K/V rows at ``loc``, already the layer's group's slots."""
        k_buf, v_buf = self.get_kv_buffer(layer_id)
        k_buf[loc] = k.to(self.store_dtype)
        v_buf[loc] = v.to(self.store_dtype)
        self.log_write(layer_id, loc)

    def read_kv(self, layer_id: int, slots: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        k_buf, v_buf = self.get_kv_buffer(layer_id)
        return k_buf[slots].to(dtype), v_buf[slots].to(dtype)

    def buffers(self) -> list[torch.Tensor]:
        return [t for per_group in (*self.k, *self.v, *self.logs) for t in per_group] + [self.write_step,
                                                                                          *self.mappings]

    def poison(self) -> None:
        """Poison every slot but the dummy page of every group; clear the write log."""
        p = self.page_size
        for per_group in (*self.k, *self.v):
            for buf in per_group:
                poison_(buf[p:])
                buf[:p] = 0
        for per_group in self.logs:
            for log in per_group:
                log.fill_(NEVER_WRITTEN)

    def poison_slots(self, g_index: int, slots: list[int]) -> None:
        if not slots:
            return
        index = torch.tensor(slots, dtype=torch.int64, device=self.device)
        for buf in (*self.k[g_index], *self.v[g_index]):
            rows = buf.new_empty((len(slots), *buf.shape[1:]))
            poison_(rows)
            buf[index] = rows
        for log in self.logs[g_index]:
            log[index] = NEVER_WRITTEN

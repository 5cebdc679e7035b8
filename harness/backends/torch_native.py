"""A torch-native paged attention backend: declaration, metadata builder and implementation.

The builder is the part that differs between an eager step (``build`` makes fresh tensors), graph capture
(``build_for_graph_capture`` points the metadata at static buffers) and replay
(``refresh_for_graph_replay`` refreshes those buffers in place, outside the graph).

Graphs capture a batch whose requests all add the same number of tokens (``GraphSupport.UNIFORM_BATCH``): a
decode (one each) or a target verify (``1 + draft steps`` each). For ``n`` tokens per request the token rows
are ``arange(bs * n) // n``, the same for every replay of a bucket, and each token's kv length comes from
``seq_lens`` outside the graph, into a static buffer; only a mixed extend batch sizes a tensor from host
lengths (``extend_token_rows``), so prefill graphs keep attention an island.

The kernel reads a whole page-table row per token, expanded to one slot per position (so any page size
works), ``max_context_len`` wide in every mode, and masks by
kv length and window. The fixed width keeps eager and graph runs bitwise equal; the masking is dense
SDPA-with-a-mask semantics: a masked key still contributes ``0 * value``, so a NaN planted in a slot that
masked columns point at (the dummy slot) leaks, as NaN from padded rows did in vLLM PR 38436.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..runspec import Device
from ..serving.batch import ForwardBatch
from .base import (
    AttentionBackend,
    AttentionBatch,
    AttentionImpl,
    AttentionMetadataBuilder,
    GraphSupport,
    KVLayout,
    swa_window_left_out,
)
from .page_table import (
    extend_token_kv_lens,
    extend_token_rows,
    position_slots,
    tree_slot_table,
    tree_swa_slot_table,
)


@dataclass(slots=True, kw_only=True)
class TorchNativeMetadata:
    page_table: torch.Tensor
    """[bs, max_context_len] int64 full-pool slot of every position (the page table expanded to token slots),
    0 past each request's length"""
    swa_page_table: torch.Tensor
    """[bs, max_context_len] int64 SWA slots: the full page table translated (0 where evicted)"""
    token_rows: torch.Tensor
    """[num_tokens] int64 batch row of each new token"""
    token_kv_lens: torch.Tensor
    """[num_tokens] keys each new token attends over before windowing"""
    out_cache_loc_swa: torch.Tensor | None
    """[num_tokens] int32 SWA write locations computed once per forward (the ``metadata`` design)"""
    kv_width: int
    """page-table columns the kernel reads"""
    key_pos: torch.Tensor
    """[max_context_len] int64 0..W-1, the position of each page-table column; one tensor, built once"""


class TorchNativeMetadataBuilder(AttentionMetadataBuilder):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.width = int(self.req_to_token.shape[1])
        self._key_pos = torch.arange(self.width, device=self.device)
        self._graph_metadata: dict[int, TorchNativeMetadata] = {}

    def _slot_table(self, batch: AttentionBatch) -> torch.Tensor:
        """[bs, width] full-pool slot of every position, read through each request's pages (a tree draft step's
        rows: their request's, then their branch's)."""
        if batch.tree is not None:
            return tree_slot_table(self.req_to_token, batch.req_pool_indices, batch.tree, batch.seq_lens, self.width)
        lens = batch.seq_lens
        if "read_page_tail" in self.faults:
            # vLLM PR 47574's family: the last page is read whole, its unwritten tail included; the
            # dense kernel masks those keys, but 0 x NaN is NaN where a freed, reused page holds poison
            lens = (lens + batch.page_size - 1) // batch.page_size * batch.page_size
        return position_slots(self.req_to_token, batch.req_pool_indices, batch.seq_lens, lens, self._key_pos,
                              page_size=batch.page_size)

    def _swa_table(self, batch: AttentionBatch, page_table: torch.Tensor) -> torch.Tensor:
        if swa_window_left_out(batch.forward_mode, self.faults):
            # SGLang PR 29858's family: the window's page table left out on this path, so the SWA layers read
            # the full table's slot ids in the SWA pool
            return page_table
        # the read path's translation: through the memo in a run of the memoized design (SGLang PR 25824's pool)
        swa_page_table = self.translate_for_read(page_table).long()
        if batch.tree is not None:
            swa_page_table = tree_swa_slot_table(page_table, swa_page_table, batch.tree,
                                                 untranslated="draft_tree_swa_untranslated" in self.faults)
        return swa_page_table

    def build(self, batch: AttentionBatch) -> TorchNativeMetadata:
        if batch.forward_mode.is_decode_like:
            page_table = self._slot_table(batch)
            token_rows = torch.arange(batch.bs, device=self.device)
            token_kv_lens = batch.seq_lens
        else:
            assert batch.extend_seq_lens is not None
            token_rows = extend_token_rows(batch.extend_seq_lens_cpu, self.device)
            if batch.tree is not None:
                # a tree verify: one table row per token, over its ancestors only (the tree mask)
                assert batch.tree.kv_lens is not None
                token_kv_lens = batch.tree.kv_lens
                page_table = tree_slot_table(self.req_to_token, batch.req_pool_indices[token_rows], batch.tree,
                                             token_kv_lens, self.width)
                token_rows = torch.arange(token_rows.shape[0], device=self.device)
            else:
                page_table = self._slot_table(batch)
                token_kv_lens = extend_token_kv_lens(batch.seq_lens, batch.extend_seq_lens, token_rows)
        swa_page_table = self._swa_table(batch, page_table)
        return TorchNativeMetadata(
            page_table=page_table,
            swa_page_table=swa_page_table,
            token_rows=token_rows,
            token_kv_lens=token_kv_lens,
            out_cache_loc_swa=self.pool.translate_loc_from_full_to_swa(batch.out_cache_loc),
            kv_width=self.width,
            key_pos=self._key_pos,
        )

    def init_graph_state(self, max_bs: int, *, page_table: torch.Tensor | None = None) -> None:
        """``page_table``: a [max_bs, max_context_len] buffer to use as the static page table, a row of the one
        a multi-step draft backend shares among its steps (``TorchNativeBackend.init_draft_cuda_graph_state``)."""
        shape = (max_bs, self.width)
        self._cg_page_table = page_table if page_table is not None else torch.zeros(
            shape, dtype=torch.int64, device=self.device)
        self._cg_swa_page_table = torch.zeros(shape, dtype=torch.int64, device=self.device)
        self._cg_token_rows = torch.arange(max_bs, device=self.device)
        self._cg_swa_loc = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        self._cg_max_bs = max_bs
        self._cg_uniform: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        """per tokens-per-request n > 1: the token rows (arange // n), kv lengths and SWA locations of
        max_bs * n tokens"""

    def static_tensors(self) -> list[torch.Tensor]:
        uniform = [t for shape in self._cg_uniform.values() for t in shape]
        return [self._cg_page_table, self._cg_swa_page_table, self._cg_token_rows, self._cg_swa_loc, self._key_pos,
                *uniform]

    def _uniform_buffers(self, per: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The static token rows, kv lengths and SWA locations of batches of ``per`` tokens per request (the
        one-token shape's are the decode buffers), made at the first capture of that shape, before its graph
        starts, and shared by its buckets."""
        if per == 1:
            return self._cg_token_rows, self._cg_token_rows, self._cg_swa_loc  # kv lengths: the batch's seq_lens
        if per not in self._cg_uniform:
            rows = self._cg_max_bs * per
            self._cg_uniform[per] = (torch.arange(rows, device=self.device) // per,
                                     torch.ones(rows, dtype=torch.int64, device=self.device),
                                     torch.zeros(rows, dtype=torch.int32, device=self.device))
        return self._cg_uniform[per]

    def build_for_graph_capture(self, batch: AttentionBatch) -> TorchNativeMetadata:
        per = batch.graph_tokens_per_request("torch_native")
        token_rows, token_kv_lens, swa_loc = self._uniform_buffers(per)
        self._fill_graph_buffers(batch)
        bs = batch.bs
        kv_width = self.width
        if "baked_scalar" in self.faults:
            # A Python number taken from the capture batch; replay never recomputes it.
            kv_width = max(batch.seq_lens_cpu)
        md = self._graph_metadata[bs] = TorchNativeMetadata(
            page_table=self._cg_page_table[:bs],
            swa_page_table=self._cg_swa_page_table[:bs],
            token_rows=token_rows[: bs * per],
            token_kv_lens=token_kv_lens[: bs * per] if per > 1 else batch.seq_lens,
            out_cache_loc_swa=swa_loc[: bs * per],
            kv_width=kv_width,
            key_pos=self._key_pos,
        )
        return md

    def refresh_for_graph_replay(self, batch: AttentionBatch) -> TorchNativeMetadata:
        self._fill_graph_buffers(batch)
        return self._graph_metadata[batch.bs]

    def _fill_graph_buffers(self, batch: AttentionBatch) -> None:
        bs, num_real, out_cache_loc = batch.bs, batch.num_real, batch.out_cache_loc
        per = batch.graph_tokens_per_request("torch_native")
        page_table = self._slot_table(batch)
        token_rows, token_kv_lens, swa_loc = self._uniform_buffers(per)
        kv_lens = batch.seq_lens
        if per > 1:
            # outside the graph: each token's keys, its request's prefix and the new tokens up to itself
            assert batch.extend_seq_lens is not None
            kv_lens = extend_token_kv_lens(batch.seq_lens, batch.extend_seq_lens, token_rows[: bs * per])
        md = self._graph_metadata.get(bs)
        if "rebind_metadata" in self.faults and md is not None:
            # SGLang PR 26019 review: new tensors bound to the metadata object; the graph keeps reading
            # the static buffers it captured, which still hold whatever they held before.
            md.page_table = page_table
            md.swa_page_table = self._swa_table(batch, page_table)
            md.token_kv_lens = kv_lens.clone()
        else:
            # the static table is translated, as SGLang's backends translate their graph buffers: one storage and
            # one length for every replay of this bucket, which only the memo's invalidation tells apart
            self._cg_page_table[:bs].copy_(page_table)
            self._cg_swa_page_table[:bs].copy_(self._swa_table(batch, self._cg_page_table[:bs]))
            if per > 1:
                token_kv_lens[: bs * per].copy_(kv_lens)
        self._refill_swa_loc(swa_loc, out_cache_loc, num_real * per)


class TorchNativeImpl(AttentionImpl):
    """Dense masked attention over gathered page-table rows; every op can be captured by a graph engine."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        spec = self.model_spec
        self.group = spec.num_heads // spec.num_kv_heads
        self.scale = spec.head_dim**-0.5
        windows = [spec.layer_window(i) for i in range(spec.num_layers)]
        if "window_from_wrong_layer" in self.faults:
            # vLLM PR 51756: per-group metadata built once with the first group's window for every layer.
            windows = [windows[0]] * len(windows)
        self._layer_windows = windows

    def attend(
        self, layer_id: int, q: torch.Tensor, forward_batch: ForwardBatch, metadata: TorchNativeMetadata
    ) -> torch.Tensor:
        md = metadata
        t = q.shape[0]
        width = md.kv_width
        table = self._layer_table(layer_id, md)
        slots = table[:, :width][md.token_rows]
        k_all, v_all = self.pool.read_kv(layer_id, slots, self.dtype)  # [T, W, Hkv, D]
        heads, g, d, w = t * self.num_kv_heads, self.group, self.head_dim, k_all.shape[1]
        qh = q.view(heads, g, d)
        # Contiguous operands: with one token, a permuted (strided) K sends matmul down another GEMM path
        # that rounds differently, and a batch of 1 would no longer match the same row in a padded bucket.
        # bmm on them is the call matmul makes for these 4-D operands, without the expands and views around it.
        k_t = k_all.permute(0, 2, 3, 1).contiguous().view(heads, d, w)
        v_t = v_all.permute(0, 2, 1, 3).contiguous().view(heads, w, d)
        scores = torch.bmm(qh, k_t).view(t, self.num_kv_heads, g, w).float() * self.scale  # [T, Hkv, G, W]
        key_pos = md.key_pos[:width][None, :]
        kv_len = md.token_kv_lens[:, None]
        # the keys a query may not see: the complement of [kv_len - window, kv_len) written out (De Morgan),
        # which saves negating the visible ones
        masked = key_pos >= kv_len
        window = self._layer_windows[layer_id]
        if window is not None:
            masked = masked | (key_pos < kv_len - window)
        scores = scores.masked_fill(masked.view(masked.shape[0], 1, 1, masked.shape[1]), float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if probs.dtype != self.dtype:
            probs = probs.to(self.dtype)
        return torch.bmm(probs.view(heads, g, w), v_t).view(t, -1)  # [T, Hkv*G*D]

    def _layer_table(self, layer_id: int, md: TorchNativeMetadata) -> torch.Tensor:
        """[bs, max_context_len] the slots the layer reads: its pool's page table (SGLang's two pools)."""
        return md.swa_page_table if self.pool.is_swa_layer(layer_id) else md.page_table


class TorchNativeBackend(AttentionBackend):
    """Paged attention in plain torch ops: runs anywhere, and graphs capture uniform batches (decode, verify)
    whole."""

    name = "torch_native"
    # a mixed extend sizes a tensor from Python ints (repeat_interleave with output_size): prefill graphs keep
    # attention an island; a batch of n tokens per request has static token rows, so its graphs capture it
    graph_support = GraphSupport.UNIFORM_BATCH
    devices = frozenset({Device.CPU, Device.CUDA})
    # the kernel gathers token rows through each request's pages, so any page size works; rows are NHD
    page_sizes = None
    kv_layouts = frozenset({KVLayout.NHD})
    known_faults = frozenset({"rebind_metadata", "baked_scalar", "window_from_wrong_layer", "read_page_tail",
                              "fused_fp8_scale_dropped", "verify_without_swa_window", "draft_tree_swa_untranslated",
                              "draft_extend_without_swa_window"})
    draft_trees = True
    builder_cls = TorchNativeMetadataBuilder
    impl_cls = TorchNativeImpl

    def init_draft_cuda_graph_state(self, step_backends: Sequence[AttentionBackend], max_bs: int) -> None:
        """One static page table for every draft step, each step's backend a row of it, as SGLang's multi-step
        draft backends allocate one ``cuda_graph_kv_indices`` buffer and hand step i its row: the steps' tables
        share a storage and a length (the memo's key)."""
        builder = self.builder
        assert isinstance(builder, TorchNativeMetadataBuilder)
        shared = torch.zeros((len(step_backends), max_bs, builder.width), dtype=torch.int64, device=builder.device)
        for step, backend in enumerate(step_backends):
            step_builder = backend.builder
            assert isinstance(step_builder, TorchNativeMetadataBuilder)
            step_builder.init_graph_state(max_bs, page_table=shared[step])

"""An index-gathering attention backend: each token reads only the keys inside its window, as real kernels do.

FlashInfer's and SGLang's triton backends are handed, per request, the list of KV indices to read
(``kv_indptr`` / ``kv_indices``, built from ``req_to_token`` and, for sliding-window layers, translated into
the SWA pool); they never touch a slot outside that list. This backend builds the same lists in torch: for
every new token, the full-pool slots of all its keys (full layers) and the SWA-pool slots of the keys inside
its window (SWA layers, the query's own key included), read through the request's page table (page ids
expanded to slots at ``page_size`` > 1). The kernel gathers exactly those rows; a masked slot (the dummy
slot padded columns point at, the unwritten tail of a last page, an evicted token) is never read, so a NaN
there cannot leak the way ``0 * NaN`` leaks through the dense torch-native kernel.

Shapes stay static so that graphs can capture the kernel: each token's list has a fixed number of lanes per
pool (the window for SWA layers, ``max_context_len`` for full ones) in every mode, which also keeps eager and
graph runs bitwise equal. The real keys fill the head of the list, oldest first; the lanes past them repeat
the newest key (written by the token itself in this layer, just before it attends) and are masked, so even
they read a live slot. Graph runs keep the lists in static buffers sized for the largest bucket (times the tokens each request adds: one for a decode, 1 + draft steps for a verify), refilled in
place outside the graph.

The index-space mistakes of the fault catalog act here, where the real ones lived: the SWA page table left
untranslated (``swa_read_untranslated``), page ids pushed through the token-slot mapping in the graph refill
(``page_ids_translated_as_slots``), and the page translation table sized by SWA pages but indexed by full
page ids (``swa_table_sized_by_swa_pages``). Every read is bounds-checked as a GPU kernel's index assert would
be (``pool.in_bounds``), so an id past its pool is an error that says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..runspec import Device
from ..serving.batch import ForwardBatch
from ..serving.pool import in_bounds
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
    build_page_table,
    extend_token_kv_lens,
    extend_token_rows,
    page_table_slots,
    swa_page_translation,
    translate_pages,
    tree_slot_table,
    tree_swa_slot_table,
)


@dataclass(slots=True, kw_only=True)
class KVGather:
    """What the kernel reads of one pool for every new token of a forward."""

    indices: torch.Tensor
    """[num_tokens, lanes] int64 slots of the pool, the token's in-window keys first (oldest first), the
    newest key repeated in the lanes after them; bounds-checked against the pool where they are built"""
    padding: torch.Tensor
    """[num_tokens, 1, 1, lanes] bool: the lanes past the token's keys, masked out of its softmax"""
    lanes: int
    """columns of ``indices`` the kernel reads"""


@dataclass(slots=True, kw_only=True)
class TorchGatherMetadata:
    full: KVGather
    """the full layers' keys, read from the full pool"""
    swa: KVGather
    """the SWA layers' keys, read from the SWA pool"""
    out_cache_loc_swa: torch.Tensor | None
    """[num_tokens] int32 SWA write locations computed once per forward (the ``metadata`` design)"""


class TorchGatherMetadataBuilder(AttentionMetadataBuilder):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        spec = self.model_spec
        self.width = int(self.req_to_token.shape[1])
        windows = {False: None, True: spec.window}
        if "window_from_wrong_layer" in self.faults:
            # vLLM PR 51756: the lists of every layer are built with the first layer group's window
            windows = dict.fromkeys(windows, spec.layer_window(0))
        self._windows = windows
        self._lanes = {swa: self.width if w is None else min(w, self.width) for swa, w in windows.items()}
        self._lane_ids = {swa: torch.arange(n, device=self.device) for swa, n in self._lanes.items()}
        # every index list is checked against its pool once per forward, as a GPU kernel's index assert would
        # check each read: the lists are the same for every layer of a pool
        self._pools = {swa: (size, f"the {'SWA' if swa else 'full'} pool ({size} slots)")
                       for swa, size in ((True, self.pool.swa_size), (False, self.pool.full_size))}
        self._graph_metadata: dict[int, TorchGatherMetadata] = {}

    # ---- the index lists ------------------------------------------------------------------------------
    def _page_tables(self, batch: AttentionBatch, *, graph: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """[bs, width] full-pool and SWA-pool slot of every position of each request, through its pages."""
        p = batch.page_size
        if batch.tree is not None:
            return self._tree_tables(batch, graph=graph)
        pages = build_page_table(self.req_to_token, batch.req_pool_indices, batch.seq_lens, self.width, page_size=p)
        swa_pages = self._swa_pages(pages, p, graph=graph)
        if swa_window_left_out(batch.forward_mode, self.faults):
            swa_pages = pages  # SGLang PR 29858's family: the window's page table left out of this path
        lens = batch.seq_lens
        if "read_page_tail" in self.faults:
            # vLLM PR 47574's family: the last page expanded whole, its unwritten tail included; the lists
            # below take only positions inside each window, so the tail is never gathered
            lens = (lens + p - 1) // p * p
        return (page_table_slots(pages, lens, self.width, page_size=p),
                page_table_slots(swa_pages, lens, self.width, page_size=p))

    def _tree_tables(self, batch: AttentionBatch, *, graph: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """A tree draft step's or verify's tables: one row per query, its request's keys then its branch's
        (pages of one token, so a slot is its page and ``_swa_pages`` translates it)."""
        tree = batch.tree
        assert tree is not None
        rows = batch.req_pool_indices
        kv_lens = batch.seq_lens
        if not batch.forward_mode.is_decode_like:
            assert tree.kv_lens is not None
            rows, kv_lens = rows[extend_token_rows(batch.extend_seq_lens_cpu, self.device)], tree.kv_lens
        full = tree_slot_table(self.req_to_token, rows, tree, kv_lens, self.width)
        swa = self._swa_pages(full, 1, graph=graph)
        if swa_window_left_out(batch.forward_mode, self.faults):
            swa = full
        return full, tree_swa_slot_table(full, swa, tree, untranslated="draft_tree_swa_untranslated" in self.faults)

    def _swa_pages(self, pages: torch.Tensor, p: int, *, graph: bool) -> torch.Tensor:
        """The SWA page id of every full page id of ``pages`` (0 where evicted): the SWA page table."""
        mapping = self.pool.full_to_swa_index_mapping
        if "swa_read_untranslated" in self.faults:
            return pages  # SGLang PRs 24617, 23984: the full page table handed to the SWA layers as it is
        if graph and "page_ids_translated_as_slots" in self.faults:
            # SGLang PR 38187: the graph refill translates page ids as if they were token slots and never
            # divides by the page size, so SWA token slots come back as page ids (pages of one token hide it)
            return mapping[pages]
        table = swa_page_translation(mapping, self.pool.full_size, page_size=p)
        per = "full"
        if "swa_table_sized_by_swa_pages" in self.faults:
            # SGLang PR 37560: sized by the SWA side's own page count, indexed by the full side's ids
            table, per = table[: self.pool.swa_size // p], "SWA"
        return translate_pages(table, pages, per=per)

    def _gather(self, slot_table: torch.Tensor, token_rows: torch.Tensor | None, kv_lens: torch.Tensor, *,
                swa: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's list of slots of ``slot_table`` inside its window (row ``token_rows[t]``, or row t
        when None), bounds-checked against its pool, and the mask of the lanes past its keys."""
        window, lane = self._windows[swa], self._lane_ids[swa]
        newest = (kv_lens - 1).clamp(min=0).view(-1, 1)
        if window is None:
            start, positions = None, torch.minimum(lane.view(1, -1), newest)
        else:
            start = (kv_lens - window).clamp(min=0)
            positions = torch.minimum(start.view(-1, 1) + lane, newest)
        rows = slot_table if token_rows is None else slot_table[token_rows]
        indices = in_bounds(rows.gather(1, positions), *self._pools[swa])
        counts = kv_lens if start is None else kv_lens - start
        return indices, lane.view(1, 1, 1, -1) >= counts.view(-1, 1, 1, 1)

    def _lists(self, batch: AttentionBatch, token_rows: torch.Tensor | None, kv_lens: torch.Tensor, *,
               graph: bool) -> dict[bool, tuple[torch.Tensor, torch.Tensor]]:
        full_slots, swa_slots = self._page_tables(batch, graph=graph)
        return {False: self._gather(full_slots, token_rows, kv_lens, swa=False),
                True: self._gather(swa_slots, token_rows, kv_lens, swa=True)}

    # ---- eager ----------------------------------------------------------------------------------------
    def build(self, batch: AttentionBatch) -> TorchGatherMetadata:
        token_rows: torch.Tensor | None = None  # a decode-shaped batch: one token per request, in order
        kv_lens = batch.seq_lens
        if batch.tree is not None and not batch.forward_mode.is_decode_like:
            assert batch.tree.kv_lens is not None
            kv_lens = batch.tree.kv_lens  # a tree verify: its tables are one row per token already
        elif not batch.forward_mode.is_decode_like:
            assert batch.extend_seq_lens is not None
            token_rows = extend_token_rows(batch.extend_seq_lens_cpu, self.device)
            kv_lens = extend_token_kv_lens(batch.seq_lens, batch.extend_seq_lens, token_rows)
        lists = self._lists(batch, token_rows, kv_lens, graph=False)
        gathers = {swa: KVGather(indices=indices, padding=padding, lanes=self._lanes[swa])
                   for swa, (indices, padding) in lists.items()}
        return TorchGatherMetadata(full=gathers[False], swa=gathers[True],
                                   out_cache_loc_swa=self.pool.translate_loc_from_full_to_swa(batch.out_cache_loc))

    # ---- graphs ---------------------------------------------------------------------------------------
    def init_graph_state(self, max_bs: int) -> None:
        self._cg_max_bs = max_bs
        self._cg_shapes: dict[int, _GraphLists] = {}
        """per tokens-per-request n: the static lists, masks and SWA locations of max_bs * n tokens (a decode's
        n is 1, a verify's 1 + draft steps), made at the first capture of that shape, before its graph starts"""
        self._graph_lists(1)

    def _graph_lists(self, per: int) -> _GraphLists:
        if per not in self._cg_shapes:
            rows, dev = self._cg_max_bs * per, self.device
            self._cg_shapes[per] = _GraphLists(
                indices={swa: torch.zeros(rows, n, dtype=torch.int64, device=dev) for swa, n in self._lanes.items()},
                padding={swa: torch.ones(rows, 1, 1, n, dtype=torch.bool, device=dev)
                         for swa, n in self._lanes.items()},
                swa_loc=torch.zeros(rows, dtype=torch.int32, device=dev),
                # each token's request: the same for every replay of the shape, so it is static too
                token_rows=torch.arange(rows, device=dev) // per)
        return self._cg_shapes[per]

    def static_tensors(self) -> list[torch.Tensor]:
        return [t for shape in self._cg_shapes.values()
                for t in (*shape.indices.values(), *shape.padding.values(), shape.swa_loc, shape.token_rows)]

    def build_for_graph_capture(self, batch: AttentionBatch) -> TorchGatherMetadata:
        per = batch.graph_tokens_per_request("torch_gather")
        shape = self._graph_lists(per)
        self._fill_graph_buffers(batch)
        t = batch.bs * per
        lanes = dict(self._lanes)
        if "baked_scalar" in self.faults:
            # a Python number taken from the capture batch (every row one token long); replay never recomputes it
            lanes = {swa: min(n, max(batch.seq_lens_cpu)) for swa, n in lanes.items()}
        gathers = {swa: KVGather(indices=shape.indices[swa][:t], padding=shape.padding[swa][:t],
                                 lanes=lanes[swa]) for swa in lanes}
        md = self._graph_metadata[batch.bs] = TorchGatherMetadata(full=gathers[False], swa=gathers[True],
                                                                  out_cache_loc_swa=shape.swa_loc[:t])
        return md

    def refresh_for_graph_replay(self, batch: AttentionBatch) -> TorchGatherMetadata:
        self._fill_graph_buffers(batch)
        return self._graph_metadata[batch.bs]

    def _fill_graph_buffers(self, batch: AttentionBatch) -> None:
        bs, num_real, out_cache_loc = batch.bs, batch.num_real, batch.out_cache_loc
        per = batch.graph_tokens_per_request("torch_gather")
        shape = self._graph_lists(per)
        t = bs * per
        if per == 1:
            lists = self._lists(batch, None, batch.seq_lens, graph=True)
        else:
            # outside the graph: each token's keys, its request's prefix and the new tokens up to itself
            assert batch.extend_seq_lens is not None
            token_rows = shape.token_rows[:t]
            lists = self._lists(batch, token_rows, extend_token_kv_lens(batch.seq_lens, batch.extend_seq_lens,
                                                                        token_rows), graph=True)
        md = self._graph_metadata.get(bs)
        if "rebind_metadata" in self.faults and md is not None:
            # SGLang PR 26019 review: new tensors bound to the metadata object; the graph keeps reading the
            # static buffers it captured, which still hold whatever they held before
            for swa, gather in ((False, md.full), (True, md.swa)):
                gather.indices, gather.padding = lists[swa]
        else:
            for swa, (indices, padding) in lists.items():
                shape.indices[swa][:t].copy_(indices)
                shape.padding[swa][:t].copy_(padding)
        self._refill_swa_loc(shape.swa_loc, out_cache_loc, num_real * per)


@dataclass(slots=True)
class _GraphLists:
    """One graph shape's static buffers (``tokens_per_request`` n): [max_bs * n] rows each."""

    indices: dict[bool, torch.Tensor]
    padding: dict[bool, torch.Tensor]
    swa_loc: torch.Tensor
    token_rows: torch.Tensor


class TorchGatherImpl(AttentionImpl):
    """Attention over the gathered in-window keys only; every op can be captured by a graph engine."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        spec = self.model_spec
        self.group = spec.num_heads // spec.num_kv_heads
        self.scale = spec.head_dim**-0.5

    def attend(
        self, layer_id: int, q: torch.Tensor, forward_batch: ForwardBatch, metadata: TorchGatherMetadata
    ) -> torch.Tensor:
        gather = metadata.swa if self.pool.is_swa_layer(layer_id) else metadata.full
        t, lanes = q.shape[0], gather.lanes
        k_all, v_all = self.pool.read_kv(layer_id, gather.indices[:, :lanes], self.dtype)  # [T, lanes, Hkv, D]
        heads, g, d = t * self.num_kv_heads, self.group, self.head_dim
        qh = q.view(heads, g, d)
        # contiguous operands, as in the torch-native kernel: a strided K sends a one-token product down another
        # GEMM path, and a batch of one would no longer equal the same row of a padded bucket; bmm on them is
        # what matmul would call, without the expands and views it dispatches around it. reshape alone copies
        # only for two tokens or more: for one it returns a strided view (a size-1 dim merges with any stride)
        k_t = k_all.permute(0, 2, 3, 1).reshape(heads, d, lanes).contiguous()
        v_t = v_all.permute(0, 2, 1, 3).reshape(heads, lanes, d).contiguous()
        scores = (torch.bmm(qh, k_t).float() * self.scale).view(t, self.num_kv_heads, g, lanes)
        scores = scores.masked_fill(gather.padding[..., :lanes], float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(self.dtype)
        return torch.bmm(probs.view(heads, g, lanes), v_t).view(t, -1)


class TorchGatherBackend(AttentionBackend):
    """Index-gathering attention in plain torch ops: runs anywhere, and graphs capture uniform batches whole (a
    decode, a target verify, a draft-extend of one length)."""

    name = "torch_gather"
    # graphs capture batches whose requests all add the same number of tokens (a decode, a target verify, a
    # draft-extend of one length): their token rows are static; a mixed extend's are sized from Python ints
    # (repeat_interleave with output_size), so prefill graphs keep attention an island
    graph_support = GraphSupport.UNIFORM_BATCH
    devices = frozenset({Device.CPU, Device.CUDA})
    # page ids are expanded to token slots before the gather, so any page size works; rows are NHD
    page_sizes = None
    kv_layouts = frozenset({KVLayout.NHD})
    known_faults = frozenset({"rebind_metadata", "baked_scalar", "window_from_wrong_layer", "read_page_tail",
                              "swa_read_untranslated", "page_ids_translated_as_slots",
                              "swa_table_sized_by_swa_pages", "fused_fp8_scale_dropped", "verify_without_swa_window",
                              "draft_tree_swa_untranslated", "draft_extend_without_swa_window"})
    draft_trees = True
    builder_cls = TorchGatherMetadataBuilder
    impl_cls = TorchGatherImpl

"""A torch-native paged attention backend with SGLang's backend interface.

Declaration, metadata builder and implementation are kept apart (vLLM's split): the builder is the part
that differs between an eager step (``init_forward_metadata`` builds fresh tensors), graph capture
(``init_forward_metadata_capture_cuda_graph`` points the metadata at static buffers) and replay
(``init_forward_metadata_replay_cuda_graph`` refreshes those buffers in place, outside the graph).

The kernel reads a whole page-table row per token, ``max_context_len`` wide in every mode, and masks by
kv length and window. The fixed width keeps eager and graph runs bitwise equal; the masking is dense
SDPA-with-a-mask semantics: a masked key still contributes ``0 * value``, so a NaN planted in a slot that
masked columns point at (the dummy slot) leaks, as NaN from padded rows did in vLLM PR 38436.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection

import torch

from ..serving.batch import ForwardBatch, ForwardMode
from ..serving.designs import SWALocDesign
from ..serving.model import ModelSpec
from ..serving.pool import HybridSWAKVPool, quantize_fp8
from .page_table import build_page_table, extend_token_kv_lens, extend_token_rows

KV_WRITE_PATHS = ("plain", "fused_fp8")

BACKEND_FAULTS = frozenset({"rebind_metadata", "baked_scalar", "window_from_wrong_layer"})


@dataclass(slots=True, kw_only=True)
class TorchNativeMetadata:
    page_table: torch.Tensor
    """[bs, max_context_len] int64 full-pool slots, 0 past each request's length"""
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


class TorchNativeBackend:
    """Paged attention in plain torch ops; every tensor op here can be captured by a graph engine."""

    name = "torch_native"

    def __init__(
        self,
        *,
        model_spec: ModelSpec,
        pool: HybridSWAKVPool,
        req_to_token: torch.Tensor,
        design: SWALocDesign,
        kv_write: str = "plain",
        faults: Collection[str] = (),
    ) -> None:
        if kv_write not in KV_WRITE_PATHS:
            raise ValueError(f"kv_write must be one of {KV_WRITE_PATHS}, got {kv_write!r}")
        if kv_write == "fused_fp8" and pool.kv_dtype != "fp8_e4m3":
            raise ValueError(f"the fused FP8 KV write needs an fp8_e4m3 pool, not {pool.kv_dtype}")
        self.model_spec = model_spec
        self.pool = pool
        self.req_to_token = req_to_token
        self.design = design
        self.kv_write = kv_write
        self.faults = frozenset(faults) & BACKEND_FAULTS
        self.width = int(req_to_token.shape[1])
        self.device = pool.device
        self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[model_spec.dtype]
        self.num_kv_heads = model_spec.num_kv_heads
        self.group = model_spec.num_heads // model_spec.num_kv_heads
        self.head_dim = model_spec.head_dim
        self.scale = model_spec.head_dim**-0.5
        self._key_pos = torch.arange(self.width, device=self.device)
        windows = [model_spec.layer_window(i) for i in range(model_spec.num_layers)]
        if "window_from_wrong_layer" in self.faults:
            # vLLM PR 51756: per-group metadata built once with the first group's window for every layer.
            windows = [windows[0]] * len(windows)
        self._layer_windows = windows
        self.forward_metadata: TorchNativeMetadata | None = None
        self._graph_metadata: dict[int, TorchNativeMetadata] = {}

    # ---- metadata builder: eager ---------------------------------------------------------------------
    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        """Fresh metadata for one eager forward."""
        fb = forward_batch
        page_table = build_page_table(fb.req_to_token, fb.req_pool_indices, fb.seq_lens, self.width)
        if fb.forward_mode.is_decode_like:
            token_rows = torch.arange(fb.batch_size, device=self.device)
            token_kv_lens = fb.seq_lens
        else:
            token_rows = extend_token_rows(fb.extend_seq_lens_cpu, self.device)
            token_kv_lens = extend_token_kv_lens(fb.seq_lens, fb.extend_seq_lens, token_rows)
        self.forward_metadata = TorchNativeMetadata(
            page_table=page_table,
            swa_page_table=self.pool.translate_loc_from_full_to_swa(page_table).long(),
            token_rows=token_rows,
            token_kv_lens=token_kv_lens,
            out_cache_loc_swa=self.pool.translate_loc_from_full_to_swa(fb.out_cache_loc),
            kv_width=self.width,
        )

    # ---- metadata builder: decode graphs -------------------------------------------------------------
    def init_cuda_graph_state(self, max_bs: int) -> None:
        """Static metadata buffers shared by every captured batch size."""
        shape = (max_bs, self.width)
        self._cg_page_table = torch.zeros(shape, dtype=torch.int64, device=self.device)
        self._cg_swa_page_table = torch.zeros(shape, dtype=torch.int64, device=self.device)
        self._cg_token_rows = torch.arange(max_bs, device=self.device)
        self._cg_swa_loc = torch.zeros(max_bs, dtype=torch.int32, device=self.device)

    def graph_static_tensors(self) -> list[torch.Tensor]:
        return [self._cg_page_table, self._cg_swa_page_table, self._cg_token_rows, self._cg_swa_loc, self._key_pos]

    def init_forward_metadata_capture_cuda_graph(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        out_cache_loc: torch.Tensor,
        forward_mode: ForwardMode,
    ) -> None:
        """Point the metadata at views of the static buffers, filled for the capture batch."""
        self._fill_graph_buffers(bs, bs, req_pool_indices, seq_lens, out_cache_loc)
        kv_width = self.width
        if "baked_scalar" in self.faults:
            # A Python number taken from the capture batch; replay never recomputes it.
            kv_width = int(seq_lens[:bs].max())
        self.forward_metadata = self._graph_metadata[bs] = TorchNativeMetadata(
            page_table=self._cg_page_table[:bs],
            swa_page_table=self._cg_swa_page_table[:bs],
            token_rows=self._cg_token_rows[:bs],
            token_kv_lens=seq_lens[:bs],
            out_cache_loc_swa=self._cg_swa_loc[:bs],
            kv_width=kv_width,
        )

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        num_real: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        out_cache_loc: torch.Tensor,
        forward_mode: ForwardMode,
    ) -> None:
        """Refresh the static buffers for the batch about to replay the ``bs`` graph (runs outside it)."""
        # eager steps in between rebound forward_metadata; the graph's own object comes back
        self.forward_metadata = self._graph_metadata[bs]
        self._fill_graph_buffers(bs, num_real, req_pool_indices, seq_lens, out_cache_loc)

    def _fill_graph_buffers(
        self, bs: int, num_real: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, out_cache_loc: torch.Tensor
    ) -> None:
        page_table = build_page_table(self.req_to_token, req_pool_indices[:bs], seq_lens[:bs], self.width)
        swa_page_table = self.pool.translate_loc_from_full_to_swa(page_table).long()
        md = self._graph_metadata.get(bs)
        if "rebind_metadata" in self.faults and md is not None:
            # SGLang PR 26019 review: new tensors bound to the metadata object; the graph keeps reading
            # the static buffers it captured, which still hold whatever they held before.
            md.page_table = page_table
            md.swa_page_table = swa_page_table
            md.token_kv_lens = seq_lens[:bs].clone()
        else:
            self._cg_page_table[:bs].copy_(page_table)
            self._cg_swa_page_table[:bs].copy_(swa_page_table)
        # The persistent SWA-location buffer of the ``metadata`` design: refilled outside the graph, its
        # padded tail zeroed so padded rows write to the dummy slot (PR 27617's answer to PR 24743).
        self._cg_swa_loc[:num_real].copy_(self.pool.translate_loc_from_full_to_swa(out_cache_loc[:num_real]))
        self._cg_swa_loc[num_real:].zero_()

    # ---- implementation ------------------------------------------------------------------------------
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        if forward_batch.forward_mode.is_decode_like:
            return self.forward_decode(q, k, v, layer_id, forward_batch)
        return self.forward_extend(q, k, v, layer_id, forward_batch)

    def forward_extend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """New tokens on top of a cached prefix: causal within the batch, windowed in SWA layers."""
        self._write_kv(layer_id, forward_batch, k, v)
        return self._attend(layer_id, q)

    def forward_decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        self._write_kv(layer_id, forward_batch, k, v)
        return self._attend(layer_id, q)

    def _get_layer_cache_loc(self, layer_id: int, forward_batch: ForwardBatch) -> torch.Tensor:
        """Where this layer writes: ``out_cache_loc`` for full layers, the active design's rule for SWA."""
        if not self.pool.is_swa_layer(layer_id):
            return forward_batch.out_cache_loc
        assert self.forward_metadata is not None
        return self.design(forward_batch, self.pool, self.forward_metadata)

    def _write_kv(self, layer_id: int, forward_batch: ForwardBatch, k: torch.Tensor, v: torch.Tensor) -> None:
        t = k.shape[0]
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        loc = self._get_layer_cache_loc(layer_id, forward_batch)
        if self.kv_write == "fused_fp8":
            self._fused_fp8_set_kv_buffer(layer_id, loc, k, v)
        else:
            self.pool.set_kv_buffer(layer_id, loc, k, v)

    def _fused_fp8_set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Quantize with the layer's scales and store the bytes in one step, as TRT-LLM's fused write does."""
        k_scale, v_scale = self.pool.kv_scales[layer_id]
        k_buf, v_buf = self.pool.get_kv_buffer(layer_id)
        k_buf[loc] = quantize_fp8(k, k_scale)
        v_buf[loc] = quantize_fp8(v, v_scale)

    def _attend(self, layer_id: int, q: torch.Tensor) -> torch.Tensor:
        md = self.forward_metadata
        assert md is not None
        t = q.shape[0]
        width = md.kv_width
        table = md.swa_page_table if self.pool.is_swa_layer(layer_id) else md.page_table
        slots = table[:, :width][md.token_rows]
        k_all, v_all = self.pool.read_kv(layer_id, slots, self.dtype)  # [T, W, Hkv, D]
        qh = q.view(t, self.num_kv_heads, self.group, self.head_dim)
        # Contiguous operands: with one token, a permuted (strided) K sends matmul down another GEMM path
        # that rounds differently, and a batch of 1 would no longer match the same row in a padded bucket.
        k_t = k_all.permute(0, 2, 3, 1).contiguous()
        v_t = v_all.permute(0, 2, 1, 3).contiguous()
        scores = torch.matmul(qh, k_t).float() * self.scale  # [T, Hkv, G, W]
        key_pos = self._key_pos[:width][None, :]
        kv_len = md.token_kv_lens[:, None]
        valid = key_pos < kv_len
        window = self._layer_windows[layer_id]
        if window is not None:
            valid = valid & (key_pos >= kv_len - window)
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(self.dtype)
        out = torch.matmul(probs, v_t)  # [T, Hkv, G, D]
        return out.reshape(t, -1)

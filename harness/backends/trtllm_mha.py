"""The TRT-LLM MHA backend: SGLang's ``trtllm_mha`` (the backend PR 24138 fixed), on FlashInfer's TRT-LLM kernels.

Decode-shaped forwards run ``flashinfer.decode.trtllm_batch_decode_with_kv_cache``, which reads page tables
rather than CSR lists: per window group a ``[bs, pages]`` table of page ids of that group's pool (full-pool
pages for the full layers; for the sliding-window layers the same pages translated to the SWA pool, page id
through the token-slot mapping at the page's first slot, as SGLang PR 16267 fixed), ``seq_lens`` per request
and ``window_left = W - 1``. Entries past a request's last page, and every entry of a graph batch's padding
rows (one token each, ``pad_seq_len``), point at page 0, the dummy page, so the kernel never reads past a
pool. ``max_seq_len`` is the request table's width, fixed at start: a kv width taken from a batch would be
frozen into a graph at capture (TensorRT-LLM PR 18769).

Extend batches go through FlashInfer's paged prefill wrapper (the flashinfer backend's builder and
implementation): the TRT-LLM context kernel needs SM100, and on SM90 SGLang runs prefill on FlashInfer's
wrapper too; here every architecture does, so the backend needs SM90 or newer (the decode kernel: the XQA
path on SM90, trtllm-gen on SM100) and pages of 16, 32 or 64 tokens.

Every decode call is the ``torch.library`` op below, whose CPU kernel is a dense stand-in over the same page
tables, so the builders, the op and the graph path are tested without a GPU; the backend declares CUDA only
and imports FlashInfer only inside the op's CUDA kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..runspec import Device
from ..serving.batch import ForwardBatch
from .base import AttentionBackend, AttentionBatch, GraphSupport, KVLayout
from .dense_attention import grouped_decode_attention
from .flashinfer import FlashInferImpl, FlashInferMetadata, FlashInferMetadataBuilder, kernel_problems
from .flashinfer import missing_requirements as flashinfer_requirements
from .page_table import build_page_table, swa_page_translation, translate_pages

OP_NAME = "harness_trtllm::paged_decode"
_WORKSPACE_BYTES = 128 << 20
"""the decode kernel's scratch and semaphores; it must be zero before its first use, so it is its own buffer
and never shared with the prefill wrappers' workspace"""
_MIN_CAPABILITY = (9, 0)
PAGE_SIZES = frozenset({16, 32, 64})
"""the page sizes the TRT-LLM kernels take (SGLang's trtllm_mha refuses others)"""

_LIB = torch.library.Library("harness_trtllm", "DEF")
_LIB.define(
    "paged_decode(Tensor(a!) out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor seq_lens, "
    "Tensor workspace, int max_seq_len, int window_left, float bmm1_scale, float bmm2_scale) -> ()")


def dense_paged_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, *, max_seq_len: int, window_left: int, bmm1_scale: float, bmm2_scale: float,
) -> torch.Tensor:
    """[bs, Hq, D] the TRT-LLM decode kernel's attention in dense torch ops: each request's one query (its
    last token) over the keys its page table names, inside ``window_left``; static shapes, so graphs capture it."""
    head_dim = q.shape[2]
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    lane = torch.arange(max_seq_len, device=q.device)
    pages = block_tables.long()[:, (lane // page_size).clamp(max=block_tables.shape[1] - 1)]
    slots = pages * page_size + lane % page_size  # [bs, lanes]
    lens = seq_lens.long()[:, None]
    valid = lane[None, :] < lens
    if window_left >= 0:
        valid = valid & (lane[None, :] >= lens - 1 - window_left)
    k = k_cache.reshape(-1, num_kv_heads, head_dim)[slots]
    v = v_cache.reshape(-1, num_kv_heads, head_dim)[slots]
    return grouped_decode_attention(q, k, v, valid, scale=bmm1_scale, out_scale=bmm2_scale).to(q.dtype)


def _stand_in_kernel(out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor, workspace: torch.Tensor, max_seq_len: int,
                     window_left: int, bmm1_scale: float, bmm2_scale: float) -> None:
    out.copy_(dense_paged_decode(q, k_cache, v_cache, block_tables, seq_lens, max_seq_len=max_seq_len,
                                 window_left=window_left, bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale))


def _trtllm_kernel(out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   block_tables: torch.Tensor, seq_lens: torch.Tensor, workspace: torch.Tensor, max_seq_len: int,
                   window_left: int, bmm1_scale: float, bmm2_scale: float) -> None:
    from flashinfer.decode import trtllm_batch_decode_with_kv_cache  # the optional extra, on a GPU only

    # the pool's pages are [page, token, kv head, dim]: NHD, which the kernel takes by name (it views them
    # as HND itself); K's dequantization scale rides in bmm1_scale and V's in bmm2_scale, inside the kernel
    trtllm_batch_decode_with_kv_cache(
        query=q, kv_cache=(k_cache, v_cache), workspace_buffer=workspace, block_tables=block_tables,
        seq_lens=seq_lens, max_seq_len=max_seq_len, bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale,
        window_left=window_left, out=out, kv_layout="NHD")


def _meta_kernel(*args: Any) -> None:
    return None


_LIB.impl("paged_decode", _stand_in_kernel, "CPU")
_LIB.impl("paged_decode", _trtllm_kernel, "CUDA")
_LIB.impl("paged_decode", _meta_kernel, "Meta")
paged_decode = torch.ops.harness_trtllm.paged_decode.default


@dataclass(slots=True, kw_only=True)
class TrtllmDecodeMetadata:
    """One decode-shaped forward's page tables, by window group (``window_groups``)."""

    page_tables: tuple[torch.Tensor, ...]
    """[bs, pages] int32 page ids of the group's pool, 0 (the dummy page) past each request's pages"""
    window_left: tuple[int, ...]
    seq_lens: torch.Tensor
    """[bs] int32 keys of each request, its new token included"""
    max_seq_len: int
    workspace: torch.Tensor
    out_cache_loc_swa: torch.Tensor | None
    """[num_tokens] int32 SWA write locations computed once per forward (the ``metadata`` design)"""


class TrtllmMHAMetadataBuilder(FlashInferMetadataBuilder):
    """Page tables for decode-shaped forwards; FlashInfer's prefill lists (the parent's) for extend batches."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.pages_per_request = -(-self.width // self.pool.page_size)
        on_gpu = self.device.type == Device.CUDA
        self._workspace = torch.zeros(_WORKSPACE_BYTES if on_gpu else 0, dtype=torch.uint8, device=self.device)
        self._graph_decode: dict[int, TrtllmDecodeMetadata] = {}

    def page_tables(self, batch: AttentionBatch) -> tuple[torch.Tensor, ...]:
        """[bs, pages] int32 page ids per window group: the full pool's pages, or those pages in the SWA pool."""
        p = batch.page_size
        full = build_page_table(self.req_to_token, batch.req_pool_indices, batch.seq_lens, self.width, page_size=p)
        swa = None
        out = []
        for group in self.groups:
            if group.swa and swa is None:
                mapping = self.pool.full_to_swa_index_mapping
                swa = translate_pages(swa_page_translation(mapping, self.pool.full_size, page_size=p), full)
            out.append((swa if group.swa else full).to(torch.int32))
        return tuple(out)

    def build(self, batch: AttentionBatch) -> TrtllmDecodeMetadata | FlashInferMetadata:
        if not batch.forward_mode.is_decode_like:
            return super().build(batch)
        return TrtllmDecodeMetadata(
            page_tables=self.page_tables(batch), window_left=tuple(g.window_left for g in self.groups),
            seq_lens=batch.seq_lens.to(torch.int32), max_seq_len=self.width, workspace=self._workspace,
            out_cache_loc_swa=self.pool.translate_loc_from_full_to_swa(batch.out_cache_loc))

    # ---- graphs: decode only (GraphSupport.DECODE_ONLY); prefill graphs keep attention an eager island -------
    def init_graph_state(self, max_bs: int) -> None:
        dev = self.device
        self._cg_tables = tuple(torch.zeros(max_bs, self.pages_per_request, dtype=torch.int32, device=dev)
                                for _ in self.groups)
        self._cg_seq_lens = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self._cg_swa_loc = torch.zeros(max_bs, dtype=torch.int32, device=dev)

    def static_tensors(self) -> list[torch.Tensor]:
        return [*self._cg_tables, self._cg_seq_lens, self._cg_swa_loc, *([self._workspace] if self._workspace.numel()
                                                                          else [])]

    def build_for_graph_capture(self, batch: AttentionBatch) -> TrtllmDecodeMetadata:
        bs = batch.bs
        self._fill_graph_tables(batch)
        md = self._graph_decode[bs] = TrtllmDecodeMetadata(
            page_tables=tuple(t[:bs] for t in self._cg_tables), window_left=tuple(g.window_left for g in self.groups),
            seq_lens=self._cg_seq_lens[:bs], max_seq_len=self.width, workspace=self._workspace,
            out_cache_loc_swa=self._cg_swa_loc[:bs])
        return md

    def refresh_for_graph_replay(self, batch: AttentionBatch) -> TrtllmDecodeMetadata:
        self._fill_graph_tables(batch)
        return self._graph_decode[batch.bs]

    def _fill_graph_tables(self, batch: AttentionBatch) -> None:
        """Copy the batch's page tables and lengths into the static buffers, outside the graph."""
        bs = batch.bs
        for static, table in zip(self._cg_tables, self.page_tables(batch), strict=True):
            static[:bs].copy_(table)
        self._cg_seq_lens[:bs].copy_(batch.seq_lens)
        self._refill_swa_loc(self._cg_swa_loc, batch.out_cache_loc, batch.num_real)


class TrtllmMHAImpl(FlashInferImpl):
    """Decode through the TRT-LLM decode op; extend batches through FlashInfer's prefill (the parent's)."""

    def attend(self, layer_id: int, q: torch.Tensor, forward_batch: ForwardBatch,
               metadata: TrtllmDecodeMetadata | FlashInferMetadata) -> torch.Tensor:
        if isinstance(metadata, FlashInferMetadata):
            return super().attend(layer_id, q, forward_batch, metadata)
        md = metadata
        group = self._group_of[layer_id]
        k_buf, v_buf = self.pool.get_kv_buffer(layer_id)
        k_scale, v_scale = self.pool.kv_scales[layer_id] if self._fp8 else (1.0, 1.0)
        t = q.shape[0]
        q3 = q.view(t, self.num_heads, self.head_dim)
        out = torch.empty_like(q3)
        paged_decode(out, q3, self._pages(k_buf), self._pages(v_buf), md.page_tables[group], md.seq_lens,
                     md.workspace, md.max_seq_len, md.window_left[group], self.scale * float(k_scale), float(v_scale))
        return out.view(t, -1)


def missing_requirements() -> tuple[str, ...]:
    """What this machine lacks to run the TRT-LLM decode kernel; empty when it has it."""
    out = list(flashinfer_requirements("trtllm_mha"))
    if not torch.cuda.is_available():
        return tuple(out)
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < _MIN_CAPABILITY:
        out.append(f"backend trtllm_mha needs an SM90 (Hopper) or newer GPU for FlashInfer's TRT-LLM decode "
                   f"kernel; {torch.cuda.get_device_name()} is sm_{major}{minor}")
    return tuple(out)


class TrtllmMHABackend(AttentionBackend):
    """FlashInfer's TRT-LLM decode kernel on page tables, FlashInfer's paged prefill; CUDA on SM90 and newer."""

    name = "trtllm_mha"
    graph_support = GraphSupport.DECODE_ONLY
    devices = frozenset({Device.CUDA})
    page_sizes = PAGE_SIZES
    kv_layouts = frozenset({KVLayout.NHD})
    known_faults = frozenset()
    pad_seq_len = 1
    builder_cls = TrtllmMHAMetadataBuilder
    impl_cls = TrtllmMHAImpl

    @classmethod
    def unsupported(cls, **case) -> tuple[str, ...]:
        """The declaration's reasons, the model and pool the kernels cannot take, and what this machine lacks
        (FlashInfer, a GPU, an SM90 or newer one)."""
        model = case.get("model")
        kernels = () if model is None else kernel_problems(model, case.get("kv_dtype", "float32"), backend=cls.name)
        return (*super().unsupported(**case), *kernels, *missing_requirements())

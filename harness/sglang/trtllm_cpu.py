"""SGLang's ``TRTLLMHAAttnBackend`` (0.5.23) built and run on a CPU: what its module needs from CUDA, served at
the narrowest point.

The backend is SGLang's, constructed and driven unchanged: ``__init__``, ``init_cuda_graph_state``,
``init_forward_metadata`` (eager), ``init_forward_metadata_out_graph`` / ``_in_graph`` (capture and replay, through
``_build_cuda_graph_metadata`` and ``_apply_cuda_graph_metadata``), ``_get_layer_page_table``, ``forward_decode`` /
``forward_extend`` and their KV writes (``SWAKVPool.set_kv_buffer(KVWriteLoc.for_batch(...,
swa_loc=forward_metadata.swa_out_cache_loc))``; in 0.5.23 ``_get_layer_cache_loc`` serves only the fused FP8
write, and FP8 pools are not expressible through the adapter).
``trtllm_on_cpu()`` binds, while a run is active, only what its module cannot have without CUDA:

* **SGLang's two Triton kernels run as SGLang wrote them, in Triton's interpreter.** The metadata the backend
  builds on the device (``update_trtllm_mha_graph_metadata``: cache_seqlens, cu_seqlens_k, the page table, the
  SWA page table and the SWA write ids, recorded in the graph; ``build_trtllm_mha_page_table``: the eager page
  tables) comes from SGLang's own ``@triton.jit`` kernels, each launched through SGLang's own wrapper with the
  kernel swapped for ``triton.runtime.interpreter.InterpretedFunction`` of the same function. Each launch is a
  ``torch.library`` op (``harness_sglang::...``) whose CPU kernel runs the interpreter out of sight of any
  dispatch mode: on the tape it is recorded as one opaque op and called again at every replay, as a CUDA graph
  relaunches the kernel.
* **FlashInfer's two TRT-LLM attention calls** (``flashinfer.decode.trtllm_batch_decode_with_kv_cache``,
  ``flashinfer.prefill.trtllm_batch_context_with_kv_cache``, the ones the backend calls off SM90/SM120) are the
  harness's functions of the same keyword signature, computing paged attention over the page table (or SWA
  page table) the backend hands them, in the backend's HND layout; the decode one has static shapes (the
  harness's ``dense_paged_decode``), so it captures, and serves a target verify's ``q_len_per_req`` queries per
  request (``target_verify.py``) by the TRT-LLM-GEN rule, each query over its keys up to its own position.
* **One device query**: ``trtllm_mla_backend._multi_ctas_kv_counter_bytes`` (FlashInfer's SM count and counter
  size, sizing the decode kernel's multi-CTA counter buffer at construction) answers ``COUNTER_BYTES``.
* **FlashInfer's wrapper classes** (``BatchPrefillWithRaggedKVCacheWrapper``, ``BatchPrefillWithPagedKVCacheWrapper``,
  ``BatchDecodeWithPagedKVCacheWrapper``), which ``FlashInferAttnBackend.__init__`` constructs and the TRT-LLM
  paths never call: a class that takes the constructor's arguments and refuses every use, naming itself.

Nothing else is patched: ``get_platform()`` reports no SM90/SM100/SM120 on a CPU, so the backend takes its
TRT-LLM-GEN branches (decode through ``trtllm_batch_decode_with_kv_cache``, prefill through
``trtllm_batch_context_with_kv_cache``), as on SM100.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ..backends.trtllm_mha import dense_paged_decode
from .installed import load
from .triton_interpreter import interpreted

_LIB = torch.library.Library("harness_sglang", "DEF")
_LIB.define(
    "trtllm_mha_graph_metadata(Tensor req_pool_indices, Tensor seq_lens, Tensor req_to_token, "
    "Tensor(a!) cache_seqlens, Tensor(b!) cu_seqlens_k, Tensor(c!)? page_table, int bs, int seqlen_offset, "
    "int max_seq_pages, int page_size, Tensor? swa_mapping, Tensor(d!)? swa_page_table, Tensor? out_cache_loc, "
    "Tensor(e!)? swa_out_cache_loc, Tensor(f!)? cu_seqlens_q, Tensor? qlens, int q_stride, int q_mode, "
    "bool skip_page_table) -> ()")
_LIB.define(
    "trtllm_mha_page_table(Tensor req_to_token, Tensor req_pool_indices, Tensor cache_seqlens, "
    "Tensor(a!) page_table, int page_size, Tensor(b!)? swa_page_table, Tensor? full_to_swa) -> ()")

_GRAPH_METADATA_ARGS = ("req_pool_indices", "seq_lens", "req_to_token", "cache_seqlens", "cu_seqlens_k",
                        "page_table", "bs", "seqlen_offset", "max_seq_pages", "page_size", "swa_mapping",
                        "swa_page_table", "out_cache_loc", "swa_out_cache_loc", "cu_seqlens_q", "qlens",
                        "q_stride", "q_mode", "skip_page_table")
_PAGE_TABLE_ARGS = ("req_to_token", "req_pool_indices", "cache_seqlens", "page_table", "page_size",
                    "swa_page_table", "full_to_swa")


def _graph_metadata_kernel(*args: Any) -> None:
    from sglang.kernels.ops.attention import trtllm_mha_graph_metadata as module

    # no dispatch mode sees the interpreter's memory traffic: the tape records the op, not its body
    with _disable_current_modes(), interpreted(module, "update_trtllm_mha_graph_metadata_kernel"):
        module.update_trtllm_mha_graph_metadata(**dict(zip(_GRAPH_METADATA_ARGS, args)))


def _page_table_kernel(*args: Any) -> None:
    from sglang.kernels.ops.attention import trtllm_mha_page_table as module

    with _disable_current_modes(), interpreted(module, "create_trtllm_mha_kv_indices_triton"):
        module.build_trtllm_mha_page_table(**dict(zip(_PAGE_TABLE_ARGS, args)))


def _no_output(*args: Any) -> None:
    return None


_LIB.impl("trtllm_mha_graph_metadata", _graph_metadata_kernel, "CPU")
_LIB.impl("trtllm_mha_graph_metadata", _no_output, "Meta")
_LIB.impl("trtllm_mha_page_table", _page_table_kernel, "CPU")
_LIB.impl("trtllm_mha_page_table", _no_output, "Meta")


def update_trtllm_mha_graph_metadata(**kwargs: Any) -> None:
    """SGLang's ``update_trtllm_mha_graph_metadata`` (keyword call, its defaults), launched as one op."""
    defaults = {"swa_mapping": None, "swa_page_table": None, "out_cache_loc": None, "swa_out_cache_loc": None,
                "cu_seqlens_q": None, "qlens": None, "q_stride": 0, "q_mode": 0, "skip_page_table": False}
    merged = {**defaults, **kwargs}
    torch.ops.harness_sglang.trtllm_mha_graph_metadata(*(merged[name] for name in _GRAPH_METADATA_ARGS))


def build_trtllm_mha_page_table(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                                cache_seqlens: torch.Tensor, page_table: torch.Tensor, page_size: int,
                                swa_page_table: torch.Tensor | None = None,
                                full_to_swa: torch.Tensor | None = None) -> None:
    """SGLang's ``build_trtllm_mha_page_table``, launched as one op."""
    torch.ops.harness_sglang.trtllm_mha_page_table(req_to_token, req_pool_indices, cache_seqlens, page_table,
                                                   page_size, swa_page_table, full_to_swa)


# ---- FlashInfer's TRT-LLM attention calls --------------------------------------------------------------

class NotOnCPU(NotImplementedError):
    """A FlashInfer feature the CPU stand-ins do not serve, refused by name rather than computed wrongly: a run
    that reaches one fails with this error, never a silent difference (docs/sglang-graphs.md lists them)."""


def _refuse_extras(name: str, **extras: Any) -> None:
    used = [key for key, value in extras.items() if value is not None]
    if used:
        raise NotOnCPU(f"{name} stand-in: {', '.join(used)} not supported on the CPU (attention sinks, "
                                  "FP4 scales, speculative masks are not adapted)")


def _nhd(kv_cache: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The backend hands ``(k, v)`` as ``[pages, heads, page_size, dim]`` views of the pool (HND)."""
    k, v = kv_cache
    return k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)


def trtllm_batch_decode_with_kv_cache(
    *, query: torch.Tensor, kv_cache: Any, workspace_buffer: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, max_seq_len: int, bmm1_scale: float, bmm2_scale: float, window_left: int = -1,
    sinks: Any = None, out: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
    kv_cache_sf: Any = None, q_len_per_req: int | None = 1, mask: Any = None, max_q_len: Any = None,
    cum_seq_lens_q: Any = None, skip_softmax_threshold_scale_factor: Any = None,
    multi_ctas_kv_counter_buffer: Any = None,
) -> torch.Tensor:
    """``q_len_per_req`` queries per request (the last ``q_len_per_req`` of its ``seq_lens`` keys, a target
    verify's: the TRT-LLM-GEN kernel's causal-within-draft rule, each query over the keys up to its own position)
    over the keys ``block_tables`` names, inside ``window_left`` of each query (static shapes). The ragged
    (``q_len_per_req=None``) and masked (XQA's spec-decode mask) forms are refused."""
    _refuse_extras("trtllm_batch_decode_with_kv_cache", sinks=sinks, kv_cache_sf=kv_cache_sf, mask=mask,
                   cum_seq_lens_q=cum_seq_lens_q, skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor)
    if q_len_per_req is None or q_len_per_req < 1:
        raise NotOnCPU("trtllm_batch_decode_with_kv_cache stand-in: a fixed q_len_per_req only (no ragged verify)")
    if q_len_per_req > 1:
        # one decode row per query: query j of a request sees its keys up to position seq_len - q_len + j
        offsets = torch.arange(q_len_per_req, device=seq_lens.device) - (q_len_per_req - 1)
        seq_lens = (seq_lens[:, None] + offsets[None, :]).reshape(-1)
        block_tables = block_tables.repeat_interleave(q_len_per_req, dim=0)
    k, v = _nhd(kv_cache)
    # the kernel reads a row only up to its seq_len: past it the backend's tables hold whatever their memory held
    # (torch.empty eagerly, an earlier batch's pages in a graph), and an SWA page out of the window may be -1
    page_size = k.shape[1]
    live = torch.arange(block_tables.shape[1], device=block_tables.device)[None, :] < \
        (seq_lens[:, None] + page_size - 1) // page_size
    block_tables = torch.where(live & (block_tables >= 0), block_tables, torch.zeros_like(block_tables))
    o = dense_paged_decode(query, k, v, block_tables, seq_lens, max_seq_len=max_seq_len, window_left=window_left,
                           bmm1_scale=float(bmm1_scale), bmm2_scale=float(bmm2_scale))
    if out is None:
        return o.to(out_dtype or query.dtype)
    out.copy_(o)
    return out


def trtllm_batch_context_with_kv_cache(
    *, query: torch.Tensor, kv_cache: Any, workspace_buffer: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, max_q_len: int, max_kv_len: int, bmm1_scale: float, bmm2_scale: float, batch_size: int,
    cum_seq_lens_q: torch.Tensor, cum_seq_lens_kv: torch.Tensor, window_left: int = -1, sinks: Any = None,
    out: torch.Tensor | None = None, out_dtype: torch.dtype | None = None, kv_cache_sf: Any = None,
    causal: bool = True, skip_softmax_threshold_scale_factor: Any = None,
) -> torch.Tensor:
    """Each request's new tokens (the last ``q_len`` of its ``seq_len`` keys, in the pool already) over its
    keys through ``block_tables``: causal, inside ``window_left``. Eager only (host lengths)."""
    _refuse_extras("trtllm_batch_context_with_kv_cache", sinks=sinks, kv_cache_sf=kv_cache_sf,
                   skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor)
    k_cache, v_cache = _nhd(kv_cache)
    page_size, kv_heads, dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    heads = query.shape[1]
    result = out if out is not None else torch.empty(query.shape, dtype=out_dtype or query.dtype,
                                                     device=query.device)
    q_starts, lens = cum_seq_lens_q.tolist(), seq_lens.tolist()
    for i in range(batch_size):
        q = query[q_starts[i]:q_starts[i + 1]].float()
        n, length = q.shape[0], lens[i]
        lane = torch.arange(length, device=query.device)
        slots = block_tables[i].long()[lane // page_size] * page_size + lane % page_size
        keys = k_cache.reshape(-1, kv_heads, dim)[slots].float()
        values = v_cache.reshape(-1, kv_heads, dim)[slots].float()
        pos = torch.arange(length - n, length, device=query.device)[:, None]
        visible = (lane[None, :] <= pos) if causal else torch.ones(n, length, dtype=torch.bool)
        if window_left >= 0:
            visible = visible & (lane[None, :] >= pos - window_left)
        qh = q.view(n, kv_heads, heads // kv_heads, dim)
        scores = torch.einsum("nkgd,lkd->nkgl", qh, keys) * float(bmm1_scale)
        scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
        o = torch.einsum("nkgl,lkd->nkgd", torch.softmax(scores, dim=-1), values) * float(bmm2_scale)
        result[q_starts[i]:q_starts[i + 1]] = o.reshape(n, heads, dim).to(result.dtype)
    return result


class UnusedFlashInferWrapper:
    """FlashInfer's wrapper classes, which ``FlashInferAttnBackend.__init__`` builds and the TRT-LLM paths never
    use: constructed with any arguments, refusing every use."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        raise NotOnCPU(f"FlashInfer wrapper .{name}: FlashInfer's wrappers are not adapted to the CPU "
                                  "(only the TRT-LLM attention calls are)")


FLASHINFER = SimpleNamespace(
    decode=SimpleNamespace(trtllm_batch_decode_with_kv_cache=trtllm_batch_decode_with_kv_cache),
    prefill=SimpleNamespace(trtllm_batch_context_with_kv_cache=trtllm_batch_context_with_kv_cache),
)
"""what ``trtllm_mha_backend`` reads of the ``flashinfer`` module on the paths the harness drives"""

COUNTER_BYTES = 4096
"""the size of the decode kernel's multi-CTA counter buffer on the CPU, which the stand-in never reads"""


def _multi_ctas_kv_counter_bytes(device: Any, num_q_heads: int, batch_size: int) -> int:
    return COUNTER_BYTES

_WRAPPERS = ("BatchPrefillWithRaggedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper",
             "BatchDecodeWithPagedKVCacheWrapper")


@contextmanager
def trtllm_on_cpu() -> Iterator[None]:
    """Bind, in the installed backend modules, the names above (and nothing else) while the block runs."""
    load()
    from sglang.srt.layers.attention import flashinfer_backend, trtllm_mha_backend, trtllm_mla_backend

    bindings = [(flashinfer_backend, name, UnusedFlashInferWrapper) for name in _WRAPPERS]
    bindings += [(trtllm_mha_backend, "flashinfer", FLASHINFER), 
                 (trtllm_mla_backend, "_multi_ctas_kv_counter_bytes", _multi_ctas_kv_counter_bytes),
                 (trtllm_mha_backend, "update_trtllm_mha_graph_metadata", update_trtllm_mha_graph_metadata),
                 (trtllm_mha_backend, "build_trtllm_mha_page_table", build_trtllm_mha_page_table)]
    missing = object()
    saved = [(module, name, module.__dict__.get(name, missing)) for module, name, _ in bindings]
    for module, name, value in bindings:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in saved:
            if value is missing:
                delattr(module, name)
            else:
                setattr(module, name, value)

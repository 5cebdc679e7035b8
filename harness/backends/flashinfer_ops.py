"""FlashInfer's paged attention as a ``torch.library`` op, with a dense CPU stand-in for the same op.

FlashInfer launches its kernels through its own FFI. Neither the tape engine's dispatch mode nor the graph
input audit sees such a launch: under the tape a captured decode would run the kernel at capture and never
at replay, silently, and the audit would never learn that the graph reads the page lists. Wrapped in a
custom op whose arguments are everything the kernel reads (the query, the layer's K/V pages, the CSR lists,
both workspaces) and which declares that it writes ``out``, a call is one op both engines record: the
cuda engine captures the kernel it launches, the tape re-runs the op at every replay (its ``rerun_ops``
names it) and the audit names each input by where the backend holds it.

The planned wrapper itself is host state no op argument can carry, so a call names it by an integer handle
(``register_wrapper``); the handle's wrapper must have been planned, outside any graph, for the same lists.

The CPU kernel registered for the op is a stand-in with FlashInfer's semantics, over the same lists: each
query attends causally (aligned with the end of its request's run) to the keys of its run inside
``window_left``, K dequantized with the layer's scale (V's is applied to the output, by the caller), and a
query with no key gets zeros, as
FlashInfer returns for an empty row. Its body is plain aten ops with static shapes, so the tape records
and replays it like any other code; it never reads a masked key's value (a masked lane's value is zeroed,
not multiplied by zero), as the kernel never loads it.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import torch

from .paged_kv import paged_kv_slots

OP_NAME = "harness_flashinfer::paged_attention"

_WRAPPERS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_HANDLES = itertools.count(1)
NO_WRAPPER = 0
"""the handle of a call with no planned wrapper: the CPU stand-in needs none"""


def register_wrapper(wrapper: Any) -> int:
    """A handle naming ``wrapper`` in op calls, valid while the wrapper lives."""
    handle = next(_HANDLES)
    _WRAPPERS[handle] = wrapper
    return handle


# Defined with the low-level Library API rather than ``torch.library.custom_op``: the latter's kernels go
# through torch._compile's dynamo guard, whose first call imports torch._dynamo (about 8 s, once per run process).
_LIB = torch.library.Library("harness_flashinfer", "DEF")
_LIB.define(
    "paged_attention(Tensor(a!) out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor qo_indptr, Tensor kv_indptr, "
    "Tensor kv_indices, Tensor kv_last_page_len, Tensor int_workspace, Tensor float_workspace, int wrapper, "
    "int window_left, float sm_scale, float k_scale, int max_kv_len) -> ()")


def _stand_in_kernel(
    out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor, int_workspace: torch.Tensor,
    float_workspace: torch.Tensor, wrapper: int, window_left: int, sm_scale: float, k_scale: float,
    max_kv_len: int,
) -> None:
    out.copy_(dense_paged_attention(
        q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, window_left=window_left,
        sm_scale=sm_scale, k_scale=k_scale, max_kv_len=max_kv_len))


def _flashinfer_kernel(
    out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor, int_workspace: torch.Tensor,
    float_workspace: torch.Tensor, wrapper: int, window_left: int, sm_scale: float, k_scale: float,
    max_kv_len: int,
) -> None:
    planned = _WRAPPERS.get(wrapper)
    if planned is None:
        raise RuntimeError(f"{OP_NAME}: no planned FlashInfer wrapper has handle {wrapper}")
    # the lists, the workspaces and qo_indptr are the planned wrapper's own (plan() copied them); they are
    # arguments so that both graph engines and the audit see what the kernel reads. window_left is checked
    # against the planned one by FlashInfer itself.
    # no v_scale: FlashInfer applies it with an in-place aten multiply of ``out`` after its kernel, which
    # would make the tape take that multiply for the whole op's work and never re-run the kernel at replay
    planned.run(q, (k_cache, v_cache), k_scale=k_scale, out=out, window_left=window_left)


def _meta_kernel(*args: Any) -> None:
    return None


_LIB.impl("paged_attention", _stand_in_kernel, "CPU")
_LIB.impl("paged_attention", _flashinfer_kernel, "CUDA")
_LIB.impl("paged_attention", _meta_kernel, "Meta")
paged_attention = torch.ops.harness_flashinfer.paged_attention.default
"""``paged_attention(out, q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
int_workspace, float_workspace, wrapper, window_left, sm_scale, k_scale, max_kv_len)``: write into ``out``
[T, Hq, D] the attention of ``q`` [T, Hq, D] over the paged K/V caches [pages, page_size, Hkv, D] that the
CSR lists name, per request of ``qo_indptr``; K is dequantized by ``k_scale``, V is not (the caller scales
the output by the layer's ``v_scale``, as FlashInfer itself does after its kernel)."""


def dense_paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor, *, window_left: int,
    sm_scale: float, k_scale: float, max_kv_len: int,
) -> torch.Tensor:
    """[T, Hq, D] FlashInfer's paged attention in dense torch ops over ``max_kv_len`` lanes per query."""
    t, num_qo_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    slots, kv_lens = paged_kv_slots(kv_indptr, kv_indices, kv_last_page_len, page_size=page_size,
                                    lanes=max_kv_len)
    token = torch.arange(t, device=q.device)
    row = torch.searchsorted(qo_indptr[1:].contiguous(), token.to(qo_indptr.dtype), right=True)
    qo_start = qo_indptr[:-1].long()
    qo_lens = qo_indptr[1:].long() - qo_start
    # the query's own position in its run: the run's end minus the queries still to come
    q_pos = kv_lens[row] - qo_lens[row] + (token - qo_start[row])
    lane = torch.arange(max_kv_len, device=q.device)[None, :]
    valid = (lane <= q_pos[:, None]) & (lane < kv_lens[row][:, None])
    if window_left >= 0:
        valid = valid & (lane >= q_pos[:, None] - window_left)
    token_slots = slots[row]  # [T, lanes]
    k = k_cache.reshape(-1, num_kv_heads, head_dim)[token_slots].float() * k_scale  # [T, lanes, Hkv, D]
    v = v_cache.reshape(-1, num_kv_heads, head_dim)[token_slots].float()
    v = torch.where(valid[:, :, None, None], v, torch.zeros((), dtype=v.dtype, device=v.device))
    qh = q.float().view(t, num_kv_heads, num_qo_heads // num_kv_heads, head_dim)
    scores = torch.einsum("thgd,tlhd->thgl", qh, k) * sm_scale
    keep = valid[:, None, None, :]
    scores = scores.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(scores, dim=-1).masked_fill(~keep, 0.0)  # a query with no key: zeros, not NaN
    return torch.einsum("thgl,tlhd->thgd", probs, v).reshape(t, num_qo_heads, head_dim).to(q.dtype)

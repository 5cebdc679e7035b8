"""One query per request over a gathered, masked run of its keys, in plain float32 torch ops with static shapes:
the CPU stand-ins of the decode kernels (the TRT-LLM one's, and the graph-capable torch-native read of the SGLang
target) compute it here.

Every product is one ``bmm`` per (request, KV head) over contiguous operands. ``einsum``, or a ``reshape`` that
merges a batch of one into a strided view, sends a batch of one request down another GEMM path than the same row
of a padded bucket, so a replayed graph would differ from its eager run in the last bits (about 1e-7): a false
alarm on every design.
"""

from __future__ import annotations

import torch


def grouped_decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor, *,
                             scale: float, out_scale: float = 1.0) -> torch.Tensor:
    """[bs, Hq, D] float32: ``q`` [bs, Hq, D] over ``keys`` and ``values`` [bs, L, Hkv, D] where ``visible``
    [bs, L] (query heads grouped onto KV heads); a masked key's value is never read (zeroed, not multiplied by
    zero, so a NaN in a freed slot cannot leak), and a row with no visible key gives zeros."""
    bs, num_qo_heads, head_dim = q.shape
    lanes, num_kv_heads = keys.shape[1], keys.shape[2]
    group, heads = num_qo_heads // num_kv_heads, bs * num_kv_heads
    values = torch.where(visible[:, :, None, None], values, torch.zeros((), dtype=values.dtype, device=values.device))
    qh = q.float().reshape(heads, group, head_dim).contiguous()
    k_t = keys.float().permute(0, 2, 3, 1).reshape(heads, head_dim, lanes).contiguous()
    v_t = values.float().permute(0, 2, 1, 3).reshape(heads, lanes, head_dim).contiguous()
    scores = torch.bmm(qh, k_t).view(bs, num_kv_heads, group, lanes) * scale
    keep = visible[:, None, None, :]
    probs = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1).masked_fill(~keep, 0.0)
    out = torch.bmm(probs.reshape(heads, group, lanes).contiguous(), v_t) * out_scale
    return out.reshape(bs, num_qo_heads, head_dim)


__all__ = ["grouped_decode_attention"]

"""The dense oracle: the same weights in float64, one request at a time, no paging, explicit masks.

It knows nothing of pools, slots, designs or graphs, so agreement with it certifies that the eager
reference run (against which every subject is diffed) computes the model correctly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..serving.model import SyntheticModel
from ..serving.pool import dequantize_fp8
from ..serving.timeline import TimelineSpec, request_tokens
from .snapshot import KVSnapshot

# (atol, rtol) per (model dtype, kv dtype): the paged run rounds to these, the oracle does not.
_TOLERANCE = {
    ("float32", "float32"): (1e-4, 1e-4),
    ("float32", "bfloat16"): (6e-2, 4e-2),
    ("bfloat16", "bfloat16"): (1.5e-1, 6e-2),
    ("bfloat16", "float32"): (1.5e-1, 6e-2),
    ("float32", "fp8_e4m3"): (3e-1, 1.5e-1),
    ("bfloat16", "fp8_e4m3"): (4e-1, 2e-1),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class OracleRequest:
    k: torch.Tensor
    """[positions, layers, Hkv, D] float64, post-RoPE"""
    v: torch.Tensor
    hidden: torch.Tensor
    """[positions, hidden] float64 final hidden states"""


def dense_oracle(model: SyntheticModel, timeline: TimelineSpec) -> dict[str, OracleRequest]:
    """Every token's K/V per layer and final hidden state, per request."""
    m = model.cast(torch.float64)
    spec = m.spec
    out = {}
    for rid, tokens in request_tokens(timeline, spec.vocab_size).items():
        tokens = tokens.to(m.device)
        n = tokens.numel()
        positions = torch.arange(n, device=m.device)
        ks, vs = [], []

        def attention(layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            kh = k.view(n, spec.num_kv_heads, spec.head_dim)
            vh = v.view(n, spec.num_kv_heads, spec.head_dim)
            ks.append(kh)
            vs.append(vh)
            group = spec.num_heads // spec.num_kv_heads
            qh = q.view(n, spec.num_heads, spec.head_dim)
            kr = kh.repeat_interleave(group, dim=1)
            vr = vh.repeat_interleave(group, dim=1)
            scores = torch.einsum("qhd,khd->hqk", qh, kr) * spec.head_dim**-0.5
            i = positions[:, None]
            j = positions[None, :]
            mask = j <= i
            window = spec.layer_window(layer_id)
            if window is not None:
                mask &= j > i - window
            probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
            return torch.einsum("hqk,khd->qhd", probs, vr).reshape(n, -1)

        hidden = m.forward(tokens, positions, attention)
        out[rid] = OracleRequest(k=torch.stack(ks, 1).cpu(), v=torch.stack(vs, 1).cpu(), hidden=hidden.cpu())
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Certification:
    ok: bool
    max_kv_error: float
    max_hidden_error: float
    problems: tuple[str, ...]
    """the first few places where the run and the oracle disagree beyond tolerance"""


def tolerance(model_dtype: str, kv_dtype: str) -> tuple[float, float]:
    return _TOLERANCE[(model_dtype, kv_dtype)]


def certify(
    snapshots: tuple[KVSnapshot, ...] | list[KVSnapshot],
    oracle: dict[str, OracleRequest],
    *,
    model: SyntheticModel,
    kv_dtype: str,
    kv_scales: list[tuple[float, float]],
    max_problems: int = 5,
) -> Certification:
    """Check every live slot of both pools and every hidden state of a run against the oracle."""
    spec = model.spec
    atol, rtol = tolerance(spec.dtype, kv_dtype)
    full_layers = [i for i in range(spec.num_layers) if not spec.layer_is_swa[i]]
    swa_layers = [i for i in range(spec.num_layers) if spec.layer_is_swa[i]]
    problems: list[str] = []
    worst_kv = worst_hidden = 0.0

    def decode(raw: torch.Tensor, layer: int, which: int) -> torch.Tensor:
        if kv_dtype == "fp8_e4m3":
            return dequantize_fp8(raw, kv_scales[layer][which], torch.float64)
        return raw.double()

    def check(got: torch.Tensor, want: torch.Tensor, where: str) -> float:
        err = (got - want).abs()
        bad = ~(err <= atol + rtol * want.abs())
        if bool(bad.any()) and len(problems) < max_problems:
            problems.append(f"{where}: max |diff| {float(err.max()):.3g} (atol {atol}, rtol {rtol})")
        return float(err.nan_to_num(float("inf")).max()) if err.numel() else 0.0

    for snap in snapshots:
        for tok in snap.live:
            ref = oracle[tok.rid]
            for pool_index, layer in enumerate(full_layers):
                for which, (buf, want) in enumerate(((snap.full_k, ref.k), (snap.full_v, ref.v))):
                    got = decode(buf[pool_index, tok.full_slot], layer, which)
                    where = f"step {snap.step} full pool layer {layer} slot {tok.full_slot} ({tok.rid}@{tok.pos}) {'kv'[which]}"
                    worst_kv = max(worst_kv, check(got, want[tok.pos, layer], where))
            if not tok.in_window:
                continue
            for pool_index, layer in enumerate(swa_layers):
                for which, (buf, want) in enumerate(((snap.swa_k, ref.k), (snap.swa_v, ref.v))):
                    got = decode(buf[pool_index, tok.swa_slot], layer, which)
                    where = f"step {snap.step} SWA pool layer {layer} slot {tok.swa_slot} ({tok.rid}@{tok.pos}) {'kv'[which]}"
                    worst_kv = max(worst_kv, check(got, want[tok.pos, layer], where))
        for row, key in enumerate(snap.hidden_owners):
            where = f"step {snap.step} hidden state of {key.rid}@{key.pos}"
            worst_hidden = max(worst_hidden, check(snap.hidden[row].double(), oracle[key.rid].hidden[key.pos], where))
    return Certification(
        ok=not problems, max_kv_error=worst_kv, max_hidden_error=worst_hidden, problems=tuple(problems)
    )

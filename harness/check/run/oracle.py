"""The dense oracle: the same weights in float64, one request at a time, no paging, explicit masks.

It knows nothing of pools, slots, designs or graphs, so agreement with it certifies that the eager
reference run (against which every subject is diffed) computes the model correctly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...runspec import RunSpec
from ...serving.model import SyntheticModel
from ...serving.pool import dequantize_fp8
from ...serving.timeline import TimelineSpec, request_tokens
from ..diff.snapshot import IN_WINDOW, POS, RID, SLOTS, KVSnapshot, replay

# (atol, rtol) per (model dtype, kv dtype): the paged run rounds to these, the oracle does not.
_TOLERANCE = {
    ("float32", "float32"): (1e-4, 1e-4),
    ("float32", "bfloat16"): (6e-2, 4e-2),
    ("bfloat16", "bfloat16"): (1.5e-1, 6e-2),
    ("bfloat16", "float32"): (1.5e-1, 6e-2),
    ("float32", "fp8_e4m3"): (3e-1, 1.5e-1),
    ("bfloat16", "fp8_e4m3"): (4e-1, 2e-1),
    ("float16", "float16"): (2e-2, 1e-2),
    ("float16", "float32"): (2e-2, 1e-2),
    ("float32", "float16"): (1e-2, 5e-3),
    ("float16", "fp8_e4m3"): (4e-1, 2e-1),
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


def certify_run(snapshots: tuple[KVSnapshot, ...], spec: RunSpec) -> Certification:
    """``certify`` of a finished run of ``spec`` against the dense oracle of its model and timeline."""
    model = SyntheticModel(spec.model, spec.device)
    return certify(snapshots, dense_oracle(model, spec.timeline), model=model, kv_dtype=spec.pool.kv_dtype,
                   kv_scales=model.kv_scales())


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
    """Check every live slot of every KV group and every hidden state of a run against the oracle.

    Problems are listed in the order a walk would meet them: step by step, per live token each group's layers
    in the stack's order (SGLang's: the full pool's, then inside the window the SWA pool's), K before V, then
    the step's hidden states.
    """
    spec = model.spec
    atol, rtol = tolerance(spec.dtype, kv_dtype)
    # Every request's oracle rows end to end, so a token's rows are one index away.
    start, at = {}, 0
    for rid, req in oracle.items():
        start[rid] = at
        at += req.k.shape[0]
    all_k = torch.cat([req.k for req in oracle.values()]) if oracle else torch.empty(0)
    all_v = torch.cat([req.v for req in oracle.values()]) if oracle else torch.empty(0)
    all_hidden = torch.cat([req.hidden for req in oracle.values()]) if oracle else torch.empty(0)
    problems: list[str] = []
    worst_kv = worst_hidden = 0.0

    def decode(raw: torch.Tensor, layer: int, which: int) -> torch.Tensor:
        if kv_dtype == "fp8_e4m3":
            return dequantize_fp8(raw, kv_scales[layer][which], torch.float64)
        return raw.double()

    def errors(got: torch.Tensor, want: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row of [rows, ...]: beyond tolerance anywhere, and the largest |diff| (NaN if any)."""
        err = (got - want).abs()
        bad = ~(err <= atol + rtol * want.abs())
        return bad.flatten(1).any(1), err.flatten(1).amax(1)

    for snap, pools in replay(snapshots):
        table = snap.live_table
        row = torch.tensor([start[rid] for rid in snap.live_rids], dtype=torch.int64)[table[:, RID]] + table[:, POS]
        # [tokens, entries]: entry 2i + which is layer i of the first group, then of the next ones.
        bad_parts, err_parts, where = [], [], []
        for g_index, group in enumerate(snap.groups):
            slots = table[:, SLOTS + g_index]
            whole = pools.pools[g_index]
            for pool_index, layer in enumerate(group.layer_ids):
                for which, (buf, want) in enumerate(zip((whole.k, whole.v), (all_k, all_v))):
                    bad, err = errors(decode(buf[pool_index, slots], layer, which), want[row, layer])
                    if group.has_window:
                        inside = table[:, IN_WINDOW].bool()
                        bad, err = bad & inside, torch.where(inside, err, 0.0)
                    bad_parts.append(bad)
                    err_parts.append(err)
                    where.append((g_index, layer, which))
        if bad_parts and table.shape[0]:
            bad = torch.stack(bad_parts, 1)
            err = torch.stack(err_parts, 1)
            worst_kv = max(worst_kv, float(err.nan_to_num(float("inf")).max()))
            for t, e in bad.nonzero().tolist()[: max(0, max_problems - len(problems))]:
                tok = snap.live[t]
                g_index, layer, which = where[e]
                slot = tok.slots[g_index]
                problems.append(
                    f"step {snap.step} {snap.groups.groups[g_index].title} pool layer {layer} slot {slot} ({tok.rid}@{tok.pos}) {'kv'[which]}: "
                    f"max |diff| {float(err[t, e]):.3g} (atol {atol}, rtol {rtol})"
                )
        # a rejected tree branch's rows carry other tokens than the request's stream: no oracle row is theirs
        own = [i for i, key in enumerate(snap.hidden_owners) if key.branch is None]
        if own:
            rows = torch.tensor([start[snap.hidden_owners[i].rid] + snap.hidden_owners[i].pos for i in own],
                                dtype=torch.int64)
            bad, err = errors(snap.hidden[own].double(), all_hidden[rows])
            worst_hidden = max(worst_hidden, float(err.nan_to_num(float("inf")).max()))
            for r in bad.nonzero().flatten().tolist()[: max(0, max_problems - len(problems))]:
                key = snap.hidden_owners[own[r]]
                problems.append(
                    f"step {snap.step} hidden state of {key.rid}@{key.pos}: max |diff| {float(err[r]):.3g} "
                    f"(atol {atol}, rtol {rtol})"
                )
    return Certification(
        ok=not problems, max_kv_error=worst_kv, max_hidden_error=worst_hidden, problems=tuple(problems)
    )

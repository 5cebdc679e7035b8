"""``certify`` against a literal token-by-token reading of its contract, on runs with planted errors."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from harness.check.oracle import Certification, certify, dense_oracle, tolerance
from harness.check.drive import execute
from harness.check.snapshot import WholePool, WholeStep, replay, snapshots_of
from harness.runspec import RunSpec
from harness.serving.model import SyntheticModel, model_spec
from harness.serving.pool import PoolSpec, dequantize_fp8
from workloads import chunked_decode, continuous_batching


def literal_certify(snapshots, oracle, *, model, kv_dtype, kv_scales, max_problems=5) -> Certification:
    spec = model.spec
    atol, rtol = tolerance(spec.dtype, kv_dtype)
    full_layers = [i for i in range(spec.num_layers) if not spec.layer_is_swa[i]]
    swa_layers = [i for i in range(spec.num_layers) if spec.layer_is_swa[i]]
    problems, worst_kv, worst_hidden = [], 0.0, 0.0

    def decode(raw, layer, which):
        return dequantize_fp8(raw, kv_scales[layer][which], torch.float64) if kv_dtype == "fp8_e4m3" else raw.double()

    def check(got, want, where):
        err = (got - want).abs()
        if bool((~(err <= atol + rtol * want.abs())).any()) and len(problems) < max_problems:
            problems.append(f"{where}: max |diff| {float(err.max()):.3g} (atol {atol}, rtol {rtol})")
        return float(err.nan_to_num(float("inf")).max())

    for snap, whole in replay(snapshots):
        for tok in snap.live:
            ref = oracle[tok.rid]
            full, swa = whole.pool("full"), whole.pool("swa")
            pools = [("full", full_layers, tok.slots[0], full.k, full.v)]
            if tok.in_window:
                pools.append(("SWA", swa_layers, tok.slots[1], swa.k, swa.v))
            for name, layers, slot, kb, vb in pools:
                for i, layer in enumerate(layers):
                    for which, (buf, want) in enumerate(((kb, ref.k), (vb, ref.v))):
                        where = f"step {snap.step} {name} pool layer {layer} slot {slot} ({tok.rid}@{tok.pos}) {'kv'[which]}"
                        worst_kv = max(worst_kv, check(decode(buf[i, slot], layer, which), want[tok.pos, layer], where))
        for row, key in enumerate(snap.hidden_owners):
            where = f"step {snap.step} hidden state of {key.rid}@{key.pos}"
            worst_hidden = max(worst_hidden, check(snap.hidden[row].double(), oracle[key.rid].hidden[key.pos], where))
    return Certification(ok=not problems, max_kv_error=worst_kv, max_hidden_error=worst_hidden, problems=tuple(problems))


def planted(snapshots, seed: int):
    """Copies of the snapshots with a few live rows and hidden states pushed off, one NaN among them."""
    rng = random.Random(seed)
    out = []
    for snap, whole in replay(snapshots):
        tensors = {f"{g}_{kv}": getattr(whole.pool(g), kv).clone() for g in ("full", "swa") for kv in "kv"}
        tensors["hidden"] = snap.hidden.clone()
        for _ in range(rng.randint(0, 2)):
            if not snap.live:
                break
            tok = rng.choice(snap.live)
            name = rng.choice(["full_k", "full_v", "swa_k", "swa_v"])
            t = tensors[name]
            if t.shape[0]:
                slot = tok.slots[0] if name.startswith("full") else tok.slots[1]
                row = t[rng.randrange(t.shape[0]), slot]
                if t.dtype == torch.uint8:
                    row[0, 0] ^= 0x11
                else:
                    row[0, 0] = float("nan") if rng.random() < 0.2 else row[0, 0] + 0.5
        if tensors["hidden"].numel() and rng.random() < 0.3:
            tensors["hidden"][rng.randrange(tensors["hidden"].shape[0]), 0] += 1.0
        pools = tuple(WholePool(k=tensors[f"{g}_k"], v=tensors[f"{g}_v"]) for g in ("full", "swa"))
        out.append(WholeStep(step=snap.step, kind=snap.kind, live=snap.live, hidden_owners=snap.hidden_owners,
                             groups=snap.groups, pools=pools, hidden=tensors["hidden"]))
    return snapshots_of(out)


@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16", "fp8_e4m3"])
@pytest.mark.parametrize("preset,workload", [("gpt-oss-mini", chunked_decode), ("gemma-mini", continuous_batching)])
@pytest.mark.slow
def test_certify_reports_what_a_token_by_token_walk_reports(kv_dtype, preset, workload):
    ms = model_spec(preset)
    spec = RunSpec(model=ms, pool=PoolSpec(full_size=96, swa_size=48, kv_dtype=kv_dtype), timeline=workload(ms.window))
    result = execute(spec)
    model = SyntheticModel(spec.model)
    oracle = dense_oracle(model, spec.timeline)
    kw = dict(model=model, kv_dtype=kv_dtype, kv_scales=model.kv_scales())
    clean = certify(result.snapshots, oracle, **kw)
    assert clean == literal_certify(result.snapshots, oracle, **kw) and clean.ok
    for seed in range(4):
        snaps = planted(result.snapshots, seed)
        # the literal walk keeps its first problems up to the limit and measures the worst errors over all,
        # so its answer under a lower limit is its answer under the highest, cut short (one slow walk a seed)
        walked = literal_certify(snaps, oracle, max_problems=1000, **kw)
        for limit in (1, 5, 1000):
            got = certify(snaps, oracle, max_problems=limit, **kw)
            assert got == dataclasses.replace(walked, problems=walked.problems[:limit])

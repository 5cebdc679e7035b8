"""The half-precision presets FlashInfer's cells run: certified by the float64 oracle within their dtype's
tolerance, judged within it where a verdict cannot be bitwise, and refused by FlashInfer's declaration where a
model is float32 or its heads are smaller than FlashInfer's kernels take."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.backends.flashinfer import FlashInferBackend
from harness.check.drive import execute
from harness.check.oracle import certify, dense_oracle, tolerance
from harness.check.verdict import judge
from harness.runspec import Outcome, RunSpec
from harness.serving.model import PRESETS, SyntheticModel, model_spec
from harness.serving.pool import PoolSpec
from workloads import chunked_decode

HALF = {"gpt-oss-mini-bf16": "bfloat16", "gemma-mini-fp16": "float16"}


def _eager(preset: str) -> RunSpec:
    ms = model_spec(preset)
    return RunSpec(model=ms, pool=PoolSpec(full_size=96, swa_size=48, kv_dtype=ms.dtype),
                   timeline=chunked_decode(ms.window))


def test_the_flashinfer_presets_are_half_precision_with_heads_flashinfer_prebuilds():
    for name, dtype in HALF.items():
        assert PRESETS[name].dtype == dtype and PRESETS[name].head_dim >= 64
        reasons = FlashInferBackend.unsupported(mode="full", device="cuda", model=PRESETS[name], kv_dtype=dtype)
        assert not any("FlashInfer has no" in r or "head_dim" in r or "KV pool" in r for r in reasons), reasons


def test_flashinfer_refuses_a_float32_model_and_small_heads_saying_which_presets_it_takes():
    reasons = FlashInferBackend.unsupported(mode="eager", device="cuda", model=PRESETS["gpt-oss-mini"],
                                            kv_dtype="float32")
    assert ("backend flashinfer: FlashInfer has no float32 kernels; the model needs dtype bfloat16 or float16 "
            "(a preset such as gpt-oss-mini-bf16 or gemma-mini-fp16)") in reasons
    assert "backend flashinfer: FlashInfer's prebuilt kernels take head_dim 64, 128, 256, not 16" in reasons
    mixed = FlashInferBackend.unsupported(mode="eager", device="cuda", model=PRESETS["gpt-oss-mini-bf16"],
                                          kv_dtype="float16")
    assert ("backend flashinfer: FlashInfer reads a KV pool of the query's dtype (bfloat16) or fp8_e4m3, "
            "not float16") in mixed


@pytest.mark.parametrize("preset", sorted(HALF))
def test_a_torch_native_run_of_a_half_precision_preset_is_certified_within_its_tolerance(preset):
    spec = _eager(preset)
    result = execute(spec)
    assert result.error is None, result.error
    model = SyntheticModel(spec.model)
    oracle = dense_oracle(model, spec.timeline)
    cert = certify(result.snapshots, oracle, model=model, kv_dtype=spec.pool.kv_dtype, kv_scales=model.kv_scales())
    assert cert.ok, cert.problems
    atol, _ = tolerance(spec.model.dtype, spec.pool.kv_dtype)
    # the tolerance is the dtype's: rounding fits well inside it, and a float32 tolerance would not hold
    assert 0 < cert.max_hidden_error < atol / 2
    assert cert.max_hidden_error > tolerance("float32", "float32")[0]


def _nudged(result, scale: float):
    """The run's snapshots with every hidden state scaled: rounding-sized for a scale near 1."""
    snaps = tuple(dataclasses.replace(s, hidden=(s.hidden.float() * scale).to(s.hidden.dtype))
                  for s in result.snapshots)
    return dataclasses.replace(result, snapshots=snaps)


@pytest.mark.parametrize("preset", sorted(HALF))
def test_a_gpu_verdict_forgives_rounding_within_the_dtypes_tolerance_and_no_more(preset):
    reference = execute(_eager(preset))
    ulp = torch.finfo(getattr(torch, HALF[preset])).eps
    # a FlashInfer run is on CUDA: judged against its own backend's eager run within the tolerance, not bitwise
    on_gpu = dataclasses.replace(reference.spec, device="cuda")
    rounded = dataclasses.replace(_nudged(reference, 1 + 2 * ulp), spec=on_gpu)
    assert judge(rounded, reference).outcome == Outcome.MATCH
    assert judge(dataclasses.replace(rounded, spec=reference.spec), reference).outcome == Outcome.DIVERGE  # CPU: bitwise
    wrong = dataclasses.replace(_nudged(reference, 1.5), spec=on_gpu)
    assert judge(wrong, reference).outcome == Outcome.DIVERGE

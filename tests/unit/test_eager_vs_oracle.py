"""The eager paged run with the reference design computes the model: the dense oracle certifies it."""


import pytest

from harness.check.run.oracle import certify, dense_oracle
from harness.check.run.drive import execute
from harness.runspec import RunSpec
from harness.serving.model import PRESETS, SyntheticModel, model_spec
from harness.serving.pool import PoolSpec
from harness.serving.timeline import RequestSpec, TimelineSpec
from sweeps import each_choice
from workloads import (
    chunked_decode,
    continuous_batching,
    prefill_lengths,
)

KV_CASES = [("float32", "float32", "plain"), ("bfloat16", "bfloat16", "plain"), ("float32", "fp8_e4m3", "fused_fp8"),
            ("float32", "fp8_e4m3", "plain")]


def certify_run(spec: RunSpec):
    result = execute(spec)
    assert result.error is None, result.error
    model = SyntheticModel(spec.model)
    return result, certify(result.snapshots, dense_oracle(model, spec.timeline), model=model,
                           kv_dtype=spec.pool.kv_dtype, kv_scales=model.kv_scales())


# each case sets the model's dtype, so the half-precision presets (FlashInfer's) would only repeat the float32
# ones with bigger heads; test_half_precision_presets.py certifies them in their own dtypes
# every preset, KV case and workload in make test at least once; the whole product in make test-slow
@pytest.mark.parametrize("preset,model_dtype,kv_dtype,kv_write,workload", each_choice(
    sorted(p for p, spec in PRESETS.items() if spec.dtype == "float32"), KV_CASES,
    [prefill_lengths, chunked_decode, continuous_batching]))
def test_eager_forward_batch_matches_oracle(preset, model_dtype, kv_dtype, kv_write, workload):
    ms = model_spec(preset, dtype=model_dtype)
    spec = RunSpec(model=ms, pool=PoolSpec(full_size=96, swa_size=48, kv_dtype=kv_dtype),
                   timeline=workload(ms.window), kv_write=kv_write)
    result, cert = certify_run(spec)
    assert cert.ok, cert.problems
    assert result.snapshots, "the timeline ran no step"


def test_decode_past_window_reuses_swa_slots():
    ms = model_spec("gpt-oss-mini")
    # SWA pool of W+2 usable slots cannot hold the 3W tokens this request writes without reuse.
    tl = TimelineSpec(requests=(RequestSpec(rid="r", prompt_len=ms.window, output_len=2 * ms.window),))
    spec = RunSpec(model=ms, pool=PoolSpec(full_size=64, swa_size=ms.window + 3), timeline=tl)
    result, cert = certify_run(spec)
    assert cert.ok, cert.problems
    seen = [t.slots[1] for s in result.snapshots for t in s.live if t.in_window]
    assert len(set(seen)) <= ms.window + 2 < 3 * ms.window


def test_gqa_groups_share_kv_heads():
    ms = model_spec("gpt-oss-mini", num_heads=8, num_kv_heads=2)
    spec = RunSpec(model=ms, pool=PoolSpec(full_size=96, swa_size=48), timeline=chunked_decode(ms.window))
    _, cert = certify_run(spec)
    assert cert.ok, cert.problems


def test_oracle_catches_a_wrong_window():
    # The certification must be able to fail: a backend that windows the full layers is not the model.
    ms = model_spec("gpt-oss-mini")
    spec = RunSpec(model=ms, pool=PoolSpec(full_size=96, swa_size=48), timeline=chunked_decode(ms.window),
                   faults=frozenset({"window_from_wrong_layer"}))
    _, cert = certify_run(spec)
    assert not cert.ok

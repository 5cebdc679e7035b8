"""Never cry wolf: on random timelines, every design that resolves SWA locations correctly matches the
reference bitwise in every mode. Found the batch-size-1 GEMM path that a strided K operand took."""

import dataclasses
import random

import pytest

from harness.check.drive import execute
from harness.check.verdict import judge
from harness.runspec import GraphSpec, RunSpec
from harness.serving.model import PRESETS, model_spec
from harness.serving.pool import PoolSpec
from harness.serving.timeline import RequestSpec, TimelineSpec

SOUND_DESIGNS = ("translate", "forward_batch", "memoized", "metadata")
KV_SETUPS = (("float32", "float32", "plain"), ("bfloat16", "bfloat16", "plain"),
             ("float32", "fp8_e4m3", "fused_fp8"), ("float32", "fp8_e4m3", "plain"))


def random_spec(seed: int) -> RunSpec:
    rng = random.Random(seed)
    dtype, kv_dtype, kv_write = rng.choice(KV_SETUPS)
    requests = []
    for i in range(rng.randint(1, 5)):
        arrive = rng.randint(0, 6)
        abort = arrive + rng.randint(1, 12) if rng.random() < 0.2 else None
        requests.append(RequestSpec(rid=f"r{i}", arrive=arrive, prompt_len=rng.randint(1, 20),
                                    output_len=rng.randint(0, 14), abort=abort))
    return RunSpec(
        model=model_spec(rng.choice(sorted(PRESETS)), dtype=dtype),
        pool=PoolSpec(full_size=160, swa_size=rng.choice([48, 64, 96]), kv_dtype=kv_dtype),
        timeline=TimelineSpec(requests=tuple(requests), chunk_size=rng.choice([None, 4, 7, 12]),
                              draft_steps=rng.choice([0, 0, 0, 2, 3]), seed=seed),
        kv_write=kv_write,
        graphs=GraphSpec(decode_buckets=rng.choice([(1, 2, 4), (2, 4, 8), (4,)]),
                         prefill_buckets=rng.choice([(8, 16, 32), (16, 64), (4, 8, 12, 24)]),
                         capture=rng.choice(["startup", "on_demand"])),
    )


@pytest.mark.parametrize("seed", [10, 11, 27, 41])
@pytest.mark.slow
def test_sound_designs_match_in_every_mode_on_random_timelines(seed):
    spec = random_spec(seed)
    reference = execute(spec.reference())
    assert reference.error is None, reference.error
    for mode in ("eager", "full", "piecewise"):
        for design in SOUND_DESIGNS:
            verdict = judge(execute(dataclasses.replace(spec, design=design, mode=mode)), reference)
            assert verdict.outcome == "match", f"seed {seed} {design}/{mode}: {verdict.summary()}"

"""The fused FP8 write as the fused kernel computes it: times the reciprocal scale, rows addressed through their
page. It is not the pool's own write path, so it may round one e4m3 step apart from it, never more, and it lands
in exactly the rows the plain path writes; the fault that drops the per-layer scale is far from both."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from harness.check.run.assemble import assemble
from harness.scenario.loader import load_scenario
from harness.serving.pool import quantize_fp8, quantize_fp8_fused

FUSED = Path(__file__).resolve().parents[2] / "scenarios" / "swa_fp8_fused_write.toml"


def _steps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many e4m3 codes apart two stored bytes are (codes are sign and magnitude; +0 and -0 are one value)."""
    def ordinal(raw: torch.Tensor) -> torch.Tensor:
        r = raw.to(torch.int16)
        magnitude = r & 0x7F
        return torch.where(r & 0x80 != 0, -magnitude, magnitude)
    return (ordinal(a) - ordinal(b)).abs()


def test_the_fused_quantizer_is_within_one_e4m3_step_of_the_plain_one():
    x = torch.randn(50_000, generator=torch.Generator().manual_seed(3)) * 0.05
    for scale in (0.011, 0.017, 0.029):
        assert int(_steps_apart(quantize_fp8_fused(x, 1.0 / scale), quantize_fp8(x, scale)).max()) <= 1


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_the_fused_write_lands_in_the_plain_writes_rows_within_one_step(page_size):
    scenario = load_scenario(FUSED)
    spec = scenario.run_spec(design="forward_batch", mode="eager", backend="torch_native")
    spec = dataclasses.replace(spec, pool=dataclasses.replace(spec.pool, page_size=page_size, swa_size=48))
    parts = assemble(spec)
    pool, impl = parts.pool, parts.backend.impl
    gen = torch.Generator().manual_seed(page_size)
    heads, dim = pool.get_key_buffer(0).shape[1:]
    loc = torch.tensor([page_size + 1, 3 * page_size - 1, 17, 2 * page_size], dtype=torch.int64)
    k, v = (torch.randn(len(loc), heads, dim, generator=gen) * 0.05 for _ in range(2))
    for layer in range(len(pool.kv_scales)):
        before = [b.clone() for b in pool.get_kv_buffer(layer)]

        def written(write) -> list[torch.Tensor]:
            for buf, old in zip(pool.get_kv_buffer(layer), before):
                buf.copy_(old)
            write()
            return [b.clone() for b in pool.get_kv_buffer(layer)]

        plain = written(lambda: pool.set_kv_buffer(layer, loc, k, v))
        fused = written(lambda: impl._fused_fp8_set_kv_buffer(layer, loc, k, v))
        for p, f, old in zip(plain, fused, before):
            others = torch.ones(p.shape[0], dtype=torch.bool)
            others[loc] = False
            assert torch.equal(f[others], old[others]), "the fused write touched a row it does not own"
            assert int(_steps_apart(f[loc], p[loc]).max()) <= 1
        impl.faults = frozenset({"fused_fp8_scale_dropped"})
        try:
            dropped = written(lambda: impl._fused_fp8_set_kv_buffer(layer, loc, k, v))
        finally:
            impl.faults = frozenset()
        assert int(_steps_apart(dropped[0][loc], plain[0][loc]).max()) > 8

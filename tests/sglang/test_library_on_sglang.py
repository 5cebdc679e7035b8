"""The scenario library's clean designs on the installed SGLang: every scenario it can express, its
timeline driving SGLang's pool, allocator, rows and eviction, each design expected to match its reference
in eager mode (the harness's model, designs and backends writing and reading SGLang's buffers)."""

from pathlib import Path

import pytest

from harness.check.matrix.case import Selection, cases
from harness.check.matrix.matrix import run_case
from harness.scenario.loader import load_scenario
from harness.sglang.library import not_expressible, on_sglang, pools_too_small

pytestmark = pytest.mark.slow
LIBRARY = sorted((Path(__file__).resolve().parents[2] / "scenarios").glob("**/*.toml"))


# the name with hyphens: `pytest -k swa_prefill` selects the scenario family's items, not this test too
@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: p.stem.replace("_", "-"))
def test_clean_designs_match_on_sglangs_pool(path):
    scenario = load_scenario(path)
    reason = not_expressible(scenario)
    if reason is not None:
        pytest.skip(f"not expressible against SGLang 0.5.23: {reason}")
    if (short := pools_too_small(scenario)) is not None:
        pytest.skip(f"its pools are sized for the harness's eviction; under SGLang's: {short}")
    clean = [c for c in cases(on_sglang(scenario), Selection(modes=["eager"]))
             if not c.unsupported and c.expected == "match" and not (c.with_faults and scenario.faults)]
    if not clean:
        pytest.skip("no design of this scenario is expected to match without faults")
    failed = [f"{c.design}/{c.backend}: {r.verdict.summary()}" for c in clean if not (r := run_case(c)).ok]
    assert failed == []

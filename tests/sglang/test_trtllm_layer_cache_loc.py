"""SGLang PR 24138's function judged by the library: the installed ``TRTLLMHAAttnBackend._get_layer_cache_loc``
as a design on SGLang's pool, clean and under a fault that skips its per-forward metadata refresh."""

from pathlib import Path

import pytest

from harness.check.case import cases
from harness.scenario.loader import load_scenario
from harness.sglang import designs
from harness.sglang.library import on_sglang, run_case_in_child

SCENARIO = Path(__file__).parent / "sglang_scenarios" / "swa_trtllm_layer_cache_loc.toml"
DESIGN = "harness.sglang.designs:trtllm_layer_cache_loc"
WITH_STALE_METADATA = "diverge"
"""a's 10-token prefill leaves its swa_out_cache_loc; every decode batch (1 or 2 tokens) passes the length
assert, is sliced to its first ids and writes over a's first prompt tokens' SWA slots, so the decode tokens'
own SWA K/V is never written: the pool diverges from the reference with no error"""


@pytest.fixture(scope="module")
def case():
    scenario = on_sglang(load_scenario(SCENARIO))
    [only] = cases(scenario, designs=[DESIGN], modes=["eager"], backends=[scenario.backends[0]])
    return only


def test_the_installed_function_matches_with_its_metadata_rebuilt_every_forward(case):
    result = run_case_in_child(case)
    assert result.verdict.outcome == "match" == case.expected, _said(result)


def test_a_skipped_metadata_refresh_passes_the_length_assert_and_the_sliced_ids_diverge(case):
    result = run_case_in_child(case, patch=designs.skip_metadata_refresh)
    assert result.verdict.error is None, _said(result)  # the assert passed: no AssertionError
    assert result.verdict.outcome == WITH_STALE_METADATA, _said(result)
    assert designs._skip_refresh is False  # the patch stayed in the child


def _said(result) -> str:
    v = result.verdict
    return f"{v.outcome}: {v.error or v.first}"

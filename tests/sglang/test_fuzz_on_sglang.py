"""The library property over the installed SGLang (``fuzz --serving sglang``): every generated run moved onto
SGLang's stack, its own scheduler, free order and eviction, judged against its eager reference.

A clean design finds nothing in a short search, and a fault patched into SGLang's own scheduler (issue 27's
``sglang_skip_evict_mid_prefill``, SGLang PR 33805) is found, shrunk and written as a scenario file that
reproduces when loaded."""

import pytest

from harness.fuzz import FuzzTarget, fuzz, write_regression
from harness.fuzz.regression import replay_regression
from harness.runspec import Mode


def test_every_generated_run_is_moved_onto_sglang_with_its_free_order_and_eviction():
    from hypothesis import HealthCheck, given, settings

    from harness.fuzz.strategies import problems, run_specs
    from harness.sglang.library import INSTALLED_EVICTION
    from harness.sglang.stack import free_order

    seen = []

    @settings(max_examples=12, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(run_specs(FuzzTarget(design="forward_batch", mode=Mode.EAGER, serving="sglang")))
    def collect(spec):
        seen.append(spec)

    collect()
    assert seen
    for spec in seen:
        assert spec.serving == "sglang" and spec.eviction.policy == INSTALLED_EVICTION
        assert spec.pool.free_order == free_order(spec.pool.page_size)
        assert spec.pool.kv_dtype != "fp8_e4m3"  # what the SGLang stack cannot express is never drawn
        assert problems(spec) == []


def test_a_clean_design_over_sglang_gives_no_false_alarm():
    report = fuzz(FuzzTarget(design="forward_batch", mode=Mode.EAGER, serving="sglang"), budget_s=300,
                  max_examples=8, seed=0, database=None)
    assert report.tried == 8 and not report.findings, "\n".join(f.describe() for f in report.findings)


@pytest.mark.slow
def test_a_fault_in_sglangs_own_scheduler_is_found_shrunk_and_written_as_a_scenario_that_reproduces(tmp_path):
    target = FuzzTarget.parse("forward_batch:eager:sglang_skip_evict_mid_prefill@sglang")
    report = fuzz(target, budget_s=600, max_examples=40, shrink_s=600, shrink_examples=200, seed=0, database=None,
                  multiple=False)
    assert len(report.findings) == 1, f"{report.tried} examples: " + "\n".join(f.describe() for f in report.findings)
    [finding] = report.findings
    shrunk = finding.spec.timeline
    # a chunked prompt that keeps every SWA slot its chunks leave behind the window, in a pool sized for the fix
    assert len(shrunk.requests) == 1 and shrunk.chunk_size is not None, finding.describe()
    assert finding.spec.serving == "sglang"
    path = write_regression(finding, folder=tmp_path, command=target.command(seed=0))
    assert path is not None and '"sglang"' in path.read_text()
    assert replay_regression(path) == []

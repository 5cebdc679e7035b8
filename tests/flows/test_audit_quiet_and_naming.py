"""The input audit is quiet on correct runs and names the cause on faulty ones, module-level state included."""

from pathlib import Path

import pytest
import torch

from harness.check.case import cases
from harness.check.run import execute, run_case
from harness.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2] / "scenarios"


@pytest.mark.parametrize("name", ["swa_decode_padded_buckets", "swa_mixed_continuous_batching",
                                  "swa_spec_draft_after_prefill", "swa_prefill_chunked_cross_window"])
def test_graph_runs_that_match_their_reference_report_no_finding(name):
    spec = load_scenario(ROOT / f"{name}.toml")
    for case in cases(spec, modes=["full", "piecewise"]):
        result = run_case(case)
        if result.verdict.outcome == "match":
            assert result.verdict.observations.findings == (), case.name


def _findings(path: str, design: str) -> set[tuple[str, str | None]]:
    spec = load_scenario(ROOT / path)
    case = next(c for c in cases(spec, designs=[design], modes=["full"]) if c.with_faults)
    result = run_case(case)
    assert result.ok, (case.name, result.verdict.outcome)
    return {(f.kind, f.path) for f in result.verdict.observations.findings}


def test_a_runner_that_rebinds_its_static_buffer_is_named_through_the_view_the_graph_reads():
    found = _findings("faults/swa_decode_rebind_static_swa_loc.toml", "forward_batch")
    # each bucket's graph reads a [:bs] view of the one buffer (bucket 4, the largest, reads all of it)
    assert {("stale", "runner.out_cache_loc_swa[:]"), ("stale", "runner.out_cache_loc_swa[:2]"),
            ("stale", "runner.out_cache_loc_swa[:1]")} <= found, found


def test_a_memo_frozen_at_capture_is_named_as_the_tensor_the_graph_reads():
    assert ("unregistered", "pool._memo_value") in _findings("faults/swa_decode_memo_frozen_at_capture.toml", "memoized")


_swa_loc: torch.Tensor | None = None  # module-level state of the design below


def module_state(forward_batch, pool, metadata, layer_id):
    """A design that keeps the SWA write locations in its module, refreshed only when not capturing."""
    global _swa_loc
    if not torch.cuda.is_current_stream_capturing():  # asked on every eager forward too
        _swa_loc = pool.translate_loc_from_full_to_swa(forward_batch.out_cache_loc)
    return _swa_loc


def test_module_level_state_of_a_design_is_named_module_dot_attr():
    spec = load_scenario(ROOT / "swa_decode_padded_buckets.toml")
    result = execute(spec.run_spec(design=f"{__name__}:module_state", mode="full", backend="torch_native"))
    assert result.error is None, result.error
    found = {(f.kind, f.path) for f in result.observations.findings}
    # the graph reads the tensor a warm-up run left in the module; each eager step then rebinds it
    assert {("unregistered", f"{__name__}._swa_loc"), ("stale", f"{__name__}._swa_loc")} <= found, found

"""The input audit is quiet on correct runs and names the cause on faulty ones, module-level state included."""

import ctypes
from pathlib import Path

import pytest
import torch

from harness.check.matrix.case import Selection, cases
from harness.check.run.drive import execute
from harness.check.matrix.matrix import run_case
from harness.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2] / "scenarios"


# the name with hyphens: `pytest -k swa_prefill` selects the scenario family's items, not this test too
@pytest.mark.parametrize("name", ["swa_decode_padded_buckets", "swa_mixed_continuous_batching",
                                  "swa_spec_draft_after_prefill", "swa_prefill_chunked_cross_window"],
                         ids=lambda name: name.replace("_", "-"))
@pytest.mark.slow
def test_graph_runs_that_match_their_reference_report_no_finding(name):
    spec = load_scenario(ROOT / f"{name}.toml")
    for case in cases(spec, Selection(modes=["full", "piecewise"])):
        result = run_case(case)
        if result.verdict.outcome == "match":
            assert result.verdict.observations.findings == (), case.name


def _findings(path: str, design: str) -> set[tuple[str, str | None]]:
    spec = load_scenario(ROOT / path)
    case = next(c for c in cases(spec, Selection(designs=[design], modes=["full"])) if c.with_faults)
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


def guarded_by_a_variable(forward_batch, pool, metadata, layer_id):
    """A sound design that takes another sound path while capturing, behind ``is_available()`` read first."""
    on_gpu = torch.cuda.is_available()
    if on_gpu and torch.cuda.is_current_stream_capturing():
        return pool.translate_loc_from_full_to_swa(forward_batch.out_cache_loc)
    if forward_batch.out_cache_loc_swa is not None:
        return forward_batch.out_cache_loc_swa
    return pool.translate_loc_from_full_to_swa(forward_batch.out_cache_loc)


def test_a_capture_query_guard_that_cannot_see_the_capture_is_noted_in_the_run():
    spec = load_scenario(ROOT / "swa_decode_padded_buckets.toml")
    result = execute(spec.run_spec(design=f"{__name__}:guarded_by_a_variable", mode="full", backend="torch_native"))
    assert result.error is None, result.error
    (note,) = result.observations.notes  # once, however many graphs and layers asked
    assert "on_gpu = torch.cuda.is_available()" in note and "cannot see the capture" in note
    assert result.observations.findings == ()


@torch.library.custom_op("harness_flows_test::copy_out_of_sight", mutates_args=())
def copy_out_of_sight(loc: torch.Tensor) -> torch.Tensor:
    """A copy of ``loc`` made by a kernel the dispatcher cannot see (as an FFI launch of FlashInfer's is)."""
    loc = loc.contiguous()
    out = torch.empty_like(loc)
    ctypes.memmove(out.data_ptr(), loc.data_ptr(), loc.numel() * loc.element_size())
    return out


def through_an_ffi_kernel(forward_batch, pool, metadata, layer_id):
    """The batch's SWA locations, as the forward_batch design finds them, passed through an opaque kernel."""
    loc = forward_batch.out_cache_loc_swa
    if loc is None:
        loc = pool.translate_loc_from_full_to_swa(forward_batch.out_cache_loc)
    return copy_out_of_sight(loc)


@pytest.mark.slow
def test_graph_statistics_name_the_ops_replay_calls_again():
    spec = load_scenario(ROOT / "swa_decode_padded_buckets.toml")
    result = execute(spec.run_spec(design=f"{__name__}:through_an_ffi_kernel", mode="full", backend="torch_native"))
    assert result.error is None, result.error
    assert result.observations.rerun_ops == ("harness_flows_test::copy_out_of_sight",)
    assert result.observations.findings == ()

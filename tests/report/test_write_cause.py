"""The write log names which forward left what the first divergent slot holds, in every mode: an eager cache
bug has no input audit, so this line is its cause (which step's forward wrote the stale K/V)."""

from __future__ import annotations

from pathlib import Path

from harness.check.matrix.case import cases
from harness.check.matrix.matrix import run_case
from harness.report.build import case_view
from harness.report.cause import write_cause
from harness.report.text import failure_block
from harness.report.views import CaseView
from harness.scenario.loader import load_scenario

ROOT = Path(__file__).resolve().parents[2]


def _view(path: str, name: str) -> CaseView:
    [case] = [c for c in cases(load_scenario(ROOT / path)) if c.name == name]
    return case_view(run_case(case))


def test_an_eager_stale_plan_names_the_earlier_eager_forward_that_wrote_the_slot():
    view = _view("scenarios/faults/swa_decode_stale_plan_reused.toml",
                 "swa_decode_stale_plan_reused[plan-eager-torch_native]")
    first = view.first
    assert view.verdict == "diverge" and first is not None and first.classification == "overwritten"
    assert first.written_at is not None and first.written_at <= first.step
    text = write_cause(view)
    assert text is not None and f"slot {first.slot}" in text and "an eager forward" in text
    assert f"written: {text}" in failure_block(view)
    # the record round-trips the step
    assert CaseView.from_record(view.to_record()).first.written_at == first.written_at


def test_a_slot_nothing_wrote_says_so_and_a_match_has_no_line():
    view = _view("scenarios/swa_prefill_untranslated_write_chunked.toml",
                 "swa_prefill_untranslated_write_chunked[untranslated-eager-torch_native]")
    assert view.first is not None and view.first.written_at is None
    assert write_cause(view) == (f"nothing wrote {view.first.pool} slot {view.first.slot} (layer {view.first.layer}) "
                                 "since it was poisoned (the write log)")
    clean = _view("scenarios/swa_decode_padded_buckets.toml", "swa_decode_padded_buckets[translate-eager-torch_native]")
    assert clean.verdict == "match" and write_cause(clean) is None


def test_the_scenario_page_shows_the_line_beside_the_first_divergence():
    from harness.report.scenario_page import scenario_page
    view = _view("scenarios/faults/swa_decode_stale_plan_reused.toml",
                 "swa_decode_stale_plan_reused[plan-eager-torch_native]")
    page = scenario_page([view], index_href="../index.html", anchors={view.name: "run-0"})
    [section] = page.sections
    assert section.written == write_cause(view) is not None

"""The report session writes the JSON results and the HTML report for both front ends: the CLI gives it its
plan (run names in the matrix's order), pytest's controller does not."""

from __future__ import annotations

import json

from harness.report.session import ReportSession


def test_a_planned_session_lists_runs_in_the_plans_order_however_they_finish(sample_views, tmp_path):
    planned = [v.name for v in reversed(sample_views)]  # not the (path, name) order an unplanned session uses
    session = ReportSession(json_path=tmp_path / "r.json", report_dir=tmp_path / "rep", planned=planned)
    for view in sorted(sample_views, key=lambda v: v.mismatches):
        session.add(view)
    assert session.finish() == [tmp_path / "r.json", tmp_path / "rep" / "index.html"]
    assert [v.name for v in session.ordered()] == planned
    for path in (tmp_path / "r.json", tmp_path / "rep" / "results.json"):
        assert [r["name"] for r in json.loads(path.read_text())["records"]] == planned


def test_a_planned_session_interrupted_before_its_first_result_still_says_so(tmp_path):
    session = ReportSession(json_path=tmp_path / "r.json", report_dir=tmp_path / "rep",
                            planned=["tiny_match[translate-eager-torch_native]"],
                            load_errors=[("a.toml: pool.swa_size: expected an integer", "a.toml: model: unknown")])
    session.finish(complete=False)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert (doc["complete"], doc["records"]) == (False, [])
    assert "Incomplete:" in (tmp_path / "rep" / "index.html").read_text()
    # two problems of one file: one file failed to load
    assert session.summary_lines() == ["0 runs: 0 as expected, 0 unexpected, 1 scenario files failed to load"]


def test_a_pytest_session_without_scenario_items_writes_nothing(tmp_path):
    session = ReportSession(json_path=tmp_path / "r.json", report_dir=tmp_path / "rep")
    assert session.finish(complete=False) == [] and session.summary_lines() == []
    assert list(tmp_path.iterdir()) == []

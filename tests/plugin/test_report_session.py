"""The report session gathers every scenario item's result, across pytest-xdist workers, without loss; the one
xdist run here also shows that workers give the outcomes one process gives."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from .test_collection import QUIET, _match_lines
from .test_isolation import check_misbehaving

SAMPLES = Path(__file__).parent / "samples"


def _names(doc: dict) -> list[str]:
    return [r["name"] for r in doc["records"]]


@pytest.mark.slow
def test_xdist_workers_give_one_processs_outcomes_and_merge_results_into_one_json_without_loss(harness_pytester,
                                                                                               add_scenario):
    # one xdist run (workers start slowly: each imports torch) checks three claims: the outcomes, a failure
    # and a load failure included, are those of one process; results merge into one JSON and one report
    # without loss; and misbehaving designs end as error verdicts under xdist as under the CLI
    add_scenario("tiny_wrong_window")
    add_scenario("tiny_stale_error", replace={'verdict = "error"': 'verdict = "match"'})  # one failure to carry over
    add_scenario("broken", "tiny_wrong_window", replace={"prompt_len = 12": "prompt_len = 0"})  # and a load failure
    add_scenario("tiny_misbehaving")
    shutil.copy(SAMPLES / "misbehaving_designs.py", harness_pytester.path)
    serial = harness_pytester.runpytest_inprocess(*QUIET, "--harness-json", "serial.json")
    parallel = harness_pytester.runpytest_inprocess(*QUIET, "-n", "2", "--harness-json", "parallel.json",
                                                    "--harness-report", "rep", "--junitxml", "junit.xml")
    # tiny_wrong_window: its run, the -nofault rerun, the oracle item; tiny_stale_error: two runs (one fails)
    # and the oracle item; broken: its load item (fails); tiny_misbehaving: five runs and the oracle item
    serial.assert_outcomes(passed=11, failed=2)
    parallel.assert_outcomes(passed=11, failed=2)
    _match_lines(parallel, ["*2 workers*"])
    _match_lines(parallel, ["*/broken.toml: timeline.requests[0].prompt_len: expected an integer from 1 to *"])
    _match_lines(parallel, ["tiny_stale_error[stale_state-eager-torch_native]: expected match, observed error"])
    one = json.loads((harness_pytester.path / "serial.json").read_text())
    two = json.loads((harness_pytester.path / "parallel.json").read_text())
    check_misbehaving([r for r in two["records"] if r["scenario"] == "tiny_misbehaving"])
    # every scenario item arrives once, in the same order (13 items: 3 oracle items and a load item carry no case)
    assert len(_names(one)) == len(set(_names(one))) == 9
    assert _names(one) == _names(two)
    strip = lambda doc: [{k: v for k, v in r.items() if k != "duration_s"} for r in doc["records"]]  # noqa: E731
    assert strip(one) == strip(two)
    assert one["complete"] is True and one["version"] == 1
    parallel.stdout.fnmatch_lines(["*SWA harness verdicts*", "*8 as expected, 1 unexpected*", "KV results: *parallel.json",
                                   f"KV report: {(harness_pytester.path / 'rep' / 'index.html').resolve().as_uri()}"])
    # the HTML report is written once, by the controller, from the same merged views
    rep = harness_pytester.path / "rep"
    assert strip(json.loads((rep / "results.json").read_text())) == strip(two)
    assert sorted(p.name for p in (rep / "scenarios").iterdir()) == [
        "tiny_misbehaving.html", "tiny_stale_error.html", "tiny_wrong_window.html"]
    index = (rep / "index.html").read_text()
    assert index.count("<tr data-run ") == 9
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', index).group(1))
    assert [r["name"] for r in data["runs"]] == _names(two)
    _check_junit_is_small(harness_pytester.path / "junit.xml")


def _check_junit_is_small(path: Path) -> None:
    """JUnit XML holds each scenario item's verdict and expectation, never its whole record."""
    cases = {c.get("name"): c for c in ET.parse(path).getroot().iter("testcase")}
    failing = cases["tiny_stale_error[stale_state-eager-torch_native]"]
    props = {p.get("name"): p.get("value") for p in failing.iter("property")}
    assert props.keys() == {"expected", "verdict", "first_divergence"}, props
    assert (props["expected"], props["verdict"]) == ("match", "error") and "\n" not in props["first_divergence"]
    for case in cases.values():
        for prop in case.iter("property"):
            assert len(prop.get("value")) <= 100 and "{" not in prop.get("value"), (case.get("name"), prop.get("value"))


def test_a_failing_item_still_reaches_the_session(harness_pytester, add_scenario):
    add_scenario("tiny_wrong_window", replace={'verdict = "diverge"': 'verdict = "match"'})
    result = harness_pytester.runpytest_inprocess("-q", "--harness-json", "r.json")
    result.assert_outcomes(passed=2, failed=1)
    doc = json.loads((harness_pytester.path / "r.json").read_text())
    bad = [r for r in doc["records"] if not r["ok"]]
    assert [(r["expected"], r["verdict"]) for r in bad] == [("match", "diverge")]

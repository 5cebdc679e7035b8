"""Issue 26: a verdict does not depend on how a change reaches the harness. Each test plugs in code written
outside the harness (``own_engine/``), named by import path as a user names theirs.

A design added on the command line is judged by borrowed expectations; under a fault scenario's faults none
is known (the fault corrupts the inputs of the designs the scenario lists, which an added one may never read),
so those runs are information and only the clean runs and the faults-off reruns can make it unexpected.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from harness.check.matrix import expect as matrix_expect
from harness.check.matrix.case import INFORMATION, Selection, cases
from harness.check.matrix.matrix import run_case, run_cases
from harness.cli import main
from harness.report import views as report_views
from harness.report.build import case_view
from harness.report.text import failure_block, information_line
from harness.scenario import load_scenario

LIBRARY = Path(__file__).resolve().parents[2] / "scenarios"
GOOD = "tests.extending.own_engine.designs:translating"
WRONG = "tests.extending.own_engine.designs:flipped"
HANGS = "tests.extending.own_engine.designs:hangs_on_decode"
PAD_TAIL = LIBRARY / "faults" / "swa_decode_pad_tail_not_zeroed.toml"
"""forward_batch diverges in full mode under the fault (the padded slot reaches its out_cache_loc_swa); a design
that translates out_cache_loc itself never reads it and matches"""
NO_PRESET = LIBRARY / "faults" / "swa_decode_no_preset_swa_loc.toml"
"""states no faults-off verdict of forward_batch"""


def _added(path: Path, design: str, *, expect: str | None = None, modes: tuple[str, ...] = ()):
    return cases(load_scenario(path), Selection(designs=[design], extra_designs=[design], backends=["torch_native"],
                                                modes=modes), expect=expect)


def test_the_information_expectation_is_one_word_in_the_checking_and_the_records():
    assert matrix_expect.INFORMATION == report_views.INFORMATION == INFORMATION


def test_by_default_a_run_under_the_faults_is_information_and_its_faults_off_rerun_is_always_made():
    default = _added(NO_PRESET, GOOD)
    assert {c.with_faults: c.expected for c in default} == {True: INFORMATION, False: "match"}
    assert sorted(c.with_faults for c in default) == [False, True]  # one mode on torch_native
    rerun = next(c for c in default if not c.with_faults)
    assert "forward_batch is declared sound" in rerun.why
    # the reproduce line reruns it the same way: no --expect, which would state the default's faulted verdict
    assert "--expect" not in case_view(None, case=default[0]).reproduce_cli
    stated = _added(NO_PRESET, GOOD, expect="like:forward_batch")
    assert [(c.with_faults, c.expected) for c in stated] == [(True, "match")]  # and no faults-off rerun
    assert "--expect like:forward_batch" in case_view(None, case=stated[0]).reproduce_cli


def test_a_correct_added_design_exits_0_where_forward_batch_is_expected_to_diverge(capsys):
    code = main(["run", str(PAD_TAIL), "--design", GOOD, "--backend", "torch_native", "--mode", "full",
                 "--jobs", "1", "-v"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "UNEXPECTED" not in out and "in the scenario file" not in out
    assert f"swa_decode_pad_tail_not_zeroed[{GOOD}-full-torch_native]" in out and "fault misses it" in out
    assert ("1 run of added designs under injected faults has no known verdict and counts as expected "
            "(information): the fault reached the design in 0 (not a match), not in 1 (a match)") in out


def test_a_planted_wrong_design_is_still_unexpected_on_clean_runs_and_information_under_the_faults():
    runs = _added(LIBRARY / "swa_prefill_window_edge.toml", WRONG, modes=("eager",)) + _added(
        PAD_TAIL, WRONG, modes=("full",))
    views = {(v.scenario, v.clean_rerun): v for v in (case_view(run_case(c)) for c in runs)}
    clean = views["swa_prefill_window_edge", False]
    assert (clean.expected, clean.verdict, clean.ok) == ("match", "diverge", False)
    faulted, rerun = views["swa_decode_pad_tail_not_zeroed", False], views["swa_decode_pad_tail_not_zeroed", True]
    assert (faulted.expected, faulted.verdict, faulted.ok) == (INFORMATION, "diverge", True)
    assert (rerun.expected, rerun.verdict, rerun.ok) == ("match", "diverge", False)
    assert "the fault reached the design in 1 (not a match), not in 0" in information_line(list(views.values()))


def test_an_unexpected_pass_of_an_added_design_never_says_to_update_the_scenario_file():
    stated = _added(PAD_TAIL, GOOD, expect="like:forward_batch", modes=("full",))
    view = case_view(run_case(next(c for c in stated if c.with_faults)))
    assert (view.expected, view.verdict, view.unexpected_pass, view.added_design) == ("diverge", "match", True, True)
    block = failure_block(view)
    assert block.startswith("UNEXPECTED PASS") and "--expect states another" in block
    assert "in the scenario file" not in block
    # the same pass of a design the scenario lists is a known bug that no longer reproduces
    assert "update the expectation and its why in the scenario file" in failure_block(
        dataclasses.replace(view, added_design=False))


@pytest.mark.parametrize("verdict", ["match", "diverge"])
def test_an_information_run_is_never_an_unexpected_pass_nor_unexpected(verdict):
    case = next(c for c in _added(PAD_TAIL, GOOD, modes=("full",)) if c.with_faults)
    view = dataclasses.replace(case_view(None, case=case), verdict=verdict, skip_reason=None)
    assert view.ok and not view.unexpected_pass and view.information


def test_x_stops_a_cli_run_at_the_first_unexpected_run(capsys, tmp_path):
    results = tmp_path / "r.json"
    code = main(["run", str(LIBRARY / "swa_prefill_window_edge.toml"), "--design", WRONG, "--backend", "torch_native",
                 "--jobs", "1", "-x", "--json", str(results)])
    err = capsys.readouterr().err
    assert code == 1
    assert "stopped after 1 unexpected run (--maxfail 1): 1 of 3 runs finished" in err
    doc = json.loads(results.read_text())
    assert doc["complete"] is False and [r["ok"] for r in doc["records"]] == [False]


def test_a_run_that_hangs_is_stopped_and_shows_where_its_main_thread_was():
    (case,) = cases(load_scenario(LIBRARY / "swa_decode_past_window_reuse.toml"),
                    Selection(designs=[HANGS], extra_designs=[HANGS], backends=["torch_native"], modes=["eager"],
                              timeout_s=1.0))
    (result,) = run_cases([case], jobs=1)
    view = case_view(result)
    assert (view.verdict, view.error.type, view.error.message) == ("error", "Timeout", "timed out after 1 s")
    where = [(Path(f.file).name, f.function) for f in view.error.frames]
    assert where[-2:] == [("designs.py", "hangs_on_decode"), ("designs.py", "_spin_forever")]
    assert all(f.line > 0 for f in view.error.frames[-2:])
    block = failure_block(view)
    assert "  stopped at, innermost last (its main thread when the time limit ran out" in block
    assert "designs.py:" in block and "in _spin_forever" in block

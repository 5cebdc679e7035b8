"""The pytest front end: scenario files collected as items, judged against their expectations, reported.

Every test runs a nested pytest (``pytester``) over a few tiny sample scenarios from ``samples/``.
"""

from __future__ import annotations

import re

import pytest

from harness.collect import BadScenarioItem, OracleItem, ScenarioItem

MATCH = "tiny_match"  # all-swa; translate, stale_state, forward_batch; eager and full; every verdict match
WINDOW = "tiny_wrong_window"  # gpt-oss-mini, window_from_wrong_layer, forward_batch eager: diverge / nofault match
STALE_ERROR = "tiny_stale_error"  # eager drafts of another length than the previous batch: stale_state error,
#                                   forward_batch match

ITEM_ID = re.compile(r"^(?P<scenario>\w+)\[(?P<design>[\w.:]+)-(?P<mode>eager|full|piecewise)-(?P<backend>\w+)"
                     r"(?P<nofault>-nofault)?\]$")
QUIET = ("-p", "no:cacheprovider")


def _match_lines(result: pytest.RunResult, patterns: list[str]) -> None:
    """``fnmatch_lines`` with only ``*`` as a wildcard: item names are full of ``[...]``, which fnmatch reads
    as character classes."""
    result.stdout.re_match_lines([".*".join(map(re.escape, p.split("*"))) + "$" for p in patterns])


def _names(items) -> list[str]:
    return [item.name for item in items]


def _selected(result: pytest.RunResult) -> list[str]:
    """Item names of a ``--collect-only -q`` listing."""
    return sorted(line.split("::", 1)[1] for line in result.outlines if "::" in line)


def _reports(reprec, outcome: str) -> dict[str, object]:
    passed, skipped, failed = reprec.listoutcomes()
    return {rep.nodeid.split("::", 1)[1]: rep
            for rep in {"passed": passed, "skipped": skipped, "failed": failed}[outcome]}


# ---- collection and selection ---------------------------------------------------------------------------


def test_item_ids_are_scenario_design_mode_backend_plus_one_oracle_item(harness_pytester, add_scenario):
    add_scenario(MATCH)
    items, _ = harness_pytester.inline_genitems(*QUIET)
    oracle = [i for i in items if isinstance(i, OracleItem)]
    runs = [i for i in items if isinstance(i, ScenarioItem)]
    assert _names(oracle) == ["tiny_match[oracle-torch_native]"]
    assert len(runs) + len(oracle) == len(items)
    assert sorted(_names(runs)) == sorted(
        f"tiny_match[{d}-{m}-torch_native]"
        for d in ("translate", "stale_state", "forward_batch") for m in ("eager", "full")
    )
    for item in runs:
        parts = ITEM_ID.match(item.name)
        assert parts, item.name
        assert (parts["scenario"], parts["design"], parts["mode"], parts["backend"]) == (
            "tiny_match", item.case.design, item.case.mode, item.case.backend
        )
        assert item.nodeid == f"scenarios/tiny_match.toml::{item.name}"


def test_the_quick_suite_keeps_each_designs_verdict_once_under_graphs_and_marks_the_rest_slow(harness_pytester,
                                                                                                add_scenario):
    add_scenario(MATCH)  # every design matches in eager and full
    add_scenario(WINDOW)  # a fault scenario: forward_batch eager diverges, its clean rerun matches
    items, _ = harness_pytester.inline_genitems(*QUIET)
    slow = {i.name for i in items if i.get_closest_marker("slow") is not None}
    quick = {i.name for i in items} - slow
    assert {n for n in quick if n.startswith("tiny_match")} == {
        "tiny_match[oracle-torch_native]",
        *(f"tiny_match[{d}-full-torch_native]" for d in ("translate", "stale_state", "forward_batch")),
    }
    assert {n for n in slow if n.startswith("tiny_match")} == {
        f"tiny_match[{d}-eager-torch_native]" for d in ("translate", "stale_state", "forward_batch")}
    window = [i for i in items if i.name.startswith("tiny_wrong_window") and isinstance(i, ScenarioItem)]
    assert window and all((i.name in slow) == (not i.case.with_faults) for i in window)


def test_k_with_a_scenario_family_prefix_selects_only_that_scenarios_items(harness_pytester, add_scenario):
    add_scenario("decode_tiny", MATCH)
    add_scenario("draft_length_error", STALE_ERROR)
    result = harness_pytester.runpytest_inprocess("--collect-only", "-q", "-k", "decode", *QUIET)
    selected = _selected(result)
    assert selected and all(name.startswith("decode_tiny[") for name in selected), selected
    assert "decode_tiny[oracle-torch_native]" in selected
    assert len(selected) == 7  # 3 designs x 2 modes + the oracle item
    _match_lines(result, ["*7/10 tests collected (3 deselected)*"])


def test_k_with_a_design_name_selects_that_design_across_files(harness_pytester, add_scenario):
    add_scenario(MATCH)
    add_scenario(WINDOW)
    add_scenario(STALE_ERROR)
    result = harness_pytester.runpytest_inprocess("--collect-only", "-q", "-k", "stale_state", *QUIET)
    assert _selected(result) == sorted([
        "tiny_match[stale_state-eager-torch_native]",
        "tiny_match[stale_state-full-torch_native]",
        "tiny_stale_error[stale_state-eager-torch_native]",
    ])


def test_k_with_a_tag_selects_the_tagged_scenario(harness_pytester, add_scenario):
    add_scenario(MATCH)  # tags smoke, tiny
    add_scenario(WINDOW)  # tags fault, window
    result = harness_pytester.runpytest_inprocess("--collect-only", "-q", "-k", "smoke", *QUIET)
    selected = _selected(result)
    assert len(selected) == 6 and all(name.startswith("tiny_match[") for name in selected), selected


def test_only_toml_files_in_a_scenarios_folder_inside_the_project_are_collected(harness_pytester, write_scenario):
    # the project itself is checked out under a folder named "scenarios": that ancestor must not make every
    # .toml file of the project (pyproject.toml included) a scenario
    project = harness_pytester.mkdir("scenarios") / "proj"
    project.mkdir()
    (project / "conftest.py").write_text('pytest_plugins = ["harness.plugin"]\n')
    (project / "pyproject.toml").write_text('[tool.pytest.ini_options]\naddopts = "-p no:cacheprovider"\n')
    write_scenario(project, STALE_ERROR)
    write_scenario(project / "other", MATCH).rename(project / "other" / "tiny_match.toml")
    result = harness_pytester.runpytest_inprocess("--collect-only", "-q", "--rootdir", str(project), str(project))
    collected = [line for line in result.outlines if "::" in line]
    assert collected and all(line.startswith("scenarios/tiny_stale_error.toml::") for line in collected), collected


# ---- verdicts against expectations ----------------------------------------------------------------------


def test_items_whose_observed_verdict_is_the_expected_one_pass(harness_pytester, add_scenario):
    add_scenario(MATCH)
    reprec = harness_pytester.inline_run(*QUIET)
    reprec.assertoutcome(passed=7, failed=0)
    passed = _reports(reprec, "passed")
    props = dict(passed["tiny_match[translate-full-torch_native]"].user_properties)
    assert (props["expected"], props["verdict"]) == ("match", "match")


def test_expecting_diverge_for_a_design_that_matches_fails_as_unexpected_pass(harness_pytester, add_scenario):
    add_scenario(MATCH, replace={'verdict = "match"\nwhy = "translates': 'verdict = "diverge"\nwhy = "translates'})
    result = harness_pytester.runpytest_inprocess(*QUIET)
    result.assert_outcomes(passed=5, failed=2)  # translate eager and full fail; the other designs and the oracle pass
    _match_lines(result, [
        "*UNEXPECTED PASS tiny_match[translate-eager-torch_native]: expected diverge, observed match*",
        "*reproduce: pytest 'scenarios/tiny_match.toml::tiny_match[translate-eager-torch_native]'"
        "   or   python -m harness run scenarios/tiny_match.toml --design translate --mode eager "
        "--backend torch_native --engine tape",
    ])
    assert result.stdout.str().count("UNEXPECTED PASS") >= 2
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_expecting_match_where_the_run_diverges_fails_with_where_it_diverged(harness_pytester, add_scenario):
    add_scenario(WINDOW, replace={'verdict = "diverge"': 'verdict = "match"'})
    result = harness_pytester.runpytest_inprocess(*QUIET)
    result.assert_outcomes(passed=2, failed=1)  # the -nofault rerun and the oracle item still pass
    failing = "tiny_wrong_window[forward_batch-eager-torch_native]"
    _match_lines(result, [
        f"{failing}: expected match, observed diverge",
        "*why expected:*",
        "*faults: window_from_wrong_layer",
        "*observed: diverge: first at step *, * pool, layer *, slot * (owner long@*): *",
        f"*reproduce: pytest 'scenarios/tiny_wrong_window.toml::{failing}'   or   python -m harness run "
        "scenarios/tiny_wrong_window.toml --design forward_batch --mode eager --backend torch_native --engine tape",
    ])
    out = result.stdout.str()
    assert "UNEXPECTED PASS" not in out
    assert "Traceback" not in out  # the failure block replaces the traceback

    # the reproduce command's node id selects the failing item, and only it
    again = harness_pytester.runpytest_inprocess(f"scenarios/tiny_wrong_window.toml::{failing}", *QUIET)
    again.assert_outcomes(failed=1)


def test_without_faults_adds_a_nofault_item_that_runs_without_the_faults(harness_pytester, add_scenario):
    add_scenario(WINDOW)
    items, _ = harness_pytester.inline_genitems(*QUIET)
    by_name = {item.name: item for item in items}
    faulty = by_name["tiny_wrong_window[forward_batch-eager-torch_native]"]
    clean = by_name["tiny_wrong_window[forward_batch-eager-torch_native-nofault]"]
    assert sorted(by_name) == sorted([faulty.name, clean.name, "tiny_wrong_window[oracle-torch_native]"])
    assert faulty.case.faults == {"window_from_wrong_layer"} and clean.case.faults == frozenset()
    assert clean.case.run_spec().faults == frozenset()

    reprec = harness_pytester.inline_run(*QUIET)
    reprec.assertoutcome(passed=3)
    passed = _reports(reprec, "passed")
    faulty_props, clean_props = dict(passed[faulty.name].user_properties), dict(passed[clean.name].user_properties)
    assert (faulty_props["expected"], faulty_props["verdict"]) == ("diverge", "diverge")
    assert (clean_props["expected"], clean_props["verdict"]) == ("match", "match")


def test_an_error_verdict_expected_as_error_passes(harness_pytester, add_scenario):
    add_scenario(STALE_ERROR)
    reprec = harness_pytester.inline_run(*QUIET)
    reprec.assertoutcome(passed=3)
    props = dict(_reports(reprec, "passed")["tiny_stale_error[stale_state-eager-torch_native]"].user_properties)
    assert (props["expected"], props["verdict"]) == ("error", "error")


def test_an_error_verdict_where_match_is_expected_fails_with_the_exception(harness_pytester, add_scenario):
    add_scenario(STALE_ERROR, replace={'verdict = "error"': 'verdict = "match"'})
    result = harness_pytester.runpytest_inprocess(*QUIET)
    result.assert_outcomes(passed=2, failed=1)
    _match_lines(result, [
        "tiny_stale_error[stale_state-eager-torch_native]: expected match, observed error",
        "*observed: error at step *: RuntimeError: *shape*",
        "*reproduce: *",
    ])


# ---- bad files ------------------------------------------------------------------------------------------


def test_an_invalid_file_fails_as_one_load_item_while_a_good_file_passes(harness_pytester, add_scenario):
    bad = add_scenario("broken", MATCH, replace={"swa_size = 16": "swa_size = 1"})
    add_scenario(STALE_ERROR)
    items, _ = harness_pytester.inline_genitems(*QUIET)
    loaders = [i for i in items if isinstance(i, BadScenarioItem)]
    assert _names(loaders) == ["broken[load]"]
    assert not any(i.name.startswith("broken[") for i in items if i not in loaders)

    result = harness_pytester.runpytest_inprocess(*QUIET)
    result.assert_outcomes(failed=1, passed=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    _match_lines(result, [
        f"{bad}: pool.swa_size: expected an integer from 2 to *, got 1",
        "FAILED scenarios/broken.toml::broken[load]*",
    ])


# ---- pytest-xdist ---------------------------------------------------------------------------------------

# that two workers give one process's outcomes is checked in test_report_session.py, on the one xdist run
# that also merges their results


# ---- the oracle item ------------------------------------------------------------------------------------

# runs neither the reference design (forward_batch) nor the reference mode (eager), which the oracle item
# certifies regardless: the reference run is the scenario's, not one of its cells
REFERENCE_NOT_IN_MATRIX = '''
description = "translate under decode graphs only"
[model]
preset = "all-swa"
[pool]
full_size = 32
swa_size = 16
[graphs]
modes = ["full"]
decode_buckets = [1, 2]
[run]
designs = ["translate"]
[timeline]
[[timeline.requests]]
prompt_len = 5
output_len = 3
[expect.translate]
verdict = "match"
why = "translates out_cache_loc in every layer"
'''


def test_oracle_item_certifies_a_scenario_that_runs_neither_forward_batch_nor_eager(harness_pytester, add_scenario):
    add_scenario("graphs_only", text=REFERENCE_NOT_IN_MATRIX)
    result = harness_pytester.runpytest_inprocess("-rf", *QUIET)
    result.assert_outcomes(passed=4)  # its one case and its oracle item, under each of the two CPU backends


"""Trying your own design, backend or runner on the library: judged by what the library knows of a listed
design, fault scenarios rerun with the faults off, the totals apart for clean runs and injected faults, runs
selected with -k and --no-faults, and reproduce lines that rerun exactly the printed run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.check.matrix.case import Selection, cases
from harness.cli import main
from harness.scenario import load_scenario

from .conftest import SAMPLES

LIBRARY = Path(__file__).resolve().parents[2] / "scenarios"
REFERENCE_BY_PATH = "harness.serving.designs:forward_batch"


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def own_designs(cli_dir: Path, monkeypatch: pytest.MonkeyPatch, fresh_sample_modules: None) -> Path:
    """``own_designs.py`` beside the scenarios, importable as a user's module in the working directory is (and
    imported from there, not from where an earlier test left it)."""
    (cli_dir / "own_designs.py").write_text((SAMPLES / "own_designs.py").read_text())
    monkeypatch.syspath_prepend(str(cli_dir))
    return cli_dir


def _expectations(scenario, design: str, expect: str | None = None) -> dict[tuple[str, str, bool], str]:
    return {(c.mode, c.backend, c.with_faults): c.expected
            for c in cases(scenario, Selection(designs=[design], extra_designs=[design] if ":" in design else ()),
                           expect=expect)}


def test_the_reference_design_by_import_path_like_forward_batch_expects_what_it_gets_with_and_without_the_faults():
    scenario = load_scenario(LIBRARY / "faults" / "swa_decode_pad_seq_len_zero.toml")  # by_backend overrides too
    added = _expectations(scenario, REFERENCE_BY_PATH, "like:forward_batch")
    assert added == _expectations(scenario, "forward_batch")
    assert {with_faults for _, _, with_faults in added} == {True, False}
    assert set(added.values()) == {"match", "diverge"}  # diverge under the fault in one backend's decode graphs
    # by default the runs under the fault have no known verdict; the faults-off reruns keep forward_batch's
    default = _expectations(scenario, REFERENCE_BY_PATH)
    assert {k: v for k, v in default.items() if not k[2]} == {k: v for k, v in added.items() if not k[2]}
    assert {v for k, v in default.items() if k[2]} == {"information"}


def test_like_a_design_the_scenario_does_not_list_skips_its_runs_saying_why():
    scenario = load_scenario(LIBRARY / "swa_paged_untranslated_write.toml")
    assert "forward_batch" not in scenario.designs
    added = [c for c in cases(scenario, Selection(extra_designs=[REFERENCE_BY_PATH])) if c.design == REFERENCE_BY_PATH]
    assert added and {c.unsupported for c in added} == {
        "the scenario lists no forward_batch, whose expectations an added design takes here"}
    like_translate = [c for c in cases(scenario, Selection(extra_designs=[REFERENCE_BY_PATH]), expect="like:translate")
                      if c.design == REFERENCE_BY_PATH]
    assert [c.unsupported for c in like_translate] == [None] * len(added)


def test_a_fixed_expectation_reruns_a_fault_scenario_with_the_faults_off():
    scenario = load_scenario(LIBRARY / "faults" / "swa_decode_no_preset_swa_loc.toml")  # no without_faults stated
    fixed = cases(scenario, Selection(designs=["x:y"], extra_designs=["x:y"]), expect="match")
    like = cases(scenario, Selection(designs=["x:y"], extra_designs=["x:y"]), expect="like:forward_batch")
    default = cases(scenario, Selection(designs=["x:y"], extra_designs=["x:y"]))
    assert sorted(c.with_faults for c in fixed) == [False, False, True, True]
    assert sorted(c.with_faults for c in like) == [True, True]  # forward_batch states no faults-off verdict here
    assert sorted(c.with_faults for c in default) == [False, False, True, True]  # by default: always


@pytest.mark.parametrize("expect, problem", [
    ("like:nope", "like:nope: unknown design 'nope'; known designs: translate"),
    ("like:stale_stat", "like:stale_stat: unknown design 'stale_stat' (did you mean 'stale_state'?); known designs:"),
    ("matched", "expected one of match, diverge, error, invariant, or like:DESIGN"),
])
def test_expect_refuses_what_is_neither_a_verdict_nor_like_a_design(cli_dir, capsys, expect, problem):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--expect", expect])
    assert exit_.value.code == 2 and problem in capsys.readouterr().err


def test_a_correct_own_design_exits_0_and_a_planted_wrong_one_is_unexpected_on_clean_runs_only(
        own_designs, capsys, write_scenario):
    write_scenario(own_designs, "tiny_match")
    write_scenario(own_designs, "tiny_wrong_window")  # injects window_from_wrong_layer
    code, out, err = run_cli(capsys, "run", "--jobs", "1", "--design", "own_designs:good")
    assert code == 0, out + err
    assert ("clean runs (no fault injected): 3 as expected, 0 unexpected; "
            "under the library's injected faults: 1 as expected, 0 unexpected") in out
    code, out, err = run_cli(capsys, "run", "--jobs", "1", "--design", "own_designs:wrong", "--json", "r.json")
    assert code == 1
    doc = json.loads(Path("r.json").read_text())
    unexpected = sorted(r["name"] for r in doc["records"] if not r["ok"])
    assert unexpected == ["tiny_match[own_designs:wrong-eager-torch_native]",
                          "tiny_match[own_designs:wrong-full-torch_native]"]
    assert doc["totals"] == {"clean": {"as_expected": 1, "unexpected": 2, "skipped": 0},
                             "injected_faults": {"as_expected": 1, "unexpected": 0, "skipped": 0}}
    assert "clean runs (no fault injected): 1 as expected, 2 unexpected;" in out
    assert "swa pool, layer 1, slot 4 (owner a@3): misplaced" in out  # where the planted bug put a row


def test_a_runner_named_by_import_path_replaces_the_modes_built_in_one(own_designs, capsys, write_scenario):
    write_scenario(own_designs, "tiny_match")
    code, out, _ = run_cli(capsys, "run", "--jobs", "1", "--design", "forward_batch",
                           "--runner", "full=own_designs:DoublingRunner", "--json", "r.json")
    records = {r["name"]: r for r in json.loads(Path("r.json").read_text())["records"]}
    full = records["tiny_match[forward_batch-full=own_designs:DoublingRunner-torch_native]"]
    eager = records["tiny_match[forward_batch-eager-torch_native]"]
    assert (full["expected"], full["verdict"], full["first"]["pool"]) == ("match", "diverge", "hidden")
    assert (eager["expected"], eager["verdict"]) == ("match", "match")  # the reference keeps the built-in runner
    assert "--runner full=own_designs:DoublingRunner" in full["reproduce_cli"]
    assert code == 1


@pytest.mark.parametrize("runner, problem", [
    ("fast=own_designs:DoublingRunner", "expected MODE=package.module:Class, MODE one of eager, full, piecewise"),
    ("ful=own_designs:DoublingRunner", "got 'ful=own_designs:DoublingRunner'; unknown mode 'ful' (did you mean 'full'?)"),
    ("full=own_designs:good", "runner 'own_designs:good' is not a class"),
])
def test_a_bad_runner_is_refused_before_anything_runs(own_designs, capsys, runner, problem):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--runner", runner])
    assert exit_.value.code == 2 and problem in capsys.readouterr().err


def test_k_selects_by_name_and_tag_and_says_when_it_matches_nothing(cli_dir, capsys, write_scenario):
    write_scenario(cli_dir, "tiny_match")  # tags smoke, tiny
    write_scenario(cli_dir, "tiny_wrong_window")  # tags fault, window
    code, out, _ = run_cli(capsys, "run", "--jobs", "1", "-k", "smoke and forward_batch-eager or window and not nofault",
                           "--json", "r.json")
    assert code == 0
    assert [r["name"] for r in json.loads(Path("r.json").read_text())["records"]] == [
        "tiny_match[forward_batch-eager-torch_native]", "tiny_wrong_window[forward_batch-eager-torch_native]"]
    code, _, err = run_cli(capsys, "run", "-k", "gemma")
    assert code == 2 and "-k gemma: no run of the selected scenarios matches it" in err
    with pytest.raises(SystemExit) as exit_:
        main(["run", "-k", "smoke and (tiny"])
    assert exit_.value.code == 2 and "expected ')' at the end" in capsys.readouterr().err


def test_no_faults_leaves_out_a_scenario_that_injects_one_outside_the_faults_folder(cli_dir, capsys):
    pad_tail = LIBRARY / "swa_fp8_pad_tail_not_zeroed.toml"
    assert load_scenario(pad_tail).faults and pad_tail.parent.name != "faults"
    code, _, err = run_cli(capsys, "run", str(pad_tail), "--no-faults")
    assert code == 2 and "every scenario under" in err and "injects a fault (--no-faults leaves them out)" in err


@pytest.mark.slow
def test_a_printed_reproduce_line_reruns_exactly_that_run_with_the_same_verdict(own_designs, capsys, write_scenario):
    write_scenario(own_designs, "tiny_match")
    (own_designs / "conftest.py").write_text('pytest_plugins = ["harness.plugin"]\n')
    run_cli(capsys, "run", "--jobs", "1", "--mode", "eager", "--design", "own_designs:wrong", "--json", "r.json")
    [record] = json.loads(Path("r.json").read_text())["records"]
    assert (record["expected"], record["verdict"]) == ("match", "diverge")
    # from a shell without the module's folder on the path: the line itself says where it is
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p and Path(p).resolve() != own_designs.resolve()),
           "OMP_NUM_THREADS": "1"}
    prefix = 'PYTHONPATH=."${PYTHONPATH:+:$PYTHONPATH}" '
    assert record["reproduce_pytest"].startswith(prefix) and record["reproduce_cli"].startswith(prefix)

    def shell(line: str) -> tuple[int, str]:
        proc = subprocess.run(["bash", "-c", line], cwd=own_designs, env=env, capture_output=True, text=True,
                              timeout=300)
        return proc.returncode, proc.stdout + proc.stderr

    code, text = shell(record["reproduce_pytest"] + " -p no:randomly -p no:cacheprovider -rA")
    assert code == 1, text
    assert f"FAILED scenarios/tiny_match.toml::{record['name']}" in text and "1 failed in" in text, text
    assert f"{record['name']}: expected match, observed diverge" in text
    code, text = shell(record["reproduce_cli"] + " --jobs 1")
    assert code == 1, text
    assert "0 as expected, 1 unexpected" in text and f"{record['name']}: diverge (UNEXPECTED)" in text, text


def test_plugin_options_add_designs_backends_and_runners_to_the_items(harness_pytester, add_scenario, monkeypatch):
    for module in ("own_designs", "toy_backends"):
        (harness_pytester.path / f"{module}.py").write_text((SAMPLES / f"{module}.py").read_text())
    monkeypatch.syspath_prepend(str(harness_pytester.path))
    add_scenario("tiny_wrong_window")  # eager only, one fault
    result = harness_pytester.runpytest("--collect-only", "-q", "--harness-design", "own_designs:good",
                                        "--harness-backend", "toy_backends:Renamed",
                                        "--harness-runner", "eager=own_designs:DoublingRunner")
    ids = {line.split("::")[1] for line in result.outlines if "::" in line}
    assert ids == {f"tiny_wrong_window[{design}-eager=own_designs:DoublingRunner-{backend}{rerun}]"
                   for design in ("forward_batch", "own_designs:good")
                   for backend in ("torch_native", "toy_backends:Renamed") for rerun in ("", "-nofault")} | {
        "tiny_wrong_window[oracle-torch_native]", "tiny_wrong_window[oracle-toy_backends:Renamed]"}
    result = harness_pytester.runpytest("--collect-only", "--harness-expect", "like:nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--harness-expect: like:nope: unknown design*"])


def test_the_plugin_help_states_the_default_expectation_of_added_designs(pytestconfig):
    # the options are read without torch (check.matrix.expect imports none), and the help names the default
    from harness.check.matrix.case import EXPECT_DEFAULT

    (expect,) = [o for o in pytestconfig._parser.getgroup("harness").options if "--harness-expect" in o.names()]
    assert f"(default: {EXPECT_DEFAULT})" in expect.attrs()["help"]


def test_harness_serving_runs_every_scenario_item_on_the_named_stack(harness_pytester, add_scenario):
    add_scenario("tiny_match")
    assert harness_pytester.runpytest("-q", "-p", "no:randomly", "-k", "translate-eager",
                                      "--harness-serving", "miniature").ret == 0
    # a class that is no stack: the items that were to build it fail, saying so
    result = harness_pytester.runpytest("-q", "-p", "no:randomly", "-k", "translate-eager",
                                        "--harness-serving", "harness.serving.pool:PoolSpec")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "serving stack 'harness.serving.pool:PoolSpec' is not a ServingStack subclass" in result.stdout.str()

"""``python -m harness run|list|report`` on the sample scenarios: exit codes, tables, JSON records, filters.

In this process, through ``main``: ``python -m harness`` itself, its exit status included, is the front door
of the subprocess tests in ``test_hardening.py`` (Ctrl-C, what a run prints or starts)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.cli import main

JSON_KEYS = {"scenario", "design", "mode", "backend", "engine", "faults", "expected", "verdict",
             "first_divergent_step", "mismatched_slots", "error"}
WRONG_WINDOW_EXPECTING_MATCH = {'verdict = "diverge"': 'verdict = "match"'}


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def rows(out: str) -> dict[str, list[str]]:
    """The result table's rows by run name."""
    return {line.split()[0]: line.split() for line in out.splitlines()
            if "[" in line.split(" ", 1)[0] and not line.split(" ", 1)[0].endswith(":")}  # not a failure block


def test_run_exits_0_when_every_verdict_is_the_expected_one(cli_dir, capsys, write_scenario):
    write_scenario(cli_dir, "tiny_match")
    write_scenario(cli_dir, "tiny_wrong_window")
    code, out, err = run_cli(capsys, "run", "--jobs", "1", "-v")  # the default root: ./scenarios
    assert code == 0, out + err
    table = rows(out)
    assert len(table) == 6 + 2  # tiny_match: 3 designs x 2 modes; tiny_wrong_window: the run and its -nofault twin
    assert table["tiny_wrong_window[forward_batch-eager-torch_native]"][1:3] == ["diverge", "diverge"]
    assert table["tiny_wrong_window[forward_batch-eager-torch_native-nofault]"][1:3] == ["match", "match"]
    assert "UNEXPECTED" not in out
    assert "8 runs: 8 as expected, 0 unexpected, 0 scenario files failed to load" in out
    assert "-v lists every run" not in out  # it did


def test_quick_runs_make_tests_share_each_designs_verdict_once_under_graphs(cli_dir, capsys, write_scenario):
    write_scenario(cli_dir, "tiny_match")
    write_scenario(cli_dir, "tiny_wrong_window")
    code, out, err = run_cli(capsys, "run", "--quick", "--jobs", "1", "-v")
    assert code == 0, out + err
    assert sorted(rows(out)) == sorted([*(f"tiny_match[{d}-full-torch_native]" for d in ("translate", "stale_state", "forward_batch")),
                                        "tiny_wrong_window[forward_batch-eager-torch_native]"])


def test_run_exits_1_when_a_verdict_is_not_the_expected_one(cli_dir, capsys, write_scenario):
    write_scenario(cli_dir, "tiny_wrong_window", replace=WRONG_WINDOW_EXPECTING_MATCH)
    code, out, err = run_cli(capsys, "run", "scenarios", "--jobs", "1", "--json", "r.json")
    assert code == 1
    # without -v the table lists the unexpected run only; the summary counts both
    assert list(rows(out)) == ["tiny_wrong_window[forward_batch-eager-torch_native]"]
    row = rows(out)["tiny_wrong_window[forward_batch-eager-torch_native]"]
    assert row[1:4] == ["match", "diverge", "UNEXPECTED"]
    assert " ".join(row[4:]).startswith("step ") and "pool, layer" in " ".join(row[4:])
    assert "2 runs: 1 as expected, 1 unexpected, 0 scenario files failed to load" in out
    assert "-v lists every run in the table" in out
    # stderr is no terminal here: the unexpected verdict gets a line of its own as the run finishes
    assert "tiny_wrong_window[forward_batch-eager-torch_native]: diverge (UNEXPECTED)" in err
    verdicts = {(tuple(r["faults"]), r["expected"], r["verdict"]) for r in json.loads(Path("r.json").read_text())["records"]}
    assert verdicts == {(("window_from_wrong_layer",), "match", "diverge"), ((), "match", "match")}


def test_json_writes_one_record_per_run_with_verdict_divergence_and_error(cli_dir, capsys, write_scenario):
    write_scenario(cli_dir, "tiny_wrong_window")
    write_scenario(cli_dir, "tiny_stale_error")
    code, out, _ = run_cli(capsys, "run", "scenarios", "--jobs", "1", "--json", "out/results.json")
    assert code == 0
    records = json.loads((cli_dir / "out" / "results.json").read_text())["records"]
    assert f"JSON: {cli_dir / 'out' / 'results.json'}" in out
    assert len(records) == 4
    for rec in records:
        assert JSON_KEYS <= rec.keys(), JSON_KEYS - rec.keys()
        assert (rec["backend"], rec["engine"]) == ("torch_native", "tape")
    by = {(r["scenario"], r["design"], tuple(r["faults"])): r for r in records}

    diverged = by["tiny_wrong_window", "forward_batch", ("window_from_wrong_layer",)]
    assert (diverged["mode"], diverged["expected"], diverged["verdict"]) == ("eager", "diverge", "diverge")
    assert isinstance(diverged["first_divergent_step"], int) and diverged["mismatched_slots"] > 0
    assert diverged["error"] is None

    clean = by["tiny_wrong_window", "forward_batch", ()]
    assert (clean["expected"], clean["verdict"], clean["first_divergent_step"], clean["mismatched_slots"]) == (
        "match", "match", None, 0
    )

    errored = by["tiny_stale_error", "stale_state", ()]
    assert (errored["expected"], errored["verdict"], errored["first_divergent_step"]) == ("error", "error", None)
    assert errored["error"]["type"] == "RuntimeError" and isinstance(errored["error"]["step"], int)
    assert by["tiny_stale_error", "forward_batch", ()]["verdict"] == "match"


def test_design_and_mode_options_filter_the_runs(cli_dir, capsys, write_scenario):
    write_scenario(cli_dir, "tiny_match")
    write_scenario(cli_dir, "tiny_stale_error")
    code, out, _ = run_cli(capsys, "run", "--jobs", "1", "-v", "--design", "stale_state", "--mode", "eager",
                           "--json", "r.json")
    assert code == 0
    assert sorted(rows(out)) == ["tiny_match[stale_state-eager-torch_native]",
                                 "tiny_stale_error[stale_state-eager-torch_native]"]
    assert {(r["design"], r["mode"]) for r in json.loads(Path("r.json").read_text())["records"]} == {("stale_state", "eager")}

    code, out, _ = run_cli(capsys, "run", "--jobs", "1", "-v", "--design", "translate", "--design", "forward_batch",
                           "--mode", "full")
    assert code == 0
    assert sorted(rows(out)) == ["tiny_match[forward_batch-full-torch_native]",
                                 "tiny_match[translate-full-torch_native]"]


def test_fault_option_keeps_only_scenarios_injecting_that_fault(cli_dir, capsys, write_scenario):
    write_scenario(cli_dir, "tiny_match")
    write_scenario(cli_dir, "tiny_wrong_window")
    code, out, _ = run_cli(capsys, "run", "--jobs", "1", "-v", "--fault", "window_from_wrong_layer")
    assert code == 0
    assert set(rows(out)) == {"tiny_wrong_window[forward_batch-eager-torch_native]",
                              "tiny_wrong_window[forward_batch-eager-torch_native-nofault]"}


def test_run_with_nothing_selected_exits_2(cli_dir, capsys, write_scenario):
    write_scenario(cli_dir, "tiny_wrong_window")
    code, _, err = run_cli(capsys, "run", "--jobs", "1", "--design", "translate")
    assert code == 2
    assert "no runs selected" in err


def test_list_prints_each_scenario_with_its_tags_modes_designs_faults_and_references(cli_dir, capsys,
                                                                                     write_scenario):
    write_scenario(cli_dir, "tiny_match")
    write_scenario(cli_dir, "tiny_pad_tail")
    write_scenario(cli_dir, "tiny_wrong_window")
    code, out, err = run_cli(capsys, "list")
    assert code == 0 and err == ""
    records = _records(out)
    assert records["tiny_match"] == {"tags": "smoke,tiny", "modes": "eager,full",
                                     "designs": "translate,stale_state,forward_batch"}  # no faults, no references
    assert {k: records["tiny_wrong_window"][k] for k in ("tags", "modes", "designs", "faults")} == {
        "tags": "fault,window", "modes": "eager", "designs": "forward_batch", "faults": "window_from_wrong_layer"}
    assert records["tiny_pad_tail"]["references"].endswith("SGLang PR 24743")
    assert max(map(len, out.splitlines())) <= 100


def _records(out: str) -> dict[str, dict[str, str]]:
    """The scenario records of ``list``: a name at the margin, then indented ``key: value`` fields."""
    records: dict[str, dict[str, str]] = {}
    for line in out.split("\n\n")[0].splitlines():
        if not line.startswith(" "):
            fields = records[line] = {}
            continue
        for field in line.strip().split("  "):
            key, _, value = field.partition(": ")
            fields[key] = value
    return records


def test_a_bad_file_is_reported_with_path_and_key_exits_1_and_the_others_still_run(cli_dir, capsys, write_scenario):
    bad = write_scenario(cli_dir, "broken", "tiny_match", replace={"swa_size = 16": "swa_size = 1"})
    write_scenario(cli_dir, "tiny_stale_error")
    code, out, err = run_cli(capsys, "run", "--jobs", "1", "-v")
    assert code == 1
    assert f"{Path('scenarios') / bad.name}: pool.swa_size: expected an integer from 2 to" in err
    assert sorted(rows(out)) == ["tiny_stale_error[forward_batch-eager-torch_native]",
                                 "tiny_stale_error[stale_state-eager-torch_native]"]
    assert "2 as expected, 0 unexpected, 1 scenario files failed to load" in out

    code, out, err = run_cli(capsys, "list")
    assert code == 1
    assert "pool.swa_size" in err and bad.name in err
    assert list(_records(out)) == ["tiny_stale_error"]


def test_report_writes_its_json_to_reports_results_json_by_default(cli_dir, capsys, write_scenario):
    write_scenario(cli_dir, "tiny_stale_error")
    code, _, _ = run_cli(capsys, "report", "--jobs", "1", "--design", "stale_state")
    assert code == 0
    records = json.loads((cli_dir / "reports" / "results.json").read_text())["records"]
    assert [(r["scenario"], r["design"], r["verdict"]) for r in records] == [
        ("tiny_stale_error", "stale_state", "error")
    ]


def test_serving_runs_every_selected_scenario_on_the_named_stack(cli_dir, capsys, write_scenario):
    write_scenario(cli_dir, "tiny_match")
    code, out, _ = run_cli(capsys, "run", "scenarios", "--jobs", "1", "--design", "translate", "--mode", "eager",
                           "--serving", "miniature", "--json", "same.json")
    assert code == 0, out
    # a class that is no stack: every run that was to build it says so, which only a run on it can
    code, out, _ = run_cli(capsys, "run", "scenarios", "--jobs", "1", "--design", "translate", "--mode", "eager",
                           "--serving", "harness.serving.pool:PoolSpec", "--json", "r.json")
    assert code == 1
    [record] = json.loads(Path("r.json").read_text())["records"]
    assert record["verdict"] == "error"
    assert "serving stack 'harness.serving.pool:PoolSpec' is not a ServingStack subclass" in record["error"]["message"]

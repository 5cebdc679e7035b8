"""The window-groups stack run from a scenario file: its ``[serving]`` table names the stack and its ``[run]``
the backend, both by import path, and the file goes through what ``python -m harness run`` does (``cases()``
and the matrix, in worker processes), its records naming the three groups. No harness file names the stack."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from harness.check.matrix.case import cases
from harness.check.matrix.matrix import run_cases
from harness.cli import main
from harness.runspec import Outcome
from harness.scenario.loader import load_scenario
from harness.scenario.writer import scenario_toml

from .window_groups.model import BACKEND, STACK, THREE_WINDOWS, TIMELINE

SCENARIO = Path(__file__).parent / "window_groups" / "three_windows.toml"


def test_the_file_describes_the_three_window_model_and_names_the_stack_and_backend_by_import_path(tmp_path):
    spec = load_scenario(SCENARIO)
    assert spec.serving == STACK and spec.backends == (BACKEND,)
    assert spec.model == dataclasses.replace(THREE_WINDOWS, name="gpt-oss-mini") and spec.timeline == TIMELINE
    # written back, the file loads to the same spec: the [serving] table and the per-layer windows round-trip
    (tmp_path / "three_windows.toml").write_text(scenario_toml(spec))
    back = load_scenario(tmp_path / "three_windows.toml")
    assert dataclasses.replace(back, path=spec.path) == spec


def test_the_matrix_runs_the_file_on_the_stack_and_its_results_name_the_three_groups():
    [case] = cases(load_scenario(SCENARIO))
    assert case.unsupported is None and case.run_spec().serving == STACK
    [result] = run_cases([case], jobs=1)
    assert result.ok, result.verdict
    assert result.verdict.outcome == Outcome.MATCH and result.verdict.diff.steps_compared > 0


def test_harness_run_writes_records_naming_the_three_groups(tmp_path, capsys):
    out = tmp_path / "results.json"
    assert main(["run", str(SCENARIO), "--jobs", "1", "--json", str(out)]) == 0, capsys.readouterr()
    [record] = json.loads(out.read_text())["records"]
    assert record["verdict"] == "match" and record["expected"] == "match"
    assert [(g["name"], g["window"]) for g in record["setup"]["groups"]] == [("full", None), ("w8", 8),
                                                                              ("w32", 32)]
    assert record["setup"]["layers"] == ["w8", "full", "w32", "w8"]
    written = [row for step in record["steps"] for row in step["written"]]
    # (rid, pos, then the token's slot in each group): the two windowed groups' mappings part, as the stack says
    assert written and all(len(row) == 2 + 3 for row in written), written[:2]
    assert any(row[3] != row[4] for row in written)

"""The reproduce lines carry what a case was made with: a serving stack named on the command line too."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from harness.check.matrix.case import cases
from harness.report.build import reproduce
from harness.scenario.loader import load_scenario

LIBRARY = Path(__file__).resolve().parents[2] / "scenarios"


def _case(serving: str | None = None):
    scenario = load_scenario(LIBRARY / "swa_decode_padded_buckets.toml", full=False)
    if serving is not None:
        scenario = dataclasses.replace(scenario, serving=serving)
    return cases(scenario)[0]


def test_a_stack_the_file_names_is_left_to_the_file():
    pytest_line, cli_line = reproduce(_case())
    assert "--harness-serving" not in pytest_line and "--serving" not in cli_line


def test_a_stack_given_on_the_command_line_is_in_both_lines():
    pytest_line, cli_line = reproduce(_case("tests.extending.window_groups.stack:WindowGroupsStack"))
    pytest_args, cli_args = shlex.split(pytest_line), shlex.split(cli_line)
    assert pytest_args[pytest_args.index("--harness-serving") + 1] == "tests.extending.window_groups.stack:WindowGroupsStack"
    assert cli_args[cli_args.index("--serving") + 1] == "tests.extending.window_groups.stack:WindowGroupsStack"

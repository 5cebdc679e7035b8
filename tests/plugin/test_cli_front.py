"""What the command line says around a run: a mistyped scenario path, the help of --backend, and colour
only where a person reads a terminal."""

from __future__ import annotations

import io
import sys

import pytest

from harness.cli import build_parser, main
from harness.report.text import wants_colour

RED = "\033[31m"


@pytest.mark.parametrize(("command", "typed", "meant"), [
    ("run", "scenarios/tiny_stale_eror.toml", "scenarios/tiny_stale_error.toml"),
    ("list", "scenarios/tiny_stale_eror.toml", "scenarios/tiny_stale_error.toml"),
    ("run", "scenarios/family/tiny_mach.toml", "scenarios/family/tiny_match.toml"),
    ("run", "scenario", "scenarios"),
    ("list", "scenarios/famly", "scenarios/family"),
])
def test_a_mistyped_scenario_path_names_the_closest_one_and_exits_2(cli_dir, capsys, write_scenario, command, typed,
                                                                    meant):
    write_scenario(cli_dir, "tiny_stale_error")
    (cli_dir / "scenarios" / "family").mkdir()
    (cli_dir / "scenarios" / "tiny_stale_error.toml").rename(cli_dir / "scenarios" / "family" / "tiny_match.toml")
    write_scenario(cli_dir, "tiny_stale_error")
    assert main([command, typed]) == 2
    out, err = capsys.readouterr()
    assert err == f"no scenario file or folder {typed} (did you mean {meant}?)\n" and out == ""


def test_a_path_like_nothing_there_is_refused_without_a_guess(cli_dir, capsys, write_scenario):
    write_scenario(cli_dir, "tiny_stale_error")
    assert main(["run", "scenarios/tiny_stale_error.toml", "zzz/qqq.toml"]) == 2
    assert capsys.readouterr().err == "no scenario file or folder zzz/qqq.toml\n"


def test_backends_help_says_it_restricts_the_runs():
    parser = build_parser()
    for command in ("run", "report"):
        sub = parser._subparsers._group_actions[0].choices[command]  # argparse keeps no public map of them
        [action] = [a for a in sub._actions if "--backend" in a.option_strings]
        assert action.help.startswith("restricts the runs to this backend's (repeatable")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("terminal", "no_color", "coloured"), [
    (True, None, True), (True, "", True), (True, "1", False), (True, "0", False), (False, None, False)])
def test_unexpected_and_the_totals_are_coloured_on_a_terminal_only_and_never_under_no_color(
        cli_dir, monkeypatch, write_scenario, terminal, no_color, coloured):
    # stale_state errors in this sample; expecting a match of it makes that run unexpected
    write_scenario(cli_dir, "tiny_stale_error", replace={'verdict = "error"': 'verdict = "match"'})
    if no_color is None:
        monkeypatch.delenv("NO_COLOR", raising=False)
    else:
        monkeypatch.setenv("NO_COLOR", no_color)
    stdout = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stdout", stdout)
    assert main(["run", "--jobs", "1", "--design", "stale_state"]) == 1
    out = stdout.getvalue()
    assert "UNEXPECTED" in out
    if coloured:
        assert f"{RED}UNEXPECTED\033[0m" in out
        assert f"{RED}1 runs: 0 as expected, 1 unexpected, 0 scenario files failed to load\033[0m" in out
    else:
        assert "\033[" not in out


def test_wants_colour_reads_the_stream_and_no_color():
    assert wants_colour(_Terminal(), {}) and not wants_colour(io.StringIO(), {})
    assert not wants_colour(_Terminal(), {"NO_COLOR": "yes"}) and wants_colour(_Terminal(), {"NO_COLOR": ""})


def test_list_reads_what_files_say_and_list_backends_checks_them_in_full_as_run_does(cli_dir, capsys, write_scenario):
    # a pool too small for the timeline: only the dry run (which needs torch) finds it
    write_scenario(cli_dir, "small", "tiny_match", replace={"swa_size = 16": "swa_size = 4"})
    assert main(["list"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("small\n") and "--backends adds" in out and err == ""
    assert main(["list", "--backends"]) == 1
    assert "scenarios/small.toml: pool.swa_size: too small for the timeline" in capsys.readouterr().err

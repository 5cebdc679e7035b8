"""What a user meets before any run: how fast help and option errors come back, what an option
error says (plain values, the subcommand's usage, the kind of name, a close match), help on every option,
and ``-k <scenario family>`` selecting only the scenario items of the repository."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_k_with_a_scenario_family_selects_only_scenario_items():
    # the user's command, over the whole repository: one subprocess collecting every test (about 20 s)
    families = sorted({"_".join(p.stem.split("_")[:2]) for p in (ROOT / "scenarios").rglob("*.toml")})
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly",
                           "-k", " or ".join(families)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    selected = [line for line in done.stdout.splitlines() if "::" in line]
    assert selected and all(line.startswith("scenarios/") for line in selected), [
        line for line in selected if not line.startswith("scenarios/")]


@pytest.mark.slow
def test_xdist_under_q_says_bringing_up_nodes_once(harness_pytester):
    # two xdist workers (about 10 s): their status line is written as they start and as they finish collecting
    harness_pytester.makepyfile("def test_nothing():\n    pass\n")
    result = harness_pytester.runpytest_subprocess("-n", "2", "-q", "-p", "no:randomly")
    assert result.ret == 0
    assert result.stdout.str().count("bringing up nodes") == 1, result.stdout.str()


def test_help_and_option_errors_import_neither_torch_nor_pandas():
    # one fresh interpreter (well under a second without torch): the CLI's entry, its help and three refusals
    driver = (
        "import sys\n"
        "from harness.cli import main\n"
        "for argv in (['--help'], ['run', '--help'], ['run', '--mode', 'eagr'], ['run', '--design', 'stale_stat'],\n"
        "             ['run', '--serving', 'sglnag'], ['list', '--bogus']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as exit_:\n"
        "        assert exit_.code in (0, 2), exit_.code\n"
        "print(sorted(m for m in ('torch', 'pandas', 'numpy') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", driver], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]", done.stdout[-500:]


@pytest.mark.parametrize(("argv", "message"), [
    (["run", "--mode", "eagr"],
     "argument --mode: unknown mode 'eagr' (did you mean 'eager'?); known modes: eager, full, piecewise"),
    (["run", "--design", "stale_stat"],
     "argument --design: unknown design 'stale_stat' (did you mean 'stale_state'?); known designs: translate, "),
    (["report", "--backend", "torch_nativ"],
     "argument --backend: unknown backend 'torch_nativ' (did you mean 'torch_native'?); known backends: "),
    (["run", "--serving", "sglnag"], "argument --serving: unknown serving stack 'sglnag' (did you mean 'sglang'?); "
                                     "known serving stacks: miniature, sglang, or an import path 'package.module:Class'"),
    (["run", "--fault", "baked_scalr"], "argument --fault: unknown fault 'baked_scalr' (did you mean 'baked_scalar'?)"),
    (["run", "--engine", "tap"], "argument --engine: unknown engine 'tap' (did you mean 'tape'?); known engines: tape, cuda"),
    (["run", "--device", "gpu"], "known devices: cpu, cuda"),
    (["run", "--runner", "ful=x:Y"], "got 'ful=x:Y'; unknown mode 'ful' (did you mean 'full'?)"),
    (["run", "--desing", "translate"], "unrecognized arguments: --desing (did you mean --design?)"),
    (["list", "--verbose"], "unrecognized arguments: --verbose"),
])
def test_an_option_error_names_the_kind_of_name_a_close_match_and_the_subcommands_usage(capsys, argv, message):
    from harness.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.startswith(f"usage: python -m harness {argv[0]} ") and f"python -m harness {argv[0]}: error: " in err
    assert message in err and "<" not in err.split("error: ", 1)[1], err


def test_a_mistyped_command_gets_a_close_match(capsys):
    from harness.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["rnu", "scenarios"])
    assert exit_.value.code == 2
    assert "unknown command 'rnu' (did you mean 'run'?); known commands: run, report, compare, list" in \
        capsys.readouterr().err


@pytest.mark.parametrize(("option", "message"), [
    ("--harness-design=stale_stat", "--harness-design: unknown design 'stale_stat' (did you mean 'stale_state'?)"),
    ("--harness-backend=torch_nativ", "--harness-backend: unknown backend 'torch_nativ' (did you mean 'torch_native'?)"),
    ("--harness-engine=tap", "argument --harness-engine: unknown engine 'tap' (did you mean 'tape'?)"),
    ("--harness-serving=minature", "--harness-serving: unknown serving stack 'minature' (did you mean 'miniature'?)"),
])
def test_a_plugin_option_naming_an_unknown_thing_is_a_usage_error_with_a_close_match(harness_pytester, option,
                                                                                      message):
    result = harness_pytester.runpytest_inprocess("--collect-only", option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str() and "Traceback" not in result.stderr.str()


def _parsers(parser):
    yield parser
    for action in parser._actions:  # argparse lists a parser's subcommands only there
        if isinstance(action.choices, dict):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_cli_option_and_argument_has_help():
    from harness.cli import build_parser

    missing = [f"{parser.prog} {action.dest}" for parser in _parsers(build_parser()) for action in parser._actions
               if not action.help]
    assert not missing


def test_every_plugin_option_has_help(pytestconfig):
    group = pytestconfig._parser.getgroup("harness")
    assert group.options and not [o.names() for o in group.options if not o.attrs().get("help")]


def test_the_clis_scenario_root_is_the_loaders():
    from harness.cli import SCENARIO_ROOT
    from harness.scenario.loader import SCENARIO_ROOT_DEFAULT

    assert SCENARIO_ROOT == SCENARIO_ROOT_DEFAULT

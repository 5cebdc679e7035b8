"""The CLI and pytest front ends under hostile or careless input: every problem is one readable line,
nothing non-printable reaches a terminal, nothing a user pastes runs code, no result is lost."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.cli import main

SAMPLES = Path(__file__).parent / "samples"
HOSTILE_WHY = 'colour \x1b[31mred\x1b[0m, title \x1b]0;pwned\x07, bell \x07, newline\nPASSED fake, quote " and $(touch pwned)'


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("args", "reason"), [
    (["run", "empty"], "no runs selected: no scenario files under empty"),
    (["run", "--design", "bogus"], "no runs selected: --design bogus: no selected scenario runs it; they run"),
    (["run", "--backend", "bogus"], "no runs selected: --backend bogus: no selected scenario runs it; they run torch_native"),
    (["run", "--fault", "baked_scalar"], "no runs selected: no scenario under scenarios/ injects baked_scalar"),
])
def test_an_empty_selection_says_which_filter_emptied_it(cli_dir, capsys, write_scenario, args, reason):
    write_scenario(cli_dir, "tiny_match")
    (cli_dir / "empty").mkdir()
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and reason in err, err


@pytest.mark.parametrize("jobs", ["0", "-2", "x"])
def test_jobs_must_be_a_positive_integer(cli_dir, capsys, jobs):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--jobs", jobs])
    assert exit_.value.code == 2
    assert "--jobs: expected a positive integer" in capsys.readouterr().err


def test_json_destination_is_checked_before_anything_runs(cli_dir, capsys, write_scenario):
    write_scenario(cli_dir, "tiny_match")
    (cli_dir / "out").mkdir()
    code, out, err = run_cli(capsys, "run", "--json", "out")
    assert code == 2 and "--json out: is a directory; name a file" in err and out == ""


def test_a_design_named_by_import_path_is_added_to_every_scenario(cli_dir, capsys, write_scenario):
    write_scenario(cli_dir, "tiny_match")
    code, out, _ = run_cli(capsys, "run", "--jobs", "1", "--mode", "eager", "--design", "harness.serving.designs:translate",
                           "--json", "r.json")
    records = json.loads(Path("r.json").read_text())["records"]
    assert [(r["design"], r["expected"], r["verdict"]) for r in records] == [
        ("harness.serving.designs:translate", "no expectation", "match")]
    assert code == 1  # nobody stated what it should give: shown, and not counted as expected
    code, _, _ = run_cli(capsys, "run", "--jobs", "1", "--mode", "eager", "--design", "harness.serving.designs:translate",
                         "--expect", "match")
    assert code == 0


@pytest.mark.slow
def test_ctrl_c_prints_what_finished_writes_incomplete_json_and_exits_130(cli_dir, write_scenario):
    write_scenario(cli_dir, "tiny_misbehaving", replace={"timeout_s = 2": "timeout_s = 120"})
    (cli_dir / "misbehaving_designs.py").write_text((SAMPLES / "misbehaving_designs.py").read_text())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cli_dir), *sys.path]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", "--jobs", "1", "--json", "r.json"],
                            cwd=cli_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:  # until the hanging design's run has started
        time.sleep(0.2)
        if any(p.is_dir() and (p / "cmdline").exists() and b"harness" in (p / "cmdline").read_bytes()
               for p in Path("/proc").iterdir() if p.name.isdigit() and p.name != str(proc.pid)
               and _parent(p) == proc.pid):
            time.sleep(1.0)
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert "interrupted:" in err and "Traceback" not in err
    doc = json.loads((cli_dir / "r.json").read_text())
    assert doc["complete"] is False
    assert all(r["verdict"] in ("match", "error") for r in doc["records"])


def _parent(proc_dir: Path) -> int | None:
    try:
        return int((proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


@pytest.fixture
def hostile(harness_pytester, add_scenario):
    sample = (SAMPLES / "tiny_wrong_window.toml").read_text()
    why = json.dumps(HOSTILE_WHY)  # a TOML basic string with the control characters escaped
    add_scenario("swa_hostile", text=sample.replace(
        'why = "with the fault the full layers attend through the sliding window: tokens past it are dropped"',
        f"why = {why}").replace('verdict = "diverge"', 'verdict = "match"'))
    evil = harness_pytester.path / "scenarios" / "evil\nPASSED forged\x1b[2J.toml"
    evil.write_text(sample)
    quoted = harness_pytester.path / "scenarios" / "swa_quote's $(touch pwned).toml"
    quoted.write_text(sample.replace('verdict = "diverge"', 'verdict = "match"'))
    return harness_pytester


@pytest.mark.slow
def test_nothing_non_printable_reaches_the_terminal_and_reproduce_lines_round_trip(hostile):
    result = hostile.runpytest_subprocess("-q", "--junitxml", "junit.xml")
    text = "\n".join(result.outlines + result.errlines)
    assert "\x1b" not in text and "\x07" not in text
    assert not any(line.startswith("PASSED forged") for line in result.outlines)
    assert "evil\\nPASSED forged\\x1b[2J" in text  # the bad name is shown, escaped
    # every reproduce line parses back, under shlex, to the item it names: pasting it runs nothing else
    lines = [line.split("reproduce: ", 1)[1] for line in result.outlines if "reproduce: " in line]
    assert lines
    for line in lines:
        pytest_cmd, _, cli_cmd = line.partition("   or   ")
        argv = shlex.split(pytest_cmd)
        assert argv[0] == "pytest" and len(argv) == 2 and "::" in argv[1]
        assert shlex.split(cli_cmd)[:4] == ["python", "-m", "harness", "run"]
    assert any("swa_quote's $(touch pwned).toml" in shlex.split(line.partition("   or   ")[0])[1] for line in lines)
    assert not (hostile.path / "pwned").exists()
    ET.parse(hostile.path / "junit.xml")  # well-formed despite the names


def test_the_cli_escapes_hostile_names_too(hostile, capsys, monkeypatch):
    monkeypatch.chdir(hostile.path)
    code, out, err = run_cli(capsys, "run", "--jobs", "1")
    assert code == 1
    assert "\x1b" not in out + err and "\x07" not in out + err
    assert "evil\\nPASSED forged\\x1b[2J.toml: name: expected a printable file name" in err


CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "bad"


def _corpus_fragments() -> dict[str, str]:
    out = {}
    for path in sorted(CORPUS.glob("*.toml")):
        first = path.read_bytes().decode("utf-8", "replace").lstrip("\ufeff").splitlines()[0]
        out[path.stem] = first.removeprefix("# expect: ")
    return out


def test_the_bad_file_corpus_gives_one_line_each_under_the_cli_and_pytest(harness_pytester, capsys, monkeypatch):
    fragments = _corpus_fragments()
    folder = harness_pytester.path / "scenarios"
    folder.mkdir()
    for path in CORPUS.glob("*.toml"):
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / "tiny_match.toml").write_text((SAMPLES / "tiny_match.toml").read_text())
    monkeypatch.chdir(harness_pytester.path)

    code, out, err = run_cli(capsys, "run", "--jobs", "1", "--mode", "eager", "--design", "translate")
    lines = err.splitlines()
    for stem, fragment in fragments.items():
        mine = [line for line in lines if line.startswith(f"scenarios/{stem}.toml: ")]
        assert len(mine) == 1 and fragment in mine[0], (stem, mine)
    assert code == 1 and "tiny_match[translate-eager-torch_native]" in out  # the good file still ran

    result = harness_pytester.runpytest_inprocess("-q", "-k", "load or tiny_match")
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] == len(fragments) and outcomes["passed"] >= 1
    text = result.stdout.str()
    for stem, fragment in fragments.items():
        assert f"{fragment}" in text, stem


def test_two_runs_of_the_same_inputs_write_equal_records(cli_dir, capsys, write_scenario):
    write_scenario(cli_dir, "tiny_stale_error")
    run_cli(capsys, "run", "--jobs", "1", "--json", "a.json")
    run_cli(capsys, "run", "--jobs", "2", "--json", "b.json")
    a, b = (json.loads(Path(name).read_text()) for name in ("a.json", "b.json"))
    assert a["records"] == b["records"] and a["records"]
    assert "0x" not in json.dumps(a["records"])  # no memory address in any note

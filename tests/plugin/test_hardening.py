"""The CLI and pytest front ends under hostile or careless input: every problem is one readable line,
nothing non-printable reaches a terminal, nothing a user pastes runs code, no result is lost."""

from __future__ import annotations

import json
import multiprocessing
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.check.run import workers
from harness.cli import main

SAMPLES = Path(__file__).parent / "samples"
HOSTILE_WHY = 'colour \x1b[31mred\x1b[0m, title \x1b]0;pwned\x07, bell \x07, newline\nPASSED fake, quote " and $(touch pwned)'


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("args", "reason"), [
    (["run", "empty"], "no runs selected: no scenario files (*.toml) under empty"),
    (["run", "--design", "memoized"], "no runs selected: --design memoized: no selected scenario runs it; they run"),
    (["run", "--backend", "torch_gather"],
     "no runs selected: --backend torch_gather: no selected scenario runs it; they run torch_native"),
    (["run", "--fault", "baked_scalar"], "no runs selected: no scenario under scenarios/ injects baked_scalar"),
])
def test_an_empty_selection_says_which_filter_emptied_it(cli_dir, capsys, write_scenario, args, reason):
    write_scenario(cli_dir, "tiny_match")
    (cli_dir / "empty").mkdir()
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and reason in err, err


def test_an_empty_selection_of_files_that_all_failed_to_load_names_them(cli_dir, capsys, write_scenario):
    write_scenario(cli_dir / "bad", "broken", "tiny_match", replace={"swa_size = 16": "swa_size = 1"})
    code, _, err = run_cli(capsys, "run", "bad")
    assert code == 1
    assert (f"no runs selected: every scenario file under bad failed to load "
            f"(1: {Path('bad/scenarios/broken.toml')}; their problems are above)") in err, err


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
    write_scenario(cli_dir, "tiny_match", replace={'[expect.stale_state]\nverdict = "match"':
                                                   '[expect.stale_state]\nverdict = "diverge"'})
    code, out, _ = run_cli(capsys, "run", "--jobs", "1", "--mode", "eager", "--design", "harness.serving.designs:translate",
                           "--json", "r.json")
    records = json.loads(Path("r.json").read_text())["records"]
    # without --expect: what the scenario expects of the reference design in the same run
    assert [(r["design"], r["expected"], r["verdict"]) for r in records] == [
        ("harness.serving.designs:translate", "match", "match")]
    assert records[0]["why"] == ("expected like forward_batch, which the scenario lists: reads the batch's own "
                                 "out_cache_loc_swa")
    assert code == 0
    code, _, _ = run_cli(capsys, "run", "--jobs", "1", "--mode", "eager", "--design", "harness.serving.designs:translate",
                         "--expect", "like:stale_state")
    assert code == 1  # the (edited) scenario expects stale_state to diverge; translate matches
    code, _, _ = run_cli(capsys, "run", "--jobs", "1", "--mode", "eager", "--design", "harness.serving.designs:translate",
                         "--expect", "match")
    assert code == 0


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
def test_nothing_non_printable_reaches_the_terminal_and_reproduce_lines_round_trip(hostile, add_scenario):
    # one pytest process for the hostile names and for a design that prints (-s: nothing captures it but the
    # harness): the terminal is the process's own stdout and stderr, which only a subprocess shows whole
    prints = (SAMPLES / "tiny_match.toml").read_text()
    prints = prints[:prints.index("[expect.translate]")].replace(
        'designs = ["translate", "stale_state", "forward_batch"]', 'designs = ["escaping_designs:prints"]')
    add_scenario("tiny_prints", text=prints + '[expect."escaping_designs:prints"]\nverdict = "match"\nwhy = "prints"\n')
    (hostile.path / "escaping_designs.py").write_text((SAMPLES / "escaping_designs.py").read_text())
    result = hostile.runpytest_subprocess("-s", "-q", "-p", "no:randomly", "--junitxml", "junit.xml")
    text = "\n".join(result.outlines + result.errlines)
    assert "\x1b" not in text and "\x07" not in text
    # what the design printed is there, escaped, under pytest as under the CLI
    assert "  | \\x1b]0;pwned\\x07title set" in text and "  | PASSED forged" in text
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


@pytest.mark.slow  # over two seconds on one core (tests/README.md)
def test_the_bad_file_corpus_gives_one_line_each_under_the_cli_and_pytest(harness_pytester, capsys, monkeypatch):
    fragments = _corpus_fragments()
    folder = harness_pytester.path / "scenarios"
    folder.mkdir()
    for path in CORPUS.glob("*.toml"):
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / "tiny_match.toml").write_text((SAMPLES / "tiny_match.toml").read_text())
    monkeypatch.chdir(harness_pytester.path)

    code, out, err = run_cli(capsys, "run", "-v", "--jobs", "1", "--mode", "eager", "--design", "translate")
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


# ---- a run's processes end with it ---------------------------------------------------------------------

def _harness(cli_dir: Path, *args: str, marker: str = "300", **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cli_dir), *sys.path]), "OMP_NUM_THREADS": "1",
           "SWA_TEST_MARKER": marker}
    return subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=cli_dir, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def _children(pid: int) -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(p) == pid]


def _descendants(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        for child in _children(todo.pop()):
            out.add(child)
            todo.append(child)
    return out


def _with_arg(arg: str) -> list[int]:
    """Processes whose command line holds ``arg`` (the marker a test gave the ``sleep`` it caused)."""
    out = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and arg.encode() in (p / "cmdline").read_bytes().split(b"\0"):
                out.append(int(p.name))
        except OSError:
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _wait_for(predicate, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")


@pytest.fixture
def escaping_dir(cli_dir: Path, write_scenario) -> Path:
    write_scenario(cli_dir, "tiny_match")
    (cli_dir / "escaping_designs.py").write_text((SAMPLES / "escaping_designs.py").read_text())
    return cli_dir


def _kill_marked(marker: str) -> None:
    for pid in _with_arg(marker):  # only the processes this test's design started
        os.kill(pid, signal.SIGKILL)


@contextmanager
def _sigint_as_in_a_terminal():
    """Processes started inside get SIGINT at its default, as a shell's foreground job does: one started in
    the background without job control (``cmd &`` in a script, as agents and CI runners do) inherits SIGINT
    ignored, Python then keeps it ignored, and Ctrl-C could never reach the harness."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # a handler resets to default on exec
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.slow
@linux_only
def test_ctrl_c_prints_what_finished_writes_incomplete_json_and_exits_130(escaping_dir):
    # the interrupt front door, as a user meets it: a real SIGINT to `python -m harness run`, sent once the
    # hanging run has started its `sleep` (a signal of readiness, not a guess of how long start-up takes)
    marker = "300.5"
    with _sigint_as_in_a_terminal():
        proc = _harness(escaping_dir, "run", "--jobs", "1", "--mode", "eager", "--timeout", "600", "--design",
                        "escaping_designs:spawns_and_hangs", "--design", "translate", "--json", "r.json",
                        marker=marker)
    try:
        assert _wait_for(lambda: _with_arg(marker) or proc.poll() is not None, 120), "the design never started"
        tree = _descendants(proc.pid)
        assert tree and _with_arg(marker)[0] in tree
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        _kill_marked(marker)
        proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "interrupted: 1 of 2 runs finished" in err and "Traceback" not in err
    assert "tiny_match[translate-eager-torch_native]" in out  # the table of the runs that finished
    doc = json.loads((escaping_dir / "r.json").read_text())
    assert doc["complete"] is False and [r["design"] for r in doc["records"]] == ["translate"]
    assert not [pid for pid in tree if _alive(pid)]  # the run's child and the process it started


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


@linux_only
def test_ctrl_c_just_after_a_run_forks_still_ends_that_run(monkeypatch):
    # the interrupt lands between the fork and the bookkeeping that lets an interrupt end the run
    started: list[int] = []
    real_start = workers._CTX.Process.start

    def start_then_ctrl_c(self):
        real_start(self)
        started.append(self.pid)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(workers._CTX.Process, "start", start_then_ctrl_c)
    try:
        with _sigint_as_in_a_terminal(), pytest.raises(KeyboardInterrupt):
            workers.run_isolated(_sleep, [60.0], jobs=1, timeout_s=lambda _: 120.0)
        assert started and not _alive(started[0]), "the run outlived the interrupt"
    finally:
        for pid in started:
            workers._kill_group(pid)


@linux_only
def test_sigterm_ends_a_run_as_ctrl_c_does_and_leaves_no_process_behind(escaping_dir, capsys, monkeypatch):
    # in this process: the CLI itself installs the SIGTERM handler; a real SIGTERM, sent from a thread once
    # the hanging run has started its sleep, is then handled in the main thread (the wiring a subprocess
    # would add is `python -m harness` itself, which the Ctrl-C test above goes through)
    marker = "301.5"
    monkeypatch.setenv("SWA_TEST_MARKER", marker)
    monkeypatch.syspath_prepend(str(escaping_dir))
    tree: set[int] = set()
    problems: list[str] = []

    def terminate_once_hanging() -> None:
        if not _wait_for(lambda: bool(_with_arg(marker)), 120):
            problems.append("the design never started its sleep")
        elif signal.getsignal(signal.SIGTERM) is not workers._raise_terminated:
            problems.append(f"the CLI did not install its SIGTERM handler: {signal.getsignal(signal.SIGTERM)}")
        else:
            tree.update(_descendants(os.getpid()))
            os.kill(os.getpid(), signal.SIGTERM)
            return
        _kill_marked(marker)  # end the hanging run another way, so that the test fails instead of hanging
        for pid in _descendants(os.getpid()):
            os.kill(pid, signal.SIGKILL)

    thread = threading.Thread(target=terminate_once_hanging, daemon=True)
    # as in a fresh process, whatever this session installed: the handler must be the CLI's own
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    thread.start()
    try:
        code, out, err = run_cli(capsys, "run", "--jobs", "1", "--mode", "eager", "--timeout", "600", "--design",
                                 "escaping_designs:spawns_and_hangs", "--design", "translate", "--json", "r.json")
    finally:
        signal.signal(signal.SIGTERM, before)
        thread.join(30)
        _kill_marked(marker)
        sys.modules.pop("escaping_designs", None)
    assert not problems, problems
    assert code == 128 + signal.SIGTERM, (out, err)
    assert "terminated (SIGTERM): 1 of 2 runs finished" in err and "Traceback" not in err
    assert "tiny_match[translate-eager-torch_native]" in out
    doc = json.loads((escaping_dir / "r.json").read_text())
    assert doc["complete"] is False and [r["design"] for r in doc["records"]] == ["translate"]
    assert tree and _with_arg(marker) == [] and not [pid for pid in tree if _alive(pid)]


def _cli_exit(argv: list[str]) -> None:
    sys.exit(main(argv))


@linux_only
def test_a_harness_killed_outright_takes_its_runs_with_it(escaping_dir, monkeypatch):
    # SIGKILL runs no handler, so the CLI's code has no part in this: a fork of this process running the CLI
    # is that harness, without the start-up of a new interpreter
    marker = "302.5"
    monkeypatch.setenv("SWA_TEST_MARKER", marker)
    monkeypatch.syspath_prepend(str(escaping_dir))
    harness = multiprocessing.get_context("fork").Process(target=_cli_exit, args=(
        ["run", "--jobs", "1", "--mode", "eager", "--timeout", "600", "--design", "escaping_designs:spawns_and_hangs"],))
    harness.start()
    runs: list[int] = []
    try:
        assert _wait_for(lambda: _with_arg(marker) or not harness.is_alive(), 120)
        runs += [pid for pid in _children(harness.pid) if pid not in _with_arg(marker)]
        assert runs
        harness.kill()  # SIGKILL: no handler runs; the kernel ends the run (PR_SET_PDEATHSIG)
        harness.join(30)
        assert _wait_for(lambda: not any(_alive(pid) for pid in runs), 30)
    finally:
        _kill_marked(marker)
        harness.kill()
        for pid in runs:  # when the kernel did not: an orphan would hold this session's output open
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        sys.modules.pop("escaping_designs", None)


@pytest.mark.slow
@linux_only
def test_what_a_run_prints_or_starts_stays_in_its_run(escaping_dir):
    # one `python -m harness run` for two claims that do not meet: what a design prints (through Python and
    # fd 2) is shown escaped beside its run, never raw; and a process a design starts ends with its run and
    # holds no pipe open (CI runs `harness run | tee log`, which waits for every process holding the pipe;
    # capture_output waits alike)
    marker = "303.5"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(escaping_dir), *sys.path]), "OMP_NUM_THREADS": "1",
           "SWA_TEST_MARKER": marker}
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "harness", "run", "-v", "--jobs", "2", "--mode", "eager", "--expect",
                               "match", "--design", "escaping_designs:spawns", "--design", "escaping_designs:prints",
                               "--json", "r.json"],
                              cwd=escaping_dir, env=env, capture_output=True, text=True, timeout=200)
        elapsed = time.monotonic() - start
        left = [pid for pid in _with_arg(marker) if _alive(pid)]
    finally:
        _kill_marked(marker)
    out, err = done.stdout, done.stderr
    assert done.returncode == 0, (out, err)
    assert elapsed < 200 and not left, (elapsed, left)
    assert "tiny_match[escaping_designs:spawns-eager-torch_native]  match     match" in out
    assert [(r["design"], r["verdict"]) for r in json.loads((escaping_dir / "r.json").read_text())["records"]] == [
        ("escaping_designs:spawns", "match"), ("escaping_designs:prints", "match")]
    for ch in ("\x1b", "\x07"):
        assert ch not in out + err
    assert not [line for line in (out + err).splitlines() if line.startswith("PASSED")]
    block = err.split("tiny_match[escaping_designs:prints-eager-torch_native]: captured output, escaped:\n", 1)[1]
    assert block.splitlines()[:3] == ["  | \\x1b]0;pwned\\x07title set", "  | PASSED forged",
                                      "  | \\x1b[2Jscreen cleared"]


# ---- destinations are judged before anything runs; a report folder is written only inside itself -------

def _read_only_folder(tmp_path: Path) -> Path:
    """A folder this process cannot write in: chmod for a user; for root (who ignores modes) a read-only
    file system, when the machine has one."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    for candidate in (Path("/proc/sys"), Path("/sys/fs/cgroup")):
        if candidate.is_dir() and not os.access(candidate, os.W_OK):
            return candidate
    pytest.skip("running as root without a read-only file system to write to")


def _destination(kind: str, root: Path) -> tuple[Path, str]:
    """(the destination, a fragment of the one line that refuses it)."""
    if kind == "a file":
        (root / "taken").write_text("x")
        return root / "taken", "is a file; name a folder"
    if kind == "a symlink to a file":
        (root / "taken").write_text("x")
        (root / "link").symlink_to(root / "taken")
        return root / "link", f"is a symbolic link to a file ({(root / 'taken').resolve()}); name a folder"
    if kind == "below a file":
        (root / "taken").write_text("x")
        return root / "taken" / "rep", f"{root / 'taken'} is not a directory"
    if kind == "read-only":
        folder = _read_only_folder(root)
        return folder / "rep", f"cannot write in {folder}"
    if kind == "a broken symlink":
        (root / "link").symlink_to(root / "nowhere")
        return root / "link", "is a broken symbolic link"
    if kind == "pages linked out":
        (root / "outside").mkdir()
        (root / "rep").mkdir()
        (root / "rep" / "scenarios").symlink_to(root / "outside")
        return root / "rep", "scenarios is a symbolic link (to"
    raise AssertionError(kind)


FOLDER_KINDS = ["a file", "a symlink to a file", "below a file", "read-only", "a broken symlink", "pages linked out"]


@pytest.mark.parametrize("kind", FOLDER_KINDS)
@pytest.mark.parametrize("command", ["run", "report", "compare"])
def test_a_bad_report_folder_is_refused_before_anything_runs(kind, command, cli_dir, capsys, write_scenario):
    write_scenario(cli_dir, "tiny_match")
    dest, fragment = _destination(kind, cli_dir)
    args = (["compare", "base.json", "base.json"] if command == "compare" else [command, "--jobs", "1"])
    code, out, err = run_cli(capsys, *args, "--report-dir", str(dest))
    assert code == 2 and out == "", (out, err)
    assert err.splitlines() == [f"--report-dir {dest}: {err.split(': ', 1)[1].rstrip()}"] and fragment in err, err
    assert "runs in" not in err  # nothing ran (compare: nothing was read; base.json does not even exist)


@pytest.mark.parametrize(("kind", "fragment"), [("a folder", "is a directory; name a file"),
                                                ("below a file", "is not a directory")])
def test_a_bad_results_file_is_refused_before_anything_runs(kind, fragment, cli_dir, capsys, write_scenario):
    write_scenario(cli_dir, "tiny_match")
    (cli_dir / "taken").write_text("x")
    dest = cli_dir if kind == "a folder" else cli_dir / "taken" / "r.json"
    code, out, err = run_cli(capsys, "run", "--jobs", "1", "--json", str(dest))
    assert code == 2 and out == "" and fragment in err and len(err.splitlines()) == 1, err


def test_results_file_and_report_folder_that_collide_are_refused_up_front(cli_dir, capsys, write_scenario):
    write_scenario(cli_dir, "tiny_match")
    code, _, err = run_cli(capsys, "run", "--json", "out", "--report-dir", "out/rep")
    assert code == 2 and "--report-dir out/rep: the results file --json out would be in its way" in err


@pytest.mark.parametrize(("option", "kind"), [
    ("--harness-report", "a file"), ("--harness-report", "a symlink to a file"), ("--harness-report", "below a file"),
    ("--harness-report", "read-only"), ("--harness-report", "pages linked out"), ("--harness-json", "a folder"),
])
def test_pytest_refuses_a_bad_destination_before_collecting(option, kind, harness_pytester, add_scenario):
    add_scenario("tiny_match")
    if kind == "a folder":
        dest, fragment = harness_pytester.path, "is a directory; name a file"
    else:
        dest, fragment = _destination(kind, harness_pytester.path)
    # in this process: the refusal is the plugin's pytest_configure, which a subprocess would only wrap
    result = harness_pytester.runpytest_inprocess(option, str(dest), "-p", "no:randomly")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.startswith("ERROR: ")]
    assert len(errors) == 1 and errors[0].startswith(f"ERROR: {option} {dest}: ") and fragment in errors[0], \
        result.errlines
    assert "passed" not in "\n".join(result.outlines)


@pytest.mark.slow  # over two seconds on one core (tests/README.md)
def test_a_report_folder_holds_one_report_and_keeps_what_is_not_a_reports(cli_dir, capsys, write_scenario):
    write_scenario(cli_dir, "tiny_match")
    write_scenario(cli_dir, "tiny_wrong_window")
    assert run_cli(capsys, "run", "--jobs", "1", "--report-dir", "rep")[0] == 0
    assert sorted(p.name for p in (cli_dir / "rep" / "scenarios").iterdir()) == ["tiny_match.html",
                                                                                 "tiny_wrong_window.html"]
    (cli_dir / "rep" / "notes.txt").write_text("mine")
    (cli_dir / "rep" / "compare.html").write_text("an earlier comparison's page")
    assert run_cli(capsys, "run", "scenarios/tiny_match.toml", "--jobs", "1", "--report-dir", "rep")[0] == 0
    assert [p.name for p in (cli_dir / "rep" / "scenarios").iterdir()] == ["tiny_match.html"]
    assert sorted(p.name for p in (cli_dir / "rep").iterdir()) == ["index.html", "notes.txt", "results.csv",
                                                                   "results.json", "scenarios"]
    index = (cli_dir / "rep" / "index.html").read_text()
    assert "tiny_wrong_window" not in index and (cli_dir / "rep" / "notes.txt").read_text() == "mine"


def test_a_design_that_cannot_be_imported_is_one_line_of_its_own_type_naming_design_and_file(cli_dir, capsys,
                                                                                             write_scenario):
    write_scenario(cli_dir, "tiny_match")
    (cli_dir / "exits_on_import.py").write_text("import sys\n\nsys.exit(0)\n")
    sys.path.insert(0, str(cli_dir))
    try:
        code, out, _ = run_cli(capsys, "run", "-v", "--jobs", "1", "--mode", "eager", "--design", "exits_on_import:fn",
                               "--expect", "error", "--json", "r.json")
    finally:
        sys.path.remove(str(cli_dir))
        sys.modules.pop("exits_on_import", None)
    assert code == 0, out
    [record] = json.loads((cli_dir / "r.json").read_text())["records"]
    assert record["error"]["type"] == "DesignImportError"
    assert record["error"]["message"] == (f"design 'exits_on_import:fn' cannot be imported: SystemExit: 0 "
                                          f"(at {cli_dir / 'exits_on_import.py'}, line 3)")
    row = next(line for line in out.splitlines() if line.startswith("tiny_match[exits_on_import:fn"))
    assert "DesignImportError: design 'exits_on_import:fn' cannot be imported: SystemExit: 0" in row


@pytest.mark.slow
@linux_only
def test_sigterm_ends_a_pytest_session_as_ctrl_c_does(harness_pytester, add_scenario):
    text = (SAMPLES / "tiny_match.toml").read_text()
    text = text[:text.index("[expect.translate]")].replace(
        'designs = ["translate", "stale_state", "forward_batch"]',
        'designs = ["translate", "escaping_designs:spawns_and_hangs"]',
    ).replace('modes = ["eager", "full"]', 'modes = ["eager"]').replace("[run]\n", "[run]\ntimeout_s = 600\n")
    add_scenario("tiny_hangs", text=text + '[expect.translate]\nverdict = "match"\nwhy = "w"\n'
                 '[expect."escaping_designs:spawns_and_hangs"]\nverdict = "error"\nwhy = "hangs"\n')
    (harness_pytester.path / "escaping_designs.py").write_text((SAMPLES / "escaping_designs.py").read_text())
    marker = "304.5"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(harness_pytester.path), *sys.path]),
           "OMP_NUM_THREADS": "1", "SWA_TEST_MARKER": marker}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                             "--harness-json", "r.json"], cwd=harness_pytester.path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert _wait_for(lambda: _with_arg(marker) or proc.poll() is not None, 120)
        tree = _descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        _kill_marked(marker)
        proc.kill()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, (out, err)
    doc = json.loads((harness_pytester.path / "r.json").read_text())
    assert doc["complete"] is False and [r["design"] for r in doc["records"]] == ["translate"]
    assert not [pid for pid in tree if _alive(pid)]

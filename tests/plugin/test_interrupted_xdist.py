"""Under pytest-xdist, an interrupted session keeps what completed and a killed one leaves nothing running:
Ctrl-C writes ``--harness-json`` with every result the workers sent before it (as ``-n 0`` does), and after
SIGKILL of the controller its workers, and the runs they started, end within seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import sample_text

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = Path(__file__).parent / "samples"
HANG = "slow_hang"
"""a scenario whose second run sleeps for an hour (its time limit is longer than these tests wait)"""


def _hanging_scenario() -> str:
    text = sample_text("tiny_misbehaving", {
        '"misbehaving_designs:exits", "misbehaving_designs:aborts", "misbehaving_designs:hangs",\n'
        '           "misbehaving_designs:raises"]': '"misbehaving_designs:hangs"]',
        "timeout_s = 2": "timeout_s = 600"})
    return text.split('[expect."misbehaving_designs:exits"]')[0] + (
        '[expect."misbehaving_designs:hangs"]\nverdict = "error"\nwhy = "sleeps for an hour"\n')


def _start(tmp_path: Path, write_scenario, *extra: str) -> subprocess.Popen:
    write_scenario(tmp_path, HANG, text=_hanging_scenario())
    write_scenario(tmp_path, "tiny_match")
    (tmp_path / "misbehaving_designs.py").write_bytes((SAMPLES / "misbehaving_designs.py").read_bytes())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    # a session of its own: the signals below reach it and its workers as a terminal's would, nothing else;
    # SIGINT at its default there, as a terminal's foreground job has it (a shell without job control hands a
    # background command SIGINT ignored, and the session would keep ignoring it)
    return subprocess.Popen([sys.executable, "-m", "pytest", "-p", "harness.plugin", "-p", "no:cacheprovider",
                             "-p", "no:randomly", "-v", "-n", "2", "--dist", "loadfile", "scenarios", *extra],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _read_until(proc: subprocess.Popen, pattern: str, limit_s: float = 300) -> list[str]:
    lines, deadline = [], time.monotonic() + limit_s
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if pattern in line:
            return lines
        assert time.monotonic() < deadline, "".join(lines)
    raise AssertionError("the session ended before " + pattern + ":\n" + "".join(lines))


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _end(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


@pytest.mark.slow
def test_ctrl_c_under_xdist_writes_every_result_the_workers_sent(tmp_path, write_scenario):
    proc = _start(tmp_path, write_scenario, "--harness-json", "r.json")
    try:
        lines = _read_until(proc, "PASSED")  # the first item done: Ctrl-C now, as a terminal sends it
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        _end(proc)
    out = "".join(lines) + rest
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["complete"] is False
    reported = {line.rsplit("::", 1)[1].strip() for line in out.splitlines() if " PASSED " in line}
    assert {n for n in reported if "[oracle-" not in n} <= {r["name"] for r in doc["records"]}, out
    assert not any(r["design"] == "misbehaving_designs:hangs" for r in doc["records"])


@pytest.mark.slow
def test_the_workers_of_a_controller_killed_with_sigkill_end_with_it(tmp_path, write_scenario):
    proc = _start(tmp_path, write_scenario)
    try:
        _read_until(proc, f"PASSED scenarios/{HANG}.toml::{HANG}[translate")  # its worker is in the hang now
        # the controller prints the verdict before the worker has forked the next run: wait for that fork
        deadline = time.monotonic() + 60
        while True:
            workers = _children(proc.pid)
            below = [pid for w in workers for pid in _children(w)]  # the runs' processes
            if (len(workers) == 2 and below) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert len(workers) == 2 and below, (workers, below)
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(map(_alive, workers + below)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in workers + below if _alive(pid)]
    finally:
        _end(proc)

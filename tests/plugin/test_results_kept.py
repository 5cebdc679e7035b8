"""Results are never lost to a destination that fails after the runs: under a file-size limit (a full disk as
a process meets it: the write fails with EFBIG) the JSON is kept when it fits, the report lands whole or not
at all, one line says what was not written, and the exit status is not 0; under the CLI and under pytest."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FITS_JSON = 30_000
"""bytes: tiny_match's results file (about 23 KB) fits, its report pages (about 40 KB each) do not"""


def _limited(argv: list[str], cwd: Path, limit: int) -> subprocess.CompletedProcess:
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    # no bytecode written under the limit: a .pyc cut short there would break every later import of the module
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, preexec_fn=set_limit,
                          timeout=300, env=env)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.name.endswith(".tmp"))


@pytest.mark.slow  # a CLI child importing torch: seconds (tests/README.md, "By cost")
def test_a_full_disk_after_the_runs_keeps_the_json_and_leaves_the_earlier_report_whole(tmp_path, write_scenario):
    write_scenario(tmp_path, "tiny_match")
    (tmp_path / "rep").mkdir()
    (tmp_path / "rep" / "index.html").write_text("an earlier report")
    done = _limited(["-m", "harness", "run", "scenarios", "--jobs", "1", "--json", "r.json", "--report-dir", "rep"],
                    tmp_path, FITS_JSON)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == "the HTML report was not written to rep (nothing of it is there): File too large"
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["complete"] is True and len(doc["records"]) == 6
    assert f"JSON: {tmp_path / 'r.json'}" in done.stdout and "KV report" not in done.stdout
    # the earlier report as it was: no page of the new one beside it, no temporary file
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == ["index.html"]
    assert (tmp_path / "rep" / "index.html").read_text() == "an earlier report"
    assert _leftovers(tmp_path) == []


@pytest.mark.slow  # a CLI child importing torch: seconds (tests/README.md, "By cost")
def test_a_disk_too_full_for_the_json_says_so_and_leaves_no_part_of_either(tmp_path, write_scenario):
    write_scenario(tmp_path, "tiny_match")
    done = _limited(["-m", "harness", "run", "scenarios", "--jobs", "1", "--json", "out/r.json", "--report-dir",
                     "rep"], tmp_path, 4096)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-2:] == [
        "the results were not written to out/r.json: File too large",
        "the HTML report was not written to rep (nothing of it is there): File too large"]
    assert not (tmp_path / "rep").exists() and list((tmp_path / "out").iterdir()) == []
    assert "JSON:" not in done.stdout


@pytest.mark.slow
def test_pytest_keeps_the_json_when_the_report_does_not_fit_and_fails_the_session(tmp_path, write_scenario):
    write_scenario(tmp_path, "tiny_match")
    done = _limited(["-m", "pytest", "-p", "harness.plugin", "-p", "no:cacheprovider", "-p", "no:randomly", "-q",
                     "scenarios", "--harness-json", "r.json", "--harness-report", "rep"], tmp_path, FITS_JSON)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "7 passed" in done.stdout and "Traceback" not in done.stdout + done.stderr
    assert "the HTML report was not written to rep (nothing of it is there): File too large" in done.stdout
    assert f"KV results: {tmp_path / 'r.json'}" in done.stdout
    assert len(json.loads((tmp_path / "r.json").read_text())["records"]) == 6
    assert not (tmp_path / "rep").exists() and _leftovers(tmp_path) == []

"""The HTML report from the front doors: pytest ``--harness-report`` and the CLI's ``run --report-dir`` and
``report``; each prints the index's address on one line. (Merging xdist workers into one report is checked
with the JSON document in ``test_report_session.py``, on the same parallel run.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main


def test_a_run_stopped_early_says_its_report_is_incomplete(harness_pytester, add_scenario):
    add_scenario("tiny_wrong_window", replace={'verdict = "diverge"': 'verdict = "match"'})
    add_scenario("tiny_stale_error")
    result = harness_pytester.runpytest_inprocess("-q", "-x", "--harness-report", "rep")
    assert result.ret == 1
    rep = harness_pytester.path / "rep"
    assert json.loads((rep / "results.json").read_text())["complete"] is False
    index = (rep / "index.html").read_text()
    assert "Incomplete:" in index and 'id="unexpected"' in index


@pytest.fixture
def cli_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_torch_thread: None) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_cli_run_with_report_dir_writes_the_report_and_prints_its_address(cli_dir, capsys, write_scenario):
    write_scenario(cli_dir, "tiny_wrong_window")
    code = main(["run", "--jobs", "1", "--report-dir", "out/rep"])
    out = capsys.readouterr().out
    assert code == 0
    index = cli_dir / "out" / "rep" / "index.html"
    assert out.splitlines()[-1] == f"KV report: {index.resolve().as_uri()}"
    page = index.read_text()
    assert "<th>command</th><td>python -m harness run --jobs 1 --report-dir out/rep</td>" in page
    assert (cli_dir / "out" / "rep" / "scenarios" / "tiny_wrong_window.html").exists()
    assert len(json.loads((cli_dir / "out" / "rep" / "results.json").read_text())["records"]) == 2


def test_report_command_writes_reports_folder(cli_dir, capsys, write_scenario):
    write_scenario(cli_dir, "tiny_wrong_window", replace={'verdict = "diverge"': 'verdict = "match"'})
    code = main(["report", "--jobs", "1"])
    out = capsys.readouterr().out
    assert code == 1  # an unexpected verdict: the report is written all the same
    index = cli_dir / "reports" / "index.html"
    assert f"KV report: {index.resolve().as_uri()}" in out
    assert 'id="unexpected"' in index.read_text()

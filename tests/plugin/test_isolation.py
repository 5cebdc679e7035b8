"""A design that exits, aborts, hangs or raises ends as an ``error`` verdict of its own run; every other run
completes, under ``--jobs 1`` and ``--jobs 2`` (pytest-xdist: ``test_report_session.py``, which shares one
xdist run between both claims)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

SAMPLES = Path(__file__).parent / "samples"

EXPECTED_ERRORS = {
    "misbehaving_designs:exits": "SystemExit: 3",
    "misbehaving_designs:aborts": "worker died (signal 6)",
    "misbehaving_designs:hangs": "timed out after 2 s",
    "misbehaving_designs:raises": "ValueError: boom",
}


def check_misbehaving(records: list[dict]) -> None:
    by_design = {r["design"]: r for r in records}
    assert by_design["translate"]["verdict"] == "match"
    for design, message in EXPECTED_ERRORS.items():
        record = by_design[design]
        assert record["verdict"] == "error" and record["ok"], record
        assert message in f"{record['error']['type']}: {record['error']['message']}", record["error"]


@pytest.fixture
def misbehaving_dir(cli_dir: Path, write_scenario, monkeypatch) -> Path:
    write_scenario(cli_dir, "tiny_misbehaving")
    shutil.copy(SAMPLES / "misbehaving_designs.py", cli_dir)
    monkeypatch.syspath_prepend(str(cli_dir))
    return cli_dir


@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.slow
def test_cli_records_each_misbehaving_design_as_an_error_and_finishes_the_rest(misbehaving_dir, capsys, jobs):
    from harness.cli import main

    code = main(["run", "scenarios", "--jobs", jobs, "--json", "r.json"])
    out = capsys.readouterr().out
    assert code == 0, out
    check_misbehaving(json.loads(Path("r.json").read_text())["records"])
    assert "5 as expected, 0 unexpected" in out

"""A design that kills more than its own run costs only its own case, an ``error`` verdict, under the CLI and
under pytest-xdist alike: one that kills its parent kills only the guard its run's process has
(``check.workers``); one that kills the pytest-xdist worker running its scenario file is reported, by the
worker that replaces it, as the item that crashed, and is not run again (each run again would have killed
one more worker: 9 workers and 3 minutes for one bad design); the file's other items still run."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

SAMPLES = Path(__file__).parent / "samples"
KILLS_PARENT = "crashing_designs:kills_its_parent"
KILLS_WORKER = "crashing_designs:kills_its_worker"


def test_cli_a_design_that_kills_its_parent_costs_only_its_case(cli_dir, write_scenario, monkeypatch, capsys):
    from harness.cli import main

    write_scenario(cli_dir, "tiny_match")
    shutil.copy(SAMPLES / "crashing_designs.py", cli_dir)
    monkeypatch.syspath_prepend(str(cli_dir))
    code = main(["run", "scenarios", "--jobs", "2", "--json", "r.json", "--design", KILLS_PARENT,
                 "--design", "translate", "--expect", "error"])
    out = capsys.readouterr().out
    assert code == 0, out
    records = json.loads(Path("r.json").read_text())["records"]
    crashed = [r for r in records if r["design"] == KILLS_PARENT]
    assert len(crashed) == 2 and all(r["verdict"] == "error" and r["ok"] for r in crashed), crashed
    assert {r["error"]["message"] for r in crashed} == {"worker died (signal 9)"}
    assert [r["verdict"] for r in records if r["design"] == "translate"] == ["match", "match"]


@pytest.mark.slow
def test_xdist_a_design_that_kills_its_worker_costs_only_its_item(harness_pytester, add_scenario):
    add_scenario("tiny_crashing")
    add_scenario("tiny_match")
    shutil.copy(SAMPLES / "crashing_designs.py", harness_pytester.path)
    start = time.monotonic()
    # a subprocess: the design finds its worker as the process below the one named pytest
    result = harness_pytester.runpytest_subprocess("-q", "-p", "no:randomly", "-n", "2", "--dist", "loadfile",
                                                   "-p", "no:cacheprovider", "--harness-json", "r.json",
                                                   timeout=600)
    took = time.monotonic() - start
    out = result.stdout.str()
    assert result.ret == 0, out
    # tiny_crashing: the oracle item and three runs; tiny_match: the oracle item and six runs; the crash once
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 11 and "failed" not in outcomes, out
    assert out.count("node down") == 1, out  # one worker crashed, and only one
    by_design = {r["design"]: r for r in json.loads((harness_pytester.path / "r.json").read_text())["records"]
                 if r["scenario"] == "tiny_crashing"}
    assert by_design["translate"]["verdict"] == "match"
    assert by_design[KILLS_PARENT]["error"]["message"] == "worker died (signal 9)"
    died = by_design[KILLS_WORKER]
    assert died["verdict"] == "error" and died["ok"] and died["error"]["type"] == "WorkerDied", died
    assert died["error"]["message"].startswith("the pytest-xdist worker gw") and \
        died["error"]["message"].endswith("died running this case; it was not run again"), died["error"]
    assert took < 300

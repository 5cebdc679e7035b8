"""Gold tests: the terminal failure block and the JSON record of real runs, paths and timings scrubbed.

A change to what a reviewer reads shows up here as a diff. Regenerate on purpose with
``HARNESS_UPDATE_GOLD=1 pytest tests/report`` and review the diff of ``tests/report/gold/`` (docs/reference.md shows
pad_tail_failure_block.txt as it is: copy it there too).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.check.case import cases
from harness.check.matrix import run_case
from harness.report.build import case_view
from harness.report.text import failure_block
from harness.report.views import CaseView
from harness.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
GOLD = Path(__file__).parent / "gold"
SAMPLES = ROOT / "tests" / "plugin" / "samples"
PAD_TAIL = ROOT / "scenarios" / "faults" / "swa_decode_pad_tail_not_zeroed.toml"


def _view(path: Path, design: str, mode: str) -> CaseView:
    spec = load_scenario(path)
    case = next(c for c in cases(spec) if c.design == design and c.mode == mode and c.with_faults)
    return case_view(run_case(case), duration_s=0.0)


def _scrub(text: str) -> str:
    return text.replace(str(ROOT) + os.sep, "")


def _check(name: str, actual: str) -> None:
    gold = GOLD / name
    if os.environ.get("HARNESS_UPDATE_GOLD"):
        gold.write_text(actual)
    assert actual == gold.read_text(), f"{name} changed; if on purpose, regenerate with HARNESS_UPDATE_GOLD=1"


@pytest.fixture(autouse=True)
def _run_from_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # reproduce lines name paths relative to the working directory


def test_failure_block_of_a_padded_decode_graph_overwriting_live_swa_kv():
    view = _view(PAD_TAIL, "forward_batch", "full")
    assert view.verdict == "diverge"
    # pretend the scenario expected a match, as it would if PR 24743's bug came back in a "fixed" runner
    block = failure_block(CaseView.from_record({**view.to_record(), "expected": "match"}))
    _check("pad_tail_failure_block.txt", _scrub(block) + "\n")


def test_the_reference_shows_the_failure_block_a_run_prints():
    # "Reading a failure" is the gold block itself, so neither can drift from what a run prints
    readme = (Path(__file__).resolve().parents[2] / "docs/reference.md").read_text()
    section = readme[readme.index("## Reading a failure"):]
    shown = section[section.index("```\n") + 4:]
    shown = shown[:shown.index("```\n")]
    assert shown == (GOLD / "pad_tail_failure_block.txt").read_text()


def test_json_record_of_a_window_fault_run():
    view = _view(SAMPLES / "tiny_wrong_window.toml", "forward_batch", "eager")
    record = json.dumps(view.to_record(), indent=1, sort_keys=True)
    _check("tiny_wrong_window_record.json", _scrub(record) + "\n")


def test_a_record_round_trips_to_an_equal_view():
    view = _view(PAD_TAIL, "stale_state", "full")
    assert CaseView.from_record(json.loads(json.dumps(view.to_record()))) == view

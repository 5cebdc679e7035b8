"""Every finding of the graph-runner fuzz property written under scenarios/regressions/ (tagged sglang-graph)
replays through SGLang's decode graph runner: with the fault its tags name it still fails, without it it holds."""

import dataclasses
from pathlib import Path

import pytest

from harness.scenario.loader import load_scenario
from harness.sglang import graph_fuzz

ROOT = Path(__file__).resolve().parents[2]
FINDINGS = [p for p in sorted((ROOT / "scenarios" / "regressions").glob("*.toml"))
            if f'"{graph_fuzz.TAG}"' in p.read_text()]


NONE_YET = pytest.param(None, id="none-yet", marks=pytest.mark.skip(
    reason="no graph-runner finding is written under scenarios/regressions/ yet (python -m harness fuzz --target "
           "sglang-graph writes them there)"))


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for p in FINDINGS] or [NONE_YET])
def test_a_written_graph_finding_replays(path):
    case = graph_fuzz.case_of(load_scenario(path))
    if case.fault is not None:
        assert graph_fuzz.judge(case) is not None, f"{path.name}: {case.fault} no longer fails this case"
    clean = graph_fuzz.judge(dataclasses.replace(case, fault=None))
    assert clean is None, f"{path.name}: {clean.message}"

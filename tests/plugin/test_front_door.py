"""What a user meets before any run: how fast help, listing and option errors come back, what an option
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

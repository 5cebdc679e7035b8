"""Where a scenario's reference run is computed: with one job, in this process before its group's child forks (the
oracle item reads it from there); with more, inside the group's own child for built-in cases, so that the parent
never holds up the next fork while a child slot stands idle. Verdicts do not depend on where."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.check.matrix import matrix
from harness.check.matrix.case import cases
from harness.scenario.loader import load_scenario

SCENARIO = Path(__file__).parents[2] / "scenarios" / "swa_decode_padded_buckets.toml"


@pytest.fixture
def no_cached_references(monkeypatch):
    monkeypatch.setattr(matrix, "_REFERENCES", type(matrix._REFERENCES)())


def _eager_cases():
    return [c for c in cases(load_scenario(SCENARIO)) if c.mode == "eager" and c.backend == "torch_native"][:2]


def test_with_several_jobs_a_builtin_groups_child_computes_its_reference_and_gives_the_same_verdicts(
        no_cached_references):
    picked = _eager_cases()
    assert len(picked) == 2 and all(c.builtin for c in picked)
    parallel = matrix.run_cases(picked, jobs=2)
    assert not matrix._REFERENCES  # the parent computed none
    serial = matrix.run_cases(picked, jobs=1)
    assert len(matrix._REFERENCES) == 1  # one job: computed here, once, for both cases
    assert [r.verdict.outcome for r in parallel] == [r.verdict.outcome for r in serial]
    assert all(r.ok for r in parallel)


def test_a_reference_that_timed_out_is_not_cached_and_the_next_case_computes_it_again(
        no_cached_references, monkeypatch):
    from harness.check.run.workers import WorkerDied

    scenario = load_scenario(SCENARIO)
    calls = []

    def isolated(fn, spec, *, timeout_s):
        calls.append(spec)
        if len(calls) == 1:
            return WorkerDied(reason=f"timed out after {timeout_s:g} s", timed_out=True)
        return fn(spec)

    monkeypatch.setattr(matrix, "run_one_isolated", isolated)
    first = matrix.scenario_reference(scenario, backend="torch_native", isolate=True, timeout_s=1.0)
    assert first.error is not None and first.error.type == "Timeout"
    assert not matrix._REFERENCES
    second = matrix.scenario_reference(scenario, backend="torch_native", isolate=True, timeout_s=1.0)
    assert second.error is None and len(calls) == 2
    assert matrix.scenario_reference(scenario, backend="torch_native", isolate=True) is second  # cached now
    assert len(calls) == 2


def test_a_reference_whose_child_died_otherwise_is_cached(no_cached_references, monkeypatch):
    from harness.check.run.workers import WorkerDied

    scenario = load_scenario(SCENARIO)
    calls = []

    def isolated(fn, spec, *, timeout_s):
        calls.append(spec)
        return WorkerDied(reason="worker died (signal 11)")

    monkeypatch.setattr(matrix, "run_one_isolated", isolated)
    first = matrix.scenario_reference(scenario, backend="torch_native", isolate=True)
    assert first.error is not None and first.error.type == "WorkerDied"
    assert matrix.scenario_reference(scenario, backend="torch_native", isolate=True) is first
    assert len(calls) == 1

"""The differential fuzz property: generated timelines through the miniature and the installed SGLang.

It finds nothing on the current tree in a short search, and it can fail: with the miniature's free order put
back to its own default (a named difference undone) it finds the difference, shrinks it and writes it once."""

import dataclasses

import pytest

from harness.sglang import fuzz as fuzz_differential
from harness.scenario.loader import load_scenario
from harness.serving.timeline import RequestSpec, TimelineSpec
from harness.sglang import differential


@pytest.mark.slow
def test_a_short_search_finds_no_difference_between_the_miniature_and_sglang():
    report = fuzz_differential.fuzz_differential(budget_s=600, seed=0, database=None, max_examples=8)
    assert report.tried >= 8
    assert report.findings == (), "\n".join(f.describe() for f in report.findings)


def _lowest_first_miniature(monkeypatch):
    """The miniature reuses its lowest free slot first (its own default), SGLang its own order: the "free
    order" difference no longer made up for."""
    original = differential.comparable_spec

    def comparable(spec, **knobs):
        made = original(spec, **knobs)
        return dataclasses.replace(made, pool=dataclasses.replace(made.pool, free_order="lowest"))

    real_trace = differential.trace

    def trace(spec, *, installed, **knobs):
        # the miniature's side only: SGLang's allocator, and what SGLang can express, keep the comparable spec
        if installed:
            return real_trace(spec, installed=True, **knobs)
        monkeypatch.setattr(differential, "comparable_spec", comparable)
        try:
            return real_trace(spec, installed=False, **knobs)
        finally:
            monkeypatch.setattr(differential, "comparable_spec", original)

    monkeypatch.setattr(differential, "trace", trace)


@pytest.mark.slow
def test_with_a_named_difference_undone_the_search_finds_shrinks_and_writes_it_once(monkeypatch, tmp_path):
    _lowest_first_miniature(monkeypatch)
    report = fuzz_differential.fuzz_differential(budget_s=600, seed=0, database=None, multiple=False,
                                                 max_examples=60, shrink_examples=150)
    assert report.first_failure is not None, f"nothing found in {report.tried} examples"
    (finding,) = report.findings
    assert finding.kind == "fidelity" and finding.signature.startswith("fidelity: ")
    assert "differs" in finding.message and finding.message.startswith("step ")
    assert report.shrink_steps > 0
    assert len(finding.case.spec.timeline.requests) <= 2, finding.describe()
    path = fuzz_differential.write_finding(finding, folder=tmp_path, command="the test")
    assert path is not None and fuzz_differential.write_finding(finding, folder=tmp_path, command="again") is None
    # the file replays the difference the way the differential test reads a library scenario
    scenario = load_scenario(path)
    spec = scenario.run_spec(design=scenario.designs[0], mode=scenario.modes[0], backend=scenario.backends[0],
                             with_faults=False)
    knobs = {"page_size": finding.case.page_size, "interval": finding.case.interval}
    assert differential.first_difference(differential.trace(spec, installed=False, **knobs),
                                         differential.trace(spec, installed=True, **knobs)) is not None


def _case(**timeline):
    base = load_scenario(next(p for p in differential_scenarios() if p.stem == "swa_evict_sglang_policy_fifo_reuse"))
    spec = base.run_spec(design=base.designs[0], mode=base.modes[0], backend=base.backends[0], with_faults=False)
    spec = dataclasses.replace(spec, timeline=TimelineSpec(**timeline))
    return fuzz_differential.Case(spec=spec, interval=1)


def differential_scenarios():
    from pathlib import Path

    return sorted((Path(__file__).resolve().parents[2] / "scenarios").glob("**/*.toml"))


def test_one_case_is_judged_agreeing_and_a_difference_is_named_by_its_field(monkeypatch):
    case = _case(requests=(RequestSpec(rid="a", prompt_len=8, output_len=6),
                           RequestSpec(rid="b", arrive=3, prompt_len=4, output_len=2)))
    assert fuzz_differential.judge(case) is None
    _lowest_first_miniature(monkeypatch)
    failure = fuzz_differential.judge(case)
    assert failure is not None and failure.kind == "fidelity"
    assert failure.signature.endswith("differs") and "N" not in failure.signature.split(":")[0]


def test_an_exception_inside_sglang_is_a_candidate_defect_with_strict_invariant_checks(monkeypatch):
    import os

    case = _case(requests=(RequestSpec(rid="a", prompt_len=8, output_len=2),))
    levels = []
    real_trace = differential.trace

    def trace(spec, *, installed, **knobs):
        if installed:
            levels.append(os.environ.get("SGLANG_INVARIANT_CHECK"))
            raise RuntimeError("free_full_segment of page 12 failed")
        return real_trace(spec, installed=False, **knobs)

    monkeypatch.setattr(differential, "trace", trace)
    before = os.environ.get("SGLANG_INVARIANT_CHECK")
    failure = fuzz_differential.judge(case)
    assert levels == ["2"] and os.environ.get("SGLANG_INVARIANT_CHECK") == before
    assert failure.kind == "SGLang raised"
    assert failure.signature == "SGLang raised: RuntimeError: free_full_segment of page N failed"

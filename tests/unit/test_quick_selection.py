"""The quick selection (``check/matrix/quick.py``): what make test keeps of the library, and what it leaves to
make test-slow. Built on library scenario files; nothing runs."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from pathlib import Path

import pytest

from harness.check.matrix.case import Case, cases
from harness.check.matrix.quick import quick, quick_names
from harness.scenario.loader import load_all, load_scenario

ROOT = Path(__file__).resolve().parents[2] / "scenarios"
# a design that diverges only under graphs, a fault scenario with clean reruns, two backends
MIXED = ROOT / "swa_paged_sglang_pages_of_16.toml"


@pytest.fixture(scope="module")
def library() -> list[Case]:
    specs, errors = load_all([ROOT], full=False)
    assert not errors
    return [c for spec in specs for c in cases(spec)]


def _verdicts(listed: list[Case]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = defaultdict(set)
    for c in listed:
        out[(c.scenario.name, c.design)].add(c.expected)
    return out


def _first_backend_with_faults(listed: list[Case]) -> list[Case]:
    return [c for c in listed if c.backend == c.scenario.backends[0] and (c.with_faults or not c.scenario.faults)]


def test_every_design_keeps_each_of_its_expected_verdicts_once_on_every_scenario(library):
    runnable = [c for c in _first_backend_with_faults(library) if c.unsupported is None]
    kept = [c for c in quick(library) if c.unsupported is None]
    assert _verdicts(kept) == _verdicts(runnable)
    seen = [(c.scenario.name, c.design, c.expected) for c in kept]
    assert len(seen) == len(set(seen)), "a verdict stood for twice"
    # the library is a real matrix: a good share is left to the full suite
    assert len(kept) < 0.7 * len(runnable)


def test_a_graph_mode_stands_for_a_verdict_before_eager(library):
    kept = {c.name for c in quick(library)}
    by_group: dict[tuple[str, str, str], list[Case]] = defaultdict(list)
    for c in _first_backend_with_faults(library):
        if c.unsupported is None:
            by_group[(c.scenario.name, c.design, c.expected)].append(c)
    checked = 0
    for group in by_group.values():
        modes = {c.mode: c for c in group}
        if "full" in modes:
            assert modes["full"].name in kept
            assert all(c.name not in kept for c in group if c.mode != "full")
            checked += 1
        elif "piecewise" in modes and "eager" in modes:
            assert modes["piecewise"].name in kept and modes["eager"].name not in kept
            checked += 1
    assert checked > 50


def test_other_backends_and_clean_reruns_are_never_quick():
    listed = cases(load_scenario(MIXED))
    names = quick_names(listed)
    spec = listed[0].scenario
    assert len(spec.backends) > 1
    assert not [c for c in listed if c.name in names and c.backend != spec.backends[0]]
    faulted = [c for c in (cases(s) for s in load_all([ROOT / "faults"], full=False)[0]) for c in c]
    assert any(not c.with_faults for c in faulted)
    assert not [c for c in faulted if not c.with_faults and c.name in quick_names(faulted)]


def test_a_skipped_case_is_kept_and_the_next_mode_with_its_verdict_stands_for_it():
    listed = cases(load_scenario(MIXED))
    first = listed[0].scenario.backends[0]
    design = next(c.design for c in listed
                  if c.mode == "full" and c.backend == first and
                  {x.expected for x in listed if x.design == c.design and x.backend == first} == {c.expected})
    hidden = [dataclasses.replace(c, unsupported="not here") if (c.design, c.mode, c.backend) == (design, "full", first)
              else c for c in listed]
    names = quick_names(hidden)
    mine = {c.mode: c for c in hidden if c.design == design and c.backend == first}
    assert mine["full"].name in names  # the skip says why, at no cost
    stand_in = "piecewise" if "piecewise" in mine else "eager"
    assert mine[stand_in].name in names


def test_a_case_that_diverges_only_under_graphs_keeps_its_eager_match_too(library):
    kept = {c.name for c in quick(library)}
    found = 0
    for (scenario, design), verdicts in _verdicts(_first_backend_with_faults(library)).items():
        if verdicts >= {"match", "diverge"}:
            mine = [c for c in _first_backend_with_faults(library) if (c.scenario.name, c.design) == (scenario, design)]
            assert {c.expected for c in mine if c.name in kept} >= {"match", "diverge"}
            found += 1
    assert found > 10

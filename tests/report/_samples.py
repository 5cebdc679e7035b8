"""Case views of a real small run of the sample scenarios, shared by the report tests.

The samples (``tests/plugin/samples/``) give every shape a report must draw: a scenario where every design
matches, one that diverges in eager mode, one that fails with an error, and a padded decode graph that
overwrites a live token's SWA slot (with graph statistics and input-audit findings).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from harness.check.case import cases
from harness.check.matrix import run_case
from harness.report.build import case_view
from harness.report.views import CaseView
from harness.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "tests" / "plugin" / "samples"
SAMPLE_NAMES = ("tiny_match", "tiny_wrong_window", "tiny_stale_error", "tiny_pad_tail")


def run_samples(names=SAMPLE_NAMES) -> list[CaseView]:
    views = []
    for name in names:
        for case in cases(load_scenario(SAMPLES / f"{name}.toml")):
            views.append(case_view(run_case(case), duration_s=0.0) if case.unsupported is None
                         else case_view(None, case=case))
    return views


def pick(views, name: str) -> CaseView:
    return next(v for v in views if v.name == name)


def with_expected(view: CaseView, expected: str) -> CaseView:
    """The same run judged against another expectation (an unexpected result, without another run)."""
    return dataclasses.replace(view, expected=expected)

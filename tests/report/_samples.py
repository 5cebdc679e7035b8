"""Case views of a real small run of the sample scenarios, shared by the report tests.

The samples (``tests/plugin/samples/``) give every shape a report must draw: a scenario where every design
matches, one that diverges in eager mode, one that fails with an error, and a padded decode graph that
overwrites a live token's SWA slot (with graph statistics and input-audit findings).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from harness.check.matrix.case import cases
from harness.check.matrix.matrix import run_case
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


def synthetic_runs(template: CaseView, *, scenarios: int, designs: tuple[str, ...], modes: tuple[str, ...],
                   unexpected: dict[tuple[str, str], int]) -> list[CaseView]:
    """A library-sized result set from one matching run: every scenario runs every design and mode; in the
    first ``n`` scenarios the run of each (design, mode) in ``unexpected`` is an unexpected match (its
    scenario expects ``diverge``)."""
    views = []
    for i in range(scenarios):
        name = f"syn_{i:03}"
        for d in designs:
            for m in modes:
                views.append(dataclasses.replace(
                    template, name=f"{name}[{d}-{m}-{template.backend}]", scenario=name, path=f"synthetic/{name}.toml",
                    design=d, mode=m, clean_rerun=False, faults=(),
                    expected="diverge" if i < unexpected.get((d, m), 0) else template.expected))
    return views


MANY_DESIGNS = ("forward_batch", "translate", "stale_state", "metadata", "plan")
MANY_UNEXPECTED = {("metadata", "full"): 22, ("translate", "full"): 10,
                   **{(d, m): 1 for d in MANY_DESIGNS for m in ("eager", "full")
                      if (d, m) not in (("metadata", "full"), ("translate", "full"))}}
"""40 unexpected runs: 22 of metadata x full, 10 of translate x full, one in each of 8 other groups"""


def many_unexpected(views) -> list[CaseView]:
    """240 runs (24 scenarios, 5 designs, 2 modes), 40 of them unexpected (``MANY_UNEXPECTED``)."""
    return synthetic_runs(pick(views, "tiny_match[forward_batch-eager-torch_native]"), scenarios=24,
                          designs=MANY_DESIGNS, modes=("eager", "full"), unexpected=MANY_UNEXPECTED)

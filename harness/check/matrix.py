"""The scenario matrix: every (scenario, design, mode, backend) case, run and judged against expectations.

Shared by the pytest items and ``python -m harness run`` so both select, name and judge cases alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable

import torch

from ..scenario import ScenarioSpec
from .run import RunResult, RunSpec, execute
from .verdict import Verdict, judge


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    scenario: ScenarioSpec
    design: str
    mode: str
    backend: str
    engine: str = "tape"
    device: str = "cpu"
    with_faults: bool = True
    """False: the scenario's faults switched off, judged against the ``without_faults`` expectation"""

    @property
    def name(self) -> str:
        """``scenario[design-mode-backend]``, the pytest item name; ``-nofault`` marks a clean rerun."""
        suffix = "" if self.with_faults or not self.scenario.faults else "-nofault"
        return f"{self.scenario.name}[{self.design}-{self.mode}-{self.backend}{suffix}]"

    @property
    def expected(self) -> str:
        exp = self.scenario.expectation(self.design)
        if not self.with_faults:
            assert exp.without_faults is not None
            return exp.without_faults
        return exp.for_mode(self.mode)

    @property
    def why(self) -> str:
        return self.scenario.expectation(self.design).why

    @property
    def faults(self) -> frozenset[str]:
        return self.scenario.faults if self.with_faults else frozenset()

    def run_spec(self) -> RunSpec:
        return self.scenario.run_spec(
            design=self.design, mode=self.mode, backend=self.backend, engine=self.engine, device=self.device,
            with_faults=self.with_faults,
        )

    def reproduce(self) -> str:
        path = _display_path(self.scenario.path)
        cli = (f"python -m harness run {path} --design {self.design} --mode {self.mode} "
               f"--backend {self.backend} --engine {self.engine}")
        return f"pytest '{path}::{self.name}'   or   {cli}"


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseResult:
    case: Case
    verdict: Verdict

    @property
    def ok(self) -> bool:
        return self.verdict.outcome == self.case.expected


def cases(
    scenario: ScenarioSpec,
    *,
    designs: Iterable[str] | None = None,
    modes: Iterable[str] | None = None,
    backends: Iterable[str] | None = None,
    engine: str = "tape",
    device: str = "cpu",
) -> list[Case]:
    """Every case of one scenario that the filters keep, clean reruns of fault scenarios included."""
    keep_designs = set(designs) if designs else None
    keep_modes = set(modes) if modes else None
    keep_backends = set(backends) if backends else None
    out = []
    for backend in scenario.backends:
        if keep_backends is not None and backend not in keep_backends:
            continue
        for design in scenario.designs:
            if keep_designs is not None and design not in keep_designs:
                continue
            exp = scenario.expectation(design)
            for mode in scenario.modes:
                if keep_modes is not None and mode not in keep_modes:
                    continue
                common = dict(scenario=scenario, design=design, mode=mode, backend=backend, engine=engine,
                              device=device)
                out.append(Case(**common))
                if scenario.faults and exp.without_faults is not None:
                    out.append(Case(**common, with_faults=False))
    return out


def limit_threads() -> None:
    """One intra-op thread per process: the tensors are tiny, and pytest-xdist or --jobs already use every
    core; oversubscribed torch threads made runs fifty times slower on a loaded 2-core machine."""
    torch.set_num_threads(1)


@lru_cache(maxsize=32)
def _reference(reference_spec: RunSpec) -> RunResult:
    # one reference run per (scenario, backend, device) in a process; xdist workers each keep their own
    return execute(reference_spec)


def scenario_reference(scenario: ScenarioSpec, *, backend: str, device: str = "cpu") -> RunResult:
    """The reference run of a scenario, whichever designs and modes it lists."""
    spec = scenario.run_spec(design=scenario.designs[0], mode=scenario.modes[0], backend=backend, device=device,
                             with_faults=False)
    return _reference(spec.reference())


def run_case(case: Case) -> CaseResult:
    """Run the subject, judge it against the (cached) reference run. Never raises for a run's failure."""
    reference = scenario_reference(case.scenario, backend=case.backend, device=case.device)
    return CaseResult(case=case, verdict=judge(execute(case.run_spec()), reference))


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)

"""The scenario matrix's cells: one (scenario, design, mode, backend) run and what it should give.

Shared by the pytest items and ``python -m harness run`` so both select, name and judge cases alike.
A backend's declaration decides the device a case runs on and whether it can run at all: a case the
backend does not support (its mode, KV write path, page size or layout, or a fault it has no switch for)
becomes a case with every reason, skipped rather than run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..backends.base import AttentionBackend
from ..backends.registry import BACKENDS, backend_class
from ..runspec import TIMEOUT_DEFAULT_S, Device, Engine, RunSpec
from ..scenario.spec import ScenarioSpec
from ..serving.designs import DESIGNS
from ..serving.registry import EVICTION_POLICIES, OPTIONAL_STACKS, STACKS
from .expect import EXPECT_DEFAULT, LIKE, NO_EXPECTATION, expect_problem  # noqa: F401 - case's vocabulary too
from .verdict import Verdict


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    scenario: ScenarioSpec
    design: str
    mode: str
    backend: str
    engine: str = Engine.TAPE
    device: str = Device.CPU
    with_faults: bool = True
    """False: the scenario's faults switched off, judged against the ``without_faults`` expectation"""
    unsupported: str | None = None
    """why the backend cannot run this case, every reason joined (it is skipped); None when it can"""
    timeout_s: float = TIMEOUT_DEFAULT_S
    """the run's time limit (the scenario's ``run.timeout_s`` unless overridden)"""
    expected_override: str | None = None
    """the expected verdict of a design the scenario does not list (``harness run --design ... --expect``)"""
    like: str | None = None
    """a listed design whose expectations this added design takes (``--expect like:DESIGN``)"""
    runner: str | None = None
    """the runner of this mode named by import path (``--runner MODE=package.module:Class``); None: built-in"""

    @property
    def name(self) -> str:
        """``scenario[design-mode-backend]``, the pytest item name; ``-nofault`` marks a clean rerun."""
        suffix = "" if self.with_faults or not self.scenario.faults else "-nofault"
        mode = self.mode if self.runner is None else f"{self.mode}={self.runner}"
        return f"{self.scenario.name}[{self.design}-{mode}-{self.backend}{suffix}]"

    @property
    def builtin(self) -> bool:
        """Every part of the run is the harness's own code: design, backend, runner, serving stack and eviction
        policy are registered names, none an import path or an optional install. Such runs are trusted to
        leave their process as they found it, so they may share a child process (``matrix.run_cases``)."""
        return (self.design in DESIGNS and self.backend in BACKENDS and self.runner is None
                and self.scenario.serving in STACKS and self.scenario.serving not in OPTIONAL_STACKS
                and self.scenario.eviction.policy in EVICTION_POLICIES)

    @property
    def listed(self) -> bool:
        """The scenario lists this design, so it states the expected verdict and why."""
        return self.design in self.scenario.designs

    @property
    def expected(self) -> str:
        judged_as = self._judged_as
        if judged_as is None:
            return self.expected_override or NO_EXPECTATION
        exp = self.scenario.expectation(judged_as).expected(mode=self.mode, backend=self.backend,
                                                            with_faults=self.with_faults)
        assert exp is not None, "cases() makes clean reruns only where a without_faults expectation exists"
        return exp

    @property
    def why(self) -> str:
        judged_as = self._judged_as
        if judged_as is None:
            return "a design the scenario does not list, added on the command line"
        why = self.scenario.expectation(judged_as).why_for(self.backend)
        return why if self.listed else f"expected like {judged_as}, which the scenario lists: {why}"

    @property
    def _judged_as(self) -> str | None:
        """The listed design whose expectation this case takes (its own, or ``like``'s); None: a fixed one."""
        if self.listed:
            return self.design
        return self.like if self.like in self.scenario.designs else None

    @property
    def faults(self) -> frozenset[str]:
        return frozenset(self.scenario.faults) if self.with_faults else frozenset()

    def run_spec(self) -> RunSpec:
        return self.scenario.run_spec(
            design=self.design, mode=self.mode, backend=self.backend, engine=self.engine, device=self.device,
            with_faults=self.with_faults, runner=self.runner,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseResult:
    case: Case
    verdict: Verdict
    duration_s: float | None = None
    """how long the run and its judgement took where they ran; None when nothing ran (it died)"""

    @property
    def ok(self) -> bool:
        return self.verdict.outcome == self.case.expected


def cases(
    scenario: ScenarioSpec,
    *,
    designs: Iterable[str] | None = None,
    modes: Iterable[str] | None = None,
    backends: Iterable[str] | None = None,
    engine: str | None = None,
    device: str = Device.CPU,
    extra_designs: Iterable[str] = (),
    expect: str | None = None,
    extra_backends: Iterable[str] = (),
    runners: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
) -> list[Case]:
    """Every case of one scenario that the filters keep, clean reruns of fault scenarios included.

    ``engine`` None picks each case's default: ``cuda`` for a case on a CUDA device, else ``tape``.
    ``extra_designs`` the scenario does not list run too, judged by ``expect`` (``EXPECT_DEFAULT`` when
    None): ``like:DESIGN`` expects of each run what the scenario expects of DESIGN in that mode, backend and
    fault setting (a scenario that does not list DESIGN skips them, saying so), an outcome expects it of
    every run; either way a fault scenario also runs them with the faults off, as it runs DESIGN (or, for an
    outcome, always). ``extra_backends`` it does not list run every design too, each expected to give what
    the scenario expects of the design (its ``by_backend`` entry for that name, if any). ``runners`` maps a
    mode to the runner (by import path) that replaces the built-in one in that mode. ``timeout_s``
    overrides the scenario's time limit.
    """
    expect = EXPECT_DEFAULT if expect is None else expect
    like = expect[len(LIKE):] if expect.startswith(LIKE) else None
    fixed = None if like is not None else expect
    keep_designs = set(designs) if designs else None
    keep_modes = set(modes) if modes else None
    keep_backends = set(backends) if backends else None
    runners = dict(runners or {})
    added = [b for b in dict.fromkeys(extra_backends) if b not in scenario.backends]
    out = []
    for backend in (*scenario.backends, *added):
        if keep_backends is not None and backend not in keep_backends and backend not in added:
            continue
        try:
            declared = backend_class(backend)
        except KeyError as exc:  # not found, or fails to import: its cases are skipped, saying why
            declared, missing, run_device = None, str(exc.args[0]), device
        else:
            # a backend that cannot run on the requested device runs on one it declares (marked gpu if CUDA)
            missing, run_device = None, device if device in declared.devices else sorted(declared.devices)[0]
        run_engine = engine or (Engine.CUDA if run_device == Device.CUDA else Engine.TAPE)
        extras = [d for d in dict.fromkeys(extra_designs) if d not in scenario.designs]
        for design in (*scenario.designs, *extras):
            if keep_designs is not None and design not in keep_designs and design not in extras:
                continue
            for mode in scenario.modes:
                if keep_modes is not None and mode not in keep_modes:
                    continue
                common = dict(scenario=scenario, design=design, mode=mode, backend=backend, engine=run_engine,
                              device=run_device, timeout_s=timeout_s if timeout_s is not None else scenario.timeout_s,
                              runner=runners.get(mode))
                unsupported = missing or _unsupported(declared, scenario, mode, run_device, with_faults=True)
                clean = missing or _unsupported(declared, scenario, mode, run_device, with_faults=False)
                if design in extras:
                    if like is not None and like not in scenario.designs:
                        why = f"the scenario lists no {like}, whose expectations an added design takes here"
                        out.append(Case(**common, unsupported=why, like=like))
                        continue
                    out.append(Case(**common, unsupported=unsupported, expected_override=fixed, like=like))
                    rerun = like is None or scenario.expectation(like).expected(
                        mode=mode, backend=backend, with_faults=False) is not None
                    if scenario.faults and rerun:
                        out.append(Case(**common, unsupported=clean, expected_override=fixed, like=like,
                                        with_faults=False))
                    continue
                out.append(Case(**common, unsupported=unsupported))
                exp = scenario.expectation(design)
                if scenario.faults and exp.expected(mode=mode, backend=backend, with_faults=False) is not None:
                    out.append(Case(**common, unsupported=clean, with_faults=False))
    return out


def _unsupported(declared: type[AttentionBackend] | None, scenario: ScenarioSpec, mode: str, device: str, *,
                 with_faults: bool) -> str | None:
    """Every reason the declared backend gives for not running the case, joined; None when it runs."""
    assert declared is not None
    reasons = declared.unsupported(mode=mode, device=device, kv_write=scenario.kv_write,
                                   page_size=scenario.pool.page_size,
                                   faults=scenario.faults if with_faults else (), model=scenario.model,
                                   kv_dtype=scenario.pool.kv_dtype)
    return "; ".join(reasons) or None

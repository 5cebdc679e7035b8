"""The scenario matrix's cells: one (scenario, design, mode, backend) run and what it should give.

Shared by the pytest items and ``python -m harness run`` so both select, name and judge cases alike. What
runs (``cells``) and how each run is judged (``judgement_of``, a ``judgement.Judgement``) are apart; a caller
with one spec and one expectation needs neither the matrix nor a scenario (``judgement.judge_one``).
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
from ..serving.designs import DESIGN_REGISTRY
from ..serving.registry import EVICTION_POLICIES, OPTIONAL_STACKS, STACKS
from .expect import EXPECT_DEFAULT, LIKE, NO_EXPECTATION, expect_problem  # noqa: F401 - case's vocabulary too
from .judgement import Judgement
from .verdict import Verdict


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """What to run (one cell of a scenario) and how it is judged (its ``judgement``), apart."""

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
    runner: str | None = None
    """the runner of this mode named by import path (``--runner MODE=package.module:Class``); None: built-in"""
    judgement: Judgement
    """what the run should give and why (``judgement_of``)"""

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
        return (self.design in DESIGN_REGISTRY and self.backend in BACKENDS and self.runner is None
                and self.scenario.serving in STACKS and self.scenario.serving not in OPTIONAL_STACKS
                and self.scenario.eviction.policy in EVICTION_POLICIES)

    @property
    def listed(self) -> bool:
        """The scenario lists this design, so it states the expected verdict and why."""
        return self.design in self.scenario.designs

    @property
    def expected(self) -> str:
        return self.judgement.expected

    @property
    def why(self) -> str:
        return self.judgement.why

    @property
    def like(self) -> str | None:
        """The listed design whose expectations this added design takes (``--expect like:DESIGN``)."""
        option = self.judgement.option
        return option[len(LIKE):] if option is not None and option.startswith(LIKE) else None

    @property
    def expected_override(self) -> str | None:
        """The fixed verdict an added design is expected to give (``--expect VERDICT``)."""
        option = self.judgement.option
        return option if option is not None and not option.startswith(LIKE) else None

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


def judgement_of(scenario: ScenarioSpec, *, design: str, mode: str, backend: str, with_faults: bool,
                 option: str | None = None) -> Judgement | None:
    """How one run of a scenario is judged: the scenario's expectation of a design it lists; for one it does
    not, ``option`` (``like:DESIGN``: the scenario's expectation of DESIGN there; an outcome: that). None
    where nothing is expected (a clean rerun without a ``without_faults`` expectation): no such run is made."""
    judged_as = design if design in scenario.designs else None
    if judged_as is None and option is not None and option.startswith(LIKE):
        judged_as = option[len(LIKE):] if option[len(LIKE):] in scenario.designs else None
    if judged_as is None:
        if option is not None and option.startswith(LIKE):  # a missing DESIGN: the case is skipped saying why
            return Judgement(expected=NO_EXPECTATION, why=_ADDED_WHY, option=option)
        return Judgement(expected=option or NO_EXPECTATION, why=_ADDED_WHY, option=option)
    exp = scenario.expectation(judged_as)
    expected = exp.expected(mode=mode, backend=backend, with_faults=with_faults)
    if expected is None:
        return None
    why = exp.why_for(backend)
    if judged_as != design:
        why = f"expected like {judged_as}, which the scenario lists: {why}"
    return Judgement(expected=expected, why=why, option=option if judged_as != design else None)


_ADDED_WHY = "a design the scenario does not list, added on the command line"


@dataclass(frozen=True, slots=True)
class _Cell:
    """What to run, before any judgement: one (backend, design, mode) of a scenario, where and how."""

    backend: str
    design: str
    mode: str
    device: str
    engine: str
    declared: type[AttentionBackend] | None
    missing: str | None
    """why the backend cannot be found or imported; its cells are skipped saying so"""
    added: bool
    """a design the scenario does not list (``extra_designs``)"""


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

    What runs is ``cells``' answer: ``engine`` None picks each case's default (``cuda`` for a case on a CUDA
    device, else ``tape``); ``extra_designs`` and ``extra_backends`` the scenario does not list run too.
    How each is judged is ``judgement_of``'s: an added design by ``expect`` (``EXPECT_DEFAULT`` when None):
    ``like:DESIGN`` expects of each run what the scenario expects of DESIGN in that mode, backend and fault
    setting (a scenario that does not list DESIGN skips them, saying so), an outcome expects it of every run;
    either way a fault scenario also runs them with the faults off, as it runs DESIGN (or, for an outcome,
    always). An added backend is expected to give what the scenario expects of the design (its
    ``by_backend`` entry for that name, if any). ``runners`` maps a mode to the runner (by import path) that
    replaces the built-in one in that mode. ``timeout_s`` overrides the scenario's time limit.
    """
    expect = EXPECT_DEFAULT if expect is None else expect
    runners = dict(runners or {})
    limit = timeout_s if timeout_s is not None else scenario.timeout_s
    out = []
    for cell in cells(scenario, designs=designs, modes=modes, backends=backends, engine=engine, device=device,
                      extra_designs=extra_designs, extra_backends=extra_backends):
        option = expect if cell.added else None
        common = dict(scenario=scenario, design=cell.design, mode=cell.mode, backend=cell.backend,
                      engine=cell.engine, device=cell.device, timeout_s=limit, runner=runners.get(cell.mode))
        for with_faults in (True, False) if scenario.faults else (True,):
            judgement = judgement_of(scenario, design=cell.design, mode=cell.mode, backend=cell.backend,
                                     with_faults=with_faults, option=option)
            if judgement is None:
                continue  # a clean rerun nobody expects anything of
            like = option[len(LIKE):] if option is not None and option.startswith(LIKE) else None
            if like is not None and like not in scenario.designs:  # nothing to take: one skipped case says so
                why = f"the scenario lists no {like}, whose expectations an added design takes here"
                out.append(Case(**common, unsupported=why, judgement=judgement))
                break
            unsupported = cell.missing or _unsupported(cell.declared, scenario, cell.mode, cell.device,
                                                       with_faults=with_faults)
            out.append(Case(**common, unsupported=unsupported, with_faults=with_faults, judgement=judgement))
    return out


def cells(
    scenario: ScenarioSpec,
    *,
    designs: Iterable[str] | None = None,
    modes: Iterable[str] | None = None,
    backends: Iterable[str] | None = None,
    engine: str | None = None,
    device: str = Device.CPU,
    extra_designs: Iterable[str] = (),
    extra_backends: Iterable[str] = (),
) -> list[_Cell]:
    """What runs: every (backend, design, mode) of a scenario the filters keep, the added designs and backends
    included (the filters never drop those), each on a device its backend declares."""
    keep_designs = set(designs) if designs else None
    keep_modes = set(modes) if modes else None
    keep_backends = set(backends) if backends else None
    added = [b for b in dict.fromkeys(extra_backends) if b not in scenario.backends]
    extras = [d for d in dict.fromkeys(extra_designs) if d not in scenario.designs]
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
        for design in (*scenario.designs, *extras):
            if keep_designs is not None and design not in keep_designs and design not in extras:
                continue
            for mode in scenario.modes:
                if keep_modes is None or mode in keep_modes:
                    out.append(_Cell(backend=backend, design=design, mode=mode, device=run_device, engine=run_engine,
                                     declared=declared, missing=missing, added=design in extras))
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

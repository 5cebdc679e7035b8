"""The scenario matrix's cells: one (scenario, design, mode, backend) run and what it should give.

Shared by the pytest items and ``python -m harness run`` so both select, name and judge cases alike. What
runs (``cells``) and how each run is judged (``judgement_of``, a ``judgement.Judgement``) are apart; a caller
with one spec and one expectation needs neither the matrix nor a scenario (``judgement.judge_one``).
A backend's declaration decides the device a case runs on and whether it can run at all: a case the
backend does not support (its mode, KV write path, page size or layout, or a fault it has no switch for)
becomes a case with every reason, skipped rather than run. A backend that does not import or whose
declarations break the contract gives cases that are errors (``Case.declaration_error``), never skips.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ...backends.base import AttentionBackend
from ...backends.registry import BACKENDS, backend_class, reference_backend, unsupported_reasons
from ...runspec import REFERENCE_DESIGN, TIMEOUT_DEFAULT_S, Device, Engine, Outcome, RunSpec
from ...scenario.spec import Expectation, ScenarioSpec
from ...serving.designs import DESIGN_REGISTRY, declared
from ...serving.kv_groups import hybrid_swa_groups
from ...serving.registry import (EVICTION_POLICIES, OPTIONAL_STACKS, STACKS, stack_class, stack_kv_groups,
                                  stack_unavailable)
from ...serving.stack import stack_spec
from .expect import (  # noqa: F401 - case's vocabulary too
    EXPECT_DEFAULT, INFORMATION, LIKE, NO_EXPECTATION, expect_problem, holds)
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
    declaration_error: str | None = None
    """why the run cannot be made: its backend does not import, or its declarations break the contract
    (``declarations.py``); the run is an error verdict saying so, never a skip, and nothing is expected of it"""

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
    def information(self) -> bool:
        """No verdict is known for this run (an added design under a fault scenario's faults, by default): what it
        gives says whether the fault reaches the design, and only its faults-off rerun is judged."""
        return self.judgement.expected == INFORMATION

    @property
    def faults(self) -> frozenset[str]:
        return frozenset(self.scenario.faults) if self.with_faults else frozenset()

    @property
    def reference_backend(self) -> str:
        """The backend of the eager run that judges this one (``backends.registry.reference_backend``)."""
        return reference_backend_of(self.scenario, self.backend, self.device)

    @property
    def judged_by(self) -> str | None:
        """Which reference run judges this one, in words, where plug-ins are involved (a backend, serving stack
        or eviction policy named by import path); None where everything is the library's own."""
        scenario = self.scenario
        plugged = plugged_in(scenario, self.backend)
        if not plugged:
            return None
        ref = self.reference_backend
        if ref == getattr(backend_class_or_none(self.backend), "reference_backend", None):
            how = "its declared reference_backend"
        elif ref == self.backend and self.backend in BACKENDS:
            how = "a registered backend"
        elif ref == self.backend:
            how = (f"its own: the library's reference backends serve SGLang's two KV groups, not the groups of "
                   f"{scenario.serving}")
        else:
            how = "the library's reference backend for this geometry: it declares no reference_backend"
        line = f"the eager {REFERENCE_DESIGN} run on {ref} ({how})"
        if scenario.serving not in STACKS or scenario.eviction.policy not in EVICTION_POLICIES:
            reference = self.run_spec().reference()
            parts = [_judging(what, mine, theirs, own_reason)
                     for what, mine, theirs, own_reason in (
                         ("serving stack", scenario.serving, reference.serving,
                          "no built-in stack has its KV groups, or it does not load"),
                         ("eviction policy", scenario.eviction.policy, reference.eviction.policy, "it does not load"))]
            line += ", on " + " with ".join(parts)
        return line + ", certified against the dense oracle"

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
        return holds(self.case.expected, self.verdict.outcome)


def _judging(what: str, mine: str, theirs: str, own_reason: str) -> str:
    """How the reference run's stack or policy relates to the subject's, in words."""
    if theirs != mine:
        return f"{what} {theirs} (the built-in {what} of the kind of {mine})"
    if mine in STACKS or mine in EVICTION_POLICIES:
        return f"{what} {mine}"
    return f"{what} {mine} (its own: {own_reason})"


def reference_geometry(scenario: ScenarioSpec, device: str) -> dict[str, object]:
    """What a reference backend must run: the scenario's eager run without faults, on ``device``."""
    return dict(mode="eager", device=device, kv_write=scenario.kv_write, page_size=scenario.pool.page_size,
                faults=(), model=scenario.model, kv_dtype=scenario.pool.kv_dtype)


def reference_backend_of(scenario: ScenarioSpec, backend: str, device: str) -> str:
    """The backend of the eager run that judges the runs of ``backend`` over ``scenario`` on ``device``."""
    return reference_backend(backend, library=_sglang_groups(scenario), **reference_geometry(scenario, device))


def _sglang_groups(scenario: ScenarioSpec) -> bool:
    """The scenario's stack has SGLang's two KV groups (full and SWA), the ones the library's backends serve;
    True for a registered stack and for one that does not load (its runs are errors saying why)."""
    if scenario.serving in STACKS:
        return True
    try:
        spec = stack_spec(scenario.model, scenario.pool)
        groups = stack_kv_groups(stack_class(scenario.serving), spec)
    except (KeyError, ImportError, ValueError):
        return True
    return groups == hybrid_swa_groups(
        layer_is_swa=spec.layer_is_swa, layer_windows=spec.layer_windows, full_size=spec.pool.full_size,
        swa_size=spec.pool.swa_size, page_size=spec.pool.page_size, kv_dtype=spec.pool.kv_dtype,
        num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim)


def plugged_in(scenario: ScenarioSpec, backend: str) -> list[str]:
    """The plug-ins (named by import path, not registered) among a run's backend, serving stack and eviction
    policy: the runs whose reference ``harness run`` certifies against the dense oracle."""
    return [name for name, known in ((backend, BACKENDS), (scenario.serving, STACKS),
                                     (scenario.eviction.policy, EVICTION_POLICIES)) if name not in known]


def backend_class_or_none(name: str) -> type[AttentionBackend] | None:
    try:
        return backend_class(name)
    except KeyError:
        return None


def judgement_of(scenario: ScenarioSpec, *, design: str, mode: str, backend: str, with_faults: bool,
                 option: str | None = None, by_default: bool = False) -> Judgement | None:
    """How one run of a scenario is judged: the scenario's expectation of a design it lists; for one it does
    not, ``option`` (``like:DESIGN``: the scenario's expectation of DESIGN there; an outcome: that). None
    where nothing is expected (a clean rerun without a ``without_faults`` expectation): no such run is made.

    ``by_default``: ``option`` is the default (``EXPECT_DEFAULT``), not the user's. The scenario's verdict of
    DESIGN under its faults says what the fault does to DESIGN's inputs, which an added design may never read
    (one that translates for itself matches where ``forward_batch`` diverges): such a run is ``INFORMATION``,
    and its faults-off rerun is always made, expected to give what DESIGN gives without the faults (a match
    where the scenario states nothing, for a design declared sound)."""
    judged_as = design if design in scenario.designs else None
    if judged_as is None and option is not None and option.startswith(LIKE):
        judged_as = option[len(LIKE):] if option[len(LIKE):] in scenario.designs else None
    if judged_as is None:
        if option is not None and option.startswith(LIKE):  # a missing DESIGN: the case is skipped saying why
            return Judgement(expected=NO_EXPECTATION, why=_ADDED_WHY, option=option)
        return Judgement(expected=option or NO_EXPECTATION, why=_ADDED_WHY, option=option)
    exp = scenario.expectation(judged_as)
    if by_default and judged_as != design and scenario.faults:
        return _default_judgement(scenario, judged_as, exp, mode=mode, backend=backend, with_faults=with_faults,
                                  option=option)
    expected = exp.expected(mode=mode, backend=backend, with_faults=with_faults)
    if expected is None:
        return None
    why = exp.why_for(backend)
    if judged_as != design:
        why = f"expected like {judged_as}, which the scenario lists: {why}"
    return Judgement(expected=expected, why=why, option=option if judged_as != design else None)


def _default_judgement(scenario: ScenarioSpec, like: str, exp: Expectation, *, mode: str, backend: str,
                       with_faults: bool, option: str | None) -> Judgement | None:
    """An added design's run of a fault scenario under the default expectation (``judgement_of``)."""
    faults = ", ".join(sorted(scenario.faults))
    if with_faults:
        return Judgement(expected=INFORMATION, option=option, by_default=True,
                         why=(f"no verdict is known for an added design under {faults}: the scenario's verdicts say "
                              f"what the fault does to the inputs of the designs it lists, which this one may never "
                              f"read; what it gives says whether the fault reaches it, and its faults-off rerun is "
                              f"judged (--expect states a verdict instead)"))
    expected = exp.expected(mode=mode, backend=backend, with_faults=False)
    why = f"expected like {like} without {faults}: {exp.why_for(backend)}"
    if expected is None:
        record = declared(like)
        if record is None or not record.sound:
            return None
        expected, why = Outcome.MATCH, f"expected like {like} without {faults}: {like} is declared sound: {record.rule}"
    return Judgement(expected=expected, why=why, option=option, by_default=True)


_ADDED_WHY = "a design the scenario does not list, added on the command line"
_BROKEN_WHY = "nothing can be expected of a run whose backend does not load or keep its contract"


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
    """why the backend cannot be imported or its declarations do not hold; its cells are errors saying so"""
    added: bool
    """a design the scenario does not list (``extra_designs``)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Selection:
    """Which cells of a scenario run, and how: what the command line filters and adds, where each runs, with
    which runners and time limit. The default is every cell the scenario lists, on the CPU."""

    designs: tuple[str, ...] = ()
    """only these of the scenario's designs (empty: all of them)"""
    modes: tuple[str, ...] = ()
    """only these of its modes (empty: all)"""
    backends: tuple[str, ...] = ()
    """only these of its backends (empty: all)"""
    extra_designs: tuple[str, ...] = ()
    """designs the scenario does not list that run too (the filters never drop them)"""
    extra_backends: tuple[str, ...] = ()
    """backends the scenario does not list that run too"""
    engine: str | None = None
    """None: each case's default (``cuda`` for a case on a CUDA device, else ``tape``)"""
    device: str = Device.CPU
    runners: Mapping[str, str] = field(default_factory=dict)
    """a mode -> the runner (by import path) that replaces the built-in one in that mode"""
    timeout_s: float | None = None
    """overrides the scenario's time limit"""

    def __post_init__(self) -> None:
        # callers hand lists or argparse's None; stored as tuples, the selection stays what it was made as
        for name in ("designs", "modes", "backends", "extra_designs", "extra_backends"):
            object.__setattr__(self, name, tuple(getattr(self, name) or ()))
        object.__setattr__(self, "runners", dict(self.runners or {}))


def cases(scenario: ScenarioSpec, selection: Selection = Selection(), *, expect: str | None = None) -> list[Case]:
    """Every case of one scenario that the ``selection`` keeps, clean reruns of fault scenarios included.

    What runs is ``cells``' answer. How each is judged is ``judgement_of``'s: an added design by ``expect``
    (``EXPECT_DEFAULT`` when None): ``like:DESIGN`` expects of each run what the scenario expects of DESIGN in
    that mode, backend and fault setting (a scenario that does not list DESIGN skips them, saying so), an
    outcome expects it of every run; either way a fault scenario also runs them with the faults off, as it runs
    DESIGN (or, for an outcome, always). With no ``expect`` at all, an added design's runs under a fault
    scenario's faults are ``INFORMATION`` and their faults-off reruns are always made (``judgement_of``). An
    added backend is expected to give what the scenario expects of the design (its ``by_backend`` entry for
    that name, if any).
    """
    by_default, expect = expect is None, EXPECT_DEFAULT if expect is None else expect
    limit = selection.timeout_s if selection.timeout_s is not None else scenario.timeout_s
    # a stack whose optional install this machine lacks: its runs are skipped saying so, as a backend's are
    absent = stack_unavailable(scenario.serving) if scenario.serving in STACKS else None
    out = []
    for cell in cells(scenario, selection):
        option = expect if cell.added else None
        common = dict(scenario=scenario, design=cell.design, mode=cell.mode, backend=cell.backend,
                      engine=cell.engine, device=cell.device, timeout_s=limit,
                      runner=selection.runners.get(cell.mode))
        for with_faults in (True, False) if scenario.faults else (True,):
            judgement = judgement_of(scenario, design=cell.design, mode=cell.mode, backend=cell.backend,
                                     with_faults=with_faults, option=option, by_default=by_default)
            if judgement is None:
                continue  # a clean rerun nobody expects anything of
            like = option[len(LIKE):] if option is not None and option.startswith(LIKE) else None
            if like is not None and like not in scenario.designs:  # nothing to take: one skipped case says so
                why = f"the scenario lists no {like}, whose expectations an added design takes here"
                out.append(Case(**common, unsupported=why, judgement=judgement))
                break
            broken = cell.missing
            if broken is None:
                try:
                    unsupported = absent or _unsupported(cell.declared, scenario, cell.mode, cell.device,
                                                         with_faults=with_faults)
                except KeyError as exc:  # its unsupported() broke the contract for this case
                    broken = str(exc.args[0])
            if broken is not None:
                out.append(Case(**common, with_faults=with_faults, declaration_error=broken,
                                judgement=Judgement(expected=NO_EXPECTATION, why=_BROKEN_WHY)))
                continue
            out.append(Case(**common, unsupported=unsupported, with_faults=with_faults, judgement=judgement))
    return out


def cells(scenario: ScenarioSpec, selection: Selection = Selection()) -> list[_Cell]:
    """What runs: every (backend, design, mode) of a scenario the selection keeps, the added designs and backends
    included (the filters never drop those), each on a device its backend declares."""
    keep_designs = set(selection.designs) or None
    keep_modes = set(selection.modes) or None
    keep_backends = set(selection.backends) or None
    device = selection.device
    added = [b for b in dict.fromkeys(selection.extra_backends) if b not in scenario.backends]
    extras = [d for d in dict.fromkeys(selection.extra_designs) if d not in scenario.designs]
    out = []
    for backend in (*scenario.backends, *added):
        if keep_backends is not None and backend not in keep_backends and backend not in added:
            continue
        try:
            declared = backend_class(backend)
        except KeyError as exc:  # fails to import or to keep the contract: its cases are errors, saying why
            declared, missing, run_device = None, str(exc.args[0]), device
        else:
            # a backend that cannot run on the requested device runs on one it declares (marked gpu if CUDA)
            missing, run_device = None, device if device in declared.devices else sorted(declared.devices)[0]
        run_engine = selection.engine or (Engine.CUDA if run_device == Device.CUDA else Engine.TAPE)
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
    reasons = unsupported_reasons(declared, mode=mode, device=device, kv_write=scenario.kv_write,
                                  page_size=scenario.pool.page_size,
                                  faults=scenario.faults if with_faults else (), model=scenario.model,
                                  kv_dtype=scenario.pool.kv_dtype)
    return "; ".join(reasons) or None

"""The scenario matrix's cells: one (scenario, design, mode, backend) run and what it should give.

Shared by the pytest items and ``python -m harness run`` so both select, name and judge cases alike.
A backend's declaration decides the device a case runs on and whether it can run at all: a case the
backend does not support (its mode, KV write path, page size or layout, or a fault it has no switch for)
becomes a case with every reason, skipped rather than run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..backends.base import AttentionBackend
from ..backends.registry import backend_class
from ..runspec import TIMEOUT_DEFAULT_S, Device, Engine, RunSpec

NO_EXPECTATION = "no expectation"
"""the expected verdict of a run nobody stated one for: whatever it gives is unexpected"""
from ..scenario.spec import ScenarioSpec
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

    @property
    def name(self) -> str:
        """``scenario[design-mode-backend]``, the pytest item name; ``-nofault`` marks a clean rerun."""
        suffix = "" if self.with_faults or not self.scenario.faults else "-nofault"
        return f"{self.scenario.name}[{self.design}-{self.mode}-{self.backend}{suffix}]"

    @property
    def listed(self) -> bool:
        """The scenario lists this design, so it states the expected verdict and why."""
        return self.design in self.scenario.designs

    @property
    def expected(self) -> str:
        if not self.listed:
            return self.expected_override or NO_EXPECTATION
        exp = self.scenario.expectation(self.design).expected(mode=self.mode, backend=self.backend,
                                                               with_faults=self.with_faults)
        assert exp is not None, "cases() makes clean reruns only where a without_faults expectation exists"
        return exp

    @property
    def why(self) -> str:
        if not self.listed:
            return "a design the scenario does not list, added on the command line"
        return self.scenario.expectation(self.design).why_for(self.backend)

    @property
    def faults(self) -> frozenset[str]:
        return frozenset(self.scenario.faults) if self.with_faults else frozenset()

    def run_spec(self) -> RunSpec:
        return self.scenario.run_spec(
            design=self.design, mode=self.mode, backend=self.backend, engine=self.engine, device=self.device,
            with_faults=self.with_faults,
        )


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
    engine: str | None = None,
    device: str = Device.CPU,
    extra_designs: Iterable[str] = (),
    expect: str | None = None,
    extra_backends: Iterable[str] = (),
    timeout_s: float | None = None,
) -> list[Case]:
    """Every case of one scenario that the filters keep, clean reruns of fault scenarios included.

    ``engine`` None picks each case's default: ``cuda`` for a case on a CUDA device, else ``tape``.
    ``extra_designs`` the scenario does not list run too, expected to give ``expect`` (no expectation when
    None). ``extra_backends`` it does not list run every design too, each expected to give what the
    scenario expects of the design (its ``by_backend`` entry for that name, if any). ``timeout_s`` overrides
    the scenario's time limit.
    """
    keep_designs = set(designs) if designs else None
    keep_modes = set(modes) if modes else None
    keep_backends = set(backends) if backends else None
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
        extras = [d for d in extra_designs if d not in scenario.designs]
        for design in (*scenario.designs, *extras):
            if keep_designs is not None and design not in keep_designs and design not in extras:
                continue
            for mode in scenario.modes:
                if keep_modes is not None and mode not in keep_modes:
                    continue
                common = dict(scenario=scenario, design=design, mode=mode, backend=backend, engine=run_engine,
                              device=run_device, timeout_s=timeout_s if timeout_s is not None else scenario.timeout_s)
                unsupported = missing or _unsupported(declared, scenario, mode, run_device, with_faults=True)
                if design in extras:
                    out.append(Case(**common, unsupported=unsupported, expected_override=expect))
                    continue
                out.append(Case(**common, unsupported=unsupported))
                exp = scenario.expectation(design)
                if scenario.faults and exp.expected(mode=mode, backend=backend, with_faults=False) is not None:
                    clean = missing or _unsupported(declared, scenario, mode, run_device, with_faults=False)
                    out.append(Case(**common, unsupported=clean, with_faults=False))
    return out


def _unsupported(declared: type[AttentionBackend] | None, scenario: ScenarioSpec, mode: str, device: str, *,
                 with_faults: bool) -> str | None:
    """Every reason the declared backend gives for not running the case, joined; None when it runs."""
    assert declared is not None
    reasons = declared.unsupported(mode=mode, device=device, kv_write=scenario.kv_write,
                                   page_size=scenario.pool.page_size,
                                   faults=scenario.faults if with_faults else ())
    return "; ".join(reasons) or None

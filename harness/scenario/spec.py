"""A scenario as data: the model, pool and timeline, the runs to make, and the verdict each should give.

``ScenarioSpec.problems()`` holds every rule a scenario obeys that needs no registry and no run; the TOML
reader checks only what TOML can get wrong (types, unknown keys) and then asks the spec. The loader adds
the rules that need the backend registry or an import, and the dry run of the timeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..imports import is_import_path
from ..runspec import (
    TIMEOUT_DEFAULT_S,
    TIMEOUT_MAX_S,
    Device,
    Engine,
    GraphSpec,
    KVWrite,
    Mode,
    Outcome,
    Problem,
    RunSpec,
    choice_problem,
    serving_problems,
)
from ..serving.designs import DESIGNS
from ..serving.eviction import EvictionSpec
from ..serving.faults import FAULTS
from ..serving.model_spec import PRESETS, ModelSpec
from ..serving.pool_spec import PoolSpec
from ..serving.timeline import TimelineSpec
from .memory import graph_memory_problems
from .toml_access import toml_key


DEFAULT_BACKENDS: tuple[str, ...] = ("torch_native", "torch_gather")
"""the backends a scenario runs when it lists none: both CPU backends, which read the same pools two ways (a
dense row masked by window, and only the in-window indices gathered), so that a verdict that holds under
one and not the other says which reading it depends on"""


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendExpectation:
    """What one backend gives where it differs from the design's expectation (``by_backend``)."""

    backend: str
    verdict: Outcome | None = None
    """overrides the design's default verdict; None keeps it"""
    by_mode: tuple[tuple[Mode, Outcome], ...] = ()
    without_faults: Outcome | None = None
    why: str
    """why this backend differs"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Expectation:
    design: str
    verdict: Outcome
    """the expected outcome in every mode without an override"""
    by_mode: tuple[tuple[Mode, Outcome], ...] = ()
    """(mode, verdict) overrides"""
    without_faults: Outcome | None = None
    """the expected outcome of the same run with the scenario's faults removed"""
    why: str
    """the mechanism behind the verdict(s)"""
    by_backend: tuple[BackendExpectation, ...] = ()

    def for_mode(self, mode: str) -> Outcome:
        return _pick(self.by_mode, mode, self.verdict)

    def expected(self, *, mode: str, backend: str, with_faults: bool = True) -> Outcome | None:
        """The verdict of one run; None for a clean rerun that has no expectation.

        A ``by_backend`` override wins over the design's own verdicts: its per-mode value first, then its
        default.
        """
        override = self._override(backend)
        if not with_faults:
            if override is not None and override.without_faults is not None:
                return override.without_faults
            return self.without_faults
        if override is not None:
            picked = _pick(override.by_mode, mode, override.verdict)
            if picked is not None:
                return picked
        return self.for_mode(mode)

    def _override(self, backend: str) -> BackendExpectation | None:
        return next((b for b in self.by_backend if b.backend == backend), None)

    def why_for(self, backend: str) -> str:
        override = self._override(backend)
        return override.why if override is not None else self.why


def _pick(by_mode: tuple[tuple[Mode, Outcome], ...], mode: str, default: Outcome | None) -> Outcome | None:
    for name, verdict in by_mode:
        if name == mode:
            return verdict
    return default


@dataclass(frozen=True, slots=True, kw_only=True)
class ScenarioSpec:
    name: str
    """the file stem"""
    path: Path
    description: str
    tags: tuple[str, ...]
    references: tuple[str, ...] = ()
    """the real fixes (or reports) the scenario stands for, e.g. "SGLang PR 24743"; shown by list and the pages"""
    model: ModelSpec
    pool: PoolSpec
    timeline: TimelineSpec
    graphs: GraphSpec
    modes: tuple[Mode, ...]
    designs: tuple[str, ...]
    backends: tuple[str, ...]
    kv_write: KVWrite
    faults: tuple[str, ...]
    """in file order, so a problem can name ``run.faults[i]``"""
    expectations: tuple[Expectation, ...]
    """one per design, in the order of ``designs``"""
    timeout_s: float = TIMEOUT_DEFAULT_S
    """each run's time limit; past it the run is an ``error`` verdict and the others go on"""
    serving: str = "miniature"
    """the serving stack under test (``[serving] stack``): a name in ``serving/registry.py`` (a target package
    registers its own) or ``package.module:Class``"""
    eviction: EvictionSpec = EvictionSpec()
    """the SWA eviction policy and its knobs"""

    def expectation(self, design: str) -> Expectation:
        for exp in self.expectations:
            if exp.design == design:
                return exp
        raise KeyError(f"scenario {self.name!r} runs no design {design!r}; it runs {', '.join(self.designs)}")

    def run_spec(
        self,
        *,
        design: str,
        mode: str,
        backend: str,
        engine: str = Engine.TAPE,
        device: str = Device.CPU,
        with_faults: bool = True,
        runner: str | None = None,
    ) -> RunSpec:
        """The subject run of one (design, mode, backend) cell; ``with_faults=False`` gives its fault-free twin;
        ``runner`` names one that replaces the mode's built-in runner.

        The mode must be among the scenario's (its buckets and faults are chosen for those). The design and
        backend are not restricted: trying another design or backend over a scenario is a valid cross-check,
        judged against the expectation the caller supplies.
        """
        if mode not in self.modes:
            raise ValueError(f"scenario {self.name!r} does not run mode {mode!r}; it runs {self.modes}")
        return RunSpec(
            model=self.model, pool=self.pool, timeline=self.timeline, design=design, mode=Mode(mode),
            backend=backend, engine=Engine(engine), faults=frozenset(self.faults) if with_faults else frozenset(),
            kv_write=self.kv_write, graphs=self.graphs, device=Device(device), serving=self.serving,
            eviction=self.eviction, runner=runner,
        )

    def problems(self) -> list[Problem]:
        """Every rule the scenario breaks that needs neither a registry nor a run."""
        out: list[Problem] = []
        if not self.name.isprintable() or not self.name:
            out.append(Problem("name", f"expected a printable file name, got {self.name!r}"))
        if not self.description.strip():
            out.append(Problem("description", "expected a non-empty string"))
        for i, tag in enumerate(self.tags):
            if not tag.strip() or not tag.isprintable():
                out.append(Problem(f"tags[{i}]", f"expected a non-empty printable string, got {tag!r}"))
        for i, ref in enumerate(self.references):
            if not ref.strip() or not ref.isprintable():
                out.append(Problem(f"references[{i}]", f"expected a non-empty printable string, got {ref!r}"))
        if self.model.name not in PRESETS:
            out.append(Problem("model.preset", f"expected one of {', '.join(map(repr, PRESETS))}, "
                                               f"got {self.model.name!r}"))
        out.extend(serving_problems(model=self.model, pool=self.pool, timeline=self.timeline, graphs=self.graphs,
                                    kv_write=self.kv_write, kv_write_key="run.kv_write", eviction=self.eviction))
        if not out:  # estimates of sizes that are each within bounds, and only then
            out.extend(graph_memory_problems(self.model, self.pool, self.graphs, self.modes))
        out.extend(_list_problems("graphs.modes", self.modes, lambda k, v: choice_problem(k, v, Mode)))
        out.extend(_list_problems("run.designs", self.designs, _design_problem))
        out.extend(_list_problems("run.backends", self.backends, _backend_problem))
        if not (self.serving.isidentifier() or is_import_path(self.serving)):
            out.append(Problem("serving.stack", f"expected a serving stack's name or an import path "
                                                f"'package.module:Class', got {self.serving!r}"))
        out.extend(_list_problems("run.faults", self.faults, self._fault_problem, nonempty=False))
        out.extend(self._expectation_problems())
        if not 0 < self.timeout_s <= TIMEOUT_MAX_S:
            out.append(Problem("run.timeout_s", f"expected a number from 0 (excluded) to {TIMEOUT_MAX_S:g} seconds, "
                                                f"got {self.timeout_s}"))
        return out

    def _fault_problem(self, key: str, name: str) -> Problem | None:
        fault = FAULTS.get(name)
        if fault is None:
            return Problem(key, f"expected one of {', '.join(map(repr, FAULTS))}, got {name!r}")
        if self.modes and not set(fault.modes) & set(self.modes):
            # a fault that cannot act in any mode run would pass "as expected" without ever acting
            acts = " or ".join(fault.modes)
            return Problem(key, f"{name} acts only in {acts} mode; graphs.modes has {', '.join(self.modes)}")
        if fault.needs_prefix_cache and not self.eviction.prefix_cache:
            return Problem(key, f"{name} acts only with a prefix cache; eviction.prefix_cache is off")
        if fault.needs_fused_write and self.kv_write != "fused_fp8":
            return Problem(key, f"{name} acts only on the fused FP8 write; run.kv_write is {str(self.kv_write)!r}")
        if fault.needs_drafts and not self.timeline.draft_steps:
            return Problem(key, f"{name} acts only in a run that speculates; timeline.draft_steps is 0")
        if fault.needs_verify and not self.timeline.verifies:
            return Problem(key, f"{name} acts only in a run that verifies its drafts; timeline.accept_lens is empty")
        if fault.needs_tree and self.timeline.draft_topk < 2:
            return Problem(key, f"{name} acts only in a run that drafts trees; timeline.draft_topk is "
                                f"{self.timeline.draft_topk}")
        if fault.needs_draft_extend and not self.timeline.draft_extend:
            return Problem(key, f"{name} acts only in a run with draft-extend forwards; timeline.draft_extend is off")
        return None

    def _expectation_problems(self) -> list[Problem]:
        out = []
        seen = {e.design for e in self.expectations}
        for design in self.designs:
            if design not in seen:
                out.append(Problem(f"expect.{toml_key(design)}",
                                   "missing table; every design in run.designs needs an expected verdict"))
        for exp in self.expectations:
            at = f"expect.{toml_key(exp.design)}"
            if exp.design not in self.designs:
                out.append(Problem(at, f"no such design in run.designs ({', '.join(self.designs)})"))
            if not exp.why.strip():
                out.append(Problem(f"{at}.why", "expected a non-empty string"))
            out.extend(self._verdict_problems(at, exp.verdict, exp.by_mode, exp.without_faults))
            for override in exp.by_backend:
                sub = f"{at}.by_backend.{toml_key(override.backend)}"
                if override.backend not in self.backends:
                    out.append(Problem(sub, f"no such backend in run.backends ({', '.join(self.backends)})"))
                if not override.why.strip():
                    out.append(Problem(f"{sub}.why", "expected a non-empty string saying why this backend differs"))
                out.extend(self._verdict_problems(sub, override.verdict, override.by_mode, override.without_faults))
        return out

    def _verdict_problems(
        self, at: str, verdict: Outcome | None, by_mode: tuple[tuple[Mode, Outcome], ...], without: Outcome | None
    ) -> list[Problem]:
        out = []
        if verdict is not None and (p := choice_problem(f"{at}.verdict", verdict, Outcome)) is not None:
            out.append(p)
        for mode, value in by_mode:
            if (p := choice_problem(f"{at}.{mode}", value, Outcome)) is not None:
                out.append(p)
            if mode not in self.modes:
                out.append(Problem(f"{at}.{mode}", f"mode not run; graphs.modes is {', '.join(self.modes)}"))
        if without is not None:
            if not self.faults:
                # with no faults the 'without faults' run is the run itself: a second verdict would be noise
                out.append(Problem(f"{at}.without_faults", "only allowed when run.faults is non-empty"))
            elif (p := choice_problem(f"{at}.without_faults", without, Outcome)) is not None:
                out.append(p)
        return out


def _list_problems(key: str, items: tuple[str, ...], check, *, nonempty: bool = True) -> list[Problem]:
    if nonempty and not items:
        return [Problem(key, "expected at least one item")]
    out = []
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        if item in first:
            out.append(Problem(f"{key}[{i}]", f"duplicate of {key}[{first[item]}] ({str(item)!r})"))
            continue
        first[item] = i
        if (p := check(f"{key}[{i}]", item)) is not None:
            out.append(p)
    return out


def _design_problem(key: str, name: str) -> Problem | None:
    if name in DESIGNS or is_import_path(name):
        return None
    return Problem(key, f"unknown design {name!r}; known: {', '.join(DESIGNS)}, "
                        "or an import path 'package.module:function'")


def _backend_problem(key: str, name: str) -> Problem | None:
    if name.isidentifier() or is_import_path(name):
        return None  # whether it is registered is the loader's question (it needs the registry)
    return Problem(key, f"expected a backend name or an import path 'package.module:Class', got {name!r}")

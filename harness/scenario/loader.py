"""Loading scenario files: every problem of a file listed at once, one bad file never stopping the others.

Each problem reads ``path: key.path: what was expected, what was found``, so a scenario author fixes a
file in one pass. A file is checked in three layers: the reader (what TOML can get wrong), the spec's own
``problems()`` plus the rules that need the registries (``check_scenario``, which a spec built in Python
goes through too), and, once everything else is clean, a dry run of the timeline through the real
scheduler, so a pool too small for it is reported at load time instead of as an ``error`` verdict of every
run.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ..backends.registry import BACKENDS, backend_class
from ..imports import is_import_path, unknown_name
from ..runspec import Problem
from ..serving.faults import FAULTS, Component
from ..serving.registry import EVICTION_POLICIES, STACKS
from .dry_run import dry_run
from .names import look_alike_note, skeleton
from .schema import parse, read_document
from .spec import ScenarioSpec
from .toml_access import Reader

SCENARIO_ROOT_DEFAULT = "scenarios"


class ScenarioError(Exception):
    """All problems of one file, each 'path: key.path: what was expected, what was found'."""

    path: Path
    problems: tuple[str, ...]

    def __init__(self, path: str | Path, problems: Iterable[str]) -> None:
        # args mirror the constructor so the error survives pickling (pytest-xdist, multiprocessing)
        self.path = Path(path)
        self.problems = tuple(problems)
        super().__init__(self.path, self.problems)

    def __str__(self) -> str:
        return "\n".join(self.problems)


def check_scenario(spec: ScenarioSpec, *, dry: bool = True) -> list[Problem]:
    """Every problem of a spec, however it was made: its own rules, the registries', then the dry run."""
    out = spec.problems() + _registry_problems(spec)
    if dry and not out:
        out = dry_run(spec)
    return out


def _registry_problems(spec: ScenarioSpec) -> list[Problem]:
    # A design or backend named by import path is imported when a run needs it, never to load or list a
    # file (the trust model: docs/scenarios.md, "Trust"); only the built-in registries are consulted here.
    out = []
    backend_faults = [(i, f) for i, f in enumerate(spec.faults)
                      if f in FAULTS and FAULTS[f].acts_on is Component.ATTENTION_BACKEND]
    for i, name in enumerate(spec.backends):
        if name not in BACKENDS and not is_import_path(name):
            out.append(Problem(f"run.backends[{i}]", f"expected one of {', '.join(map(repr, BACKENDS))} "
                                                     f"or an import path 'package.module:Class', got {name!r}"))
            continue
        if name not in BACKENDS:
            continue  # a third-party backend is imported when a run needs it, not to load a file
        cls = backend_class(name)
        if spec.kv_write not in cls.kv_write_paths:
            out.append(Problem("run.kv_write", f"backend {name} has no {spec.kv_write!r} KV write path; "
                                               f"it has {', '.join(sorted(cls.kv_write_paths))}"))
        for j, fault in backend_faults:
            if fault not in cls.known_faults:
                out.append(Problem(f"run.faults[{j}]", f"{fault} is not a switch of backend {name}"))
    if spec.serving not in STACKS and not is_import_path(spec.serving) and spec.serving.isidentifier():
        out.append(Problem("serving.stack", unknown_name("serving stack", spec.serving, STACKS,
                                                         also="an import path 'package.module:Class'")))
    policy = spec.eviction.policy
    if policy not in EVICTION_POLICIES and not is_import_path(policy):
        out.append(Problem("eviction.policy", f"expected one of {', '.join(map(repr, EVICTION_POLICIES))} "
                                              f"or an import path 'package.module:Class', got {policy!r}"))
    return out


def load_scenario(path: str | Path) -> ScenarioSpec:
    """Parse and validate one scenario file; raises ScenarioError listing every problem found."""
    path = Path(path)
    try:
        return _load(path)
    except ScenarioError:
        raise
    except Exception as exc:  # noqa: BLE001 - one file must never stop the others, even through a bug of ours
        raise ScenarioError(path, [f"{path}: cannot be loaded (a harness bug, please report it): "
                                   f"{type(exc).__name__}: {exc}"]) from exc


def _load(path: Path) -> ScenarioSpec:
    reader = Reader(path)
    data = parse(reader, path)
    spec = read_document(reader, data, path) if data is not None else None
    if spec is not None:
        # the dry run needs a sound spec, and its one finding would only repeat an earlier problem
        for problem in check_scenario(spec, dry=not reader.problems):
            if problem.key not in reader.reported:
                reader.add(problem.key, problem.message)
    if reader.problems or spec is None:
        raise ScenarioError(path, reader.problems or [f"{path}: cannot be read as a scenario"])
    return spec


def discover(paths: Iterable[str | Path]) -> list[Path]:
    """Directories expand recursively to their ``*.toml`` files, sorted; files are kept as given.

    A path named twice (directly or through a directory) is kept once, at its first place.
    """
    out: list[Path] = []
    seen: set[Path] = set()
    for raw in paths:
        p = Path(raw)
        found = sorted(q for q in p.rglob("*.toml") if q.is_file()) if p.is_dir() else [p]
        for q in found:
            key = q.resolve()
            if key not in seen:
                seen.add(key)
                out.append(q)
    return out


def load_all(paths: Iterable[str | Path]) -> tuple[list[ScenarioSpec], list[ScenarioError]]:
    """Load every scenario under ``paths``; a bad file is reported and never stops the others.

    Scenario names are file stems and name tests and report rows, so a second file with a name already
    loaded, or with one that looks the same (``names``), is an error for that later file.
    """
    specs: list[ScenarioSpec] = []
    errors: list[ScenarioError] = []
    first_by_look: dict[str, ScenarioSpec] = {}
    for path in discover(paths):
        try:
            spec = load_scenario(path)
        except ScenarioError as err:
            errors.append(err)
            continue
        first = first_by_look.get(skeleton(spec.name))
        if first is not None:
            if first.name == spec.name:
                how = "" if first.path.stem == path.stem else " (the file names differ only in Unicode normalization)"
                problem = f"duplicate scenario name {spec.name!r}{how}; already loaded from {first.path}"
            else:
                problem = (f"scenario name {spec.name!r} looks like {first.name!r}, already loaded from {first.path}: "
                           f"{look_alike_note(spec.name, first.name)}; rename the file")
            errors.append(ScenarioError(path, [f"{path}: name: {problem}"]))
            continue
        first_by_look[skeleton(spec.name)] = spec
        specs.append(spec)
    return specs, errors

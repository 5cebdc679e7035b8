"""Scenario files: one TOML file per scenario, validated in full before anything runs.

A scenario names a model preset (with overrides), a pool, a request timeline, the graph modes and buckets,
the designs, backends and faults to run, and for every design the expected verdict and why. Loading never
executes anything from the file: it is parsed with ``tomllib`` and its names are looked up in the registries
(a design given as ``package.module:function`` is imported by ``resolve_design``, the one explicit way a
scenario reaches code outside the harness).

Every problem of a file is collected before one ``ScenarioError`` lists them all, each line in the form
``path: key.path: what was expected, what was found``, so a scenario author fixes a file in one pass. When
the file is otherwise sound the timeline is dry-run through the real scheduler and allocators, so a pool
too small for the timeline is reported at load time instead of as an ``error`` verdict of every run.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from .backends import BACKENDS
from .backends.torch_native import KV_WRITE_PATHS
from .check.run import MODES, GraphSpec, RunSpec
from .check.verdict import OUTCOMES
from .serving.allocator import SWATokenToKVPoolAllocator
from .serving.designs import DESIGNS, resolve_design
from .serving.faults import FAULTS
from .serving.model import MAX_POSITIONS, PRESETS, ModelSpec, model_spec
from .serving.pool import (
    KV_DTYPES,
    HybridSWAKVPool,
    PoolExhausted,
    PoolSpec,
    ReqToTokenPool,
)
from .serving.scheduler import Scheduler
from .serving.timeline import RequestSpec, TimelineSpec

__all__ = [
    "SCENARIO_ROOT_DEFAULT",
    "Expectation",
    "ScenarioError",
    "ScenarioSpec",
    "discover",
    "load_all",
    "load_scenario",
]

SCENARIO_ROOT_DEFAULT = "scenarios"

# The harness's models and pools are tiny; a size past this is a typo, and honouring it would make the
# load-time dry run allocate gigabytes or spin through millions of empty steps.
_LIMIT = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class Expectation:
    design: str
    verdict: str
    """the expected outcome (one of harness.verdict.OUTCOMES) in every mode without an override"""
    by_mode: tuple[tuple[str, str], ...] = ()
    """(mode, verdict) overrides"""
    without_faults: str | None = None
    """the expected outcome of the same run with the scenario's faults removed"""
    why: str
    """the mechanism behind the verdict(s)"""

    def for_mode(self, mode: str) -> str:
        for name, verdict in self.by_mode:
            if name == mode:
                return verdict
        return self.verdict


@dataclass(frozen=True, slots=True, kw_only=True)
class ScenarioSpec:
    name: str
    """the file stem"""
    path: Path
    description: str
    tags: tuple[str, ...]
    model: ModelSpec
    pool: PoolSpec
    timeline: TimelineSpec
    graphs: GraphSpec
    modes: tuple[str, ...]
    designs: tuple[str, ...]
    backends: tuple[str, ...]
    kv_write: str
    faults: frozenset[str]
    expectations: tuple[Expectation, ...]
    """one per design, in the order of ``designs``"""

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
        engine: str = "tape",
        device: str = "cpu",
        with_faults: bool = True,
    ) -> RunSpec:
        """The subject run of one (design, mode, backend) cell; ``with_faults=False`` gives its fault-free twin.

        The design and mode must be among the scenario's, since only those have an expectation to check.
        The backend is not restricted: running another backend over the same scenario is a valid cross-check.
        """
        if design not in self.designs:
            raise ValueError(f"scenario {self.name!r} does not run design {design!r}; it runs {self.designs}")
        if mode not in self.modes:
            raise ValueError(f"scenario {self.name!r} does not run mode {mode!r}; it runs {self.modes}")
        return RunSpec(
            model=self.model,
            pool=self.pool,
            timeline=self.timeline,
            design=design,
            mode=mode,
            backend=backend,
            engine=engine,
            faults=self.faults if with_faults else frozenset(),
            kv_write=self.kv_write,
            graphs=self.graphs,
            device=device,
        )


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


# ---- public entry points ------------------------------------------------------------------------------


def load_scenario(path: str | Path) -> ScenarioSpec:
    """Parse and validate one scenario file; raises ScenarioError listing every problem found."""
    path = Path(path)
    reader = _Reader(path)
    data = _parse(reader, path)
    if data is None:
        raise ScenarioError(path, reader.problems)
    parts = _read_document(reader, data)
    if reader.problems or parts is None:
        raise ScenarioError(path, reader.problems)
    # The dry run needs a sound model, pool and timeline, and its one finding would only repeat or
    # obscure an earlier problem, so it runs only on a file that is otherwise clean.
    _dry_run(reader, parts["model"], parts["pool"], parts["timeline"])
    if reader.problems:
        raise ScenarioError(path, reader.problems)
    return ScenarioSpec(name=path.stem, path=path, **parts)


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
    loaded is an error for that later file.
    """
    specs: list[ScenarioSpec] = []
    errors: list[ScenarioError] = []
    first_by_name: dict[str, Path] = {}
    for path in discover(paths):
        try:
            spec = load_scenario(path)
        except ScenarioError as err:
            errors.append(err)
            continue
        if spec.name in first_by_name:
            errors.append(ScenarioError(path, [
                f"{path}: name: duplicate scenario name {spec.name!r}; already loaded from {first_by_name[spec.name]}"
            ]))
            continue
        first_by_name[spec.name] = path
        specs.append(spec)
    return specs, errors


# ---- problem collection and typed access --------------------------------------------------------------

_REQUIRED: Any = object()
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _join(where: str, key: str) -> str:
    """The dotted key path of ``key`` inside ``where``, quoting keys TOML would quote (design import paths)."""
    part = key if _BARE_KEY.fullmatch(key) else '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"{where}.{part}" if where else part


def _found(value: object) -> str:
    """What the file holds, for 'expected X, got Y' messages; TOML's type names, not Python's."""
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"float {value}"
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:37] + "..."
        return f"string {text!r}"
    if isinstance(value, list):
        return f"an array of {len(value)} item{'s' if len(value) != 1 else ''}"
    if isinstance(value, dict):
        return "a table"
    return f"{type(value).__name__} {value}"  # dates and times


@dataclass(frozen=True, slots=True)
class _Check:
    """What a value must be: a description for messages and a predicate (conversion is the caller's)."""

    expected: str
    accept: Callable[[object], bool]


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # TOML true is a Python int subclass


def _int(minimum: int | None = None, maximum: int | None = None) -> _Check:
    if minimum is None:
        return _Check("an integer", _is_int)
    if maximum is None:
        return _Check(f"an integer >= {minimum}", lambda v: _is_int(v) and v >= minimum)
    return _Check(f"an integer from {minimum} to {maximum}", lambda v: _is_int(v) and minimum <= v <= maximum)


def _positive_number() -> _Check:
    return _Check(
        "a number > 0",
        lambda v: (_is_int(v) or isinstance(v, float)) and math.isfinite(v) and v > 0,  # type: ignore[arg-type]
    )


def _str(nonempty: bool = False) -> _Check:
    if nonempty:
        return _Check("a non-empty string", lambda v: isinstance(v, str) and bool(v.strip()))
    return _Check("a string", lambda v: isinstance(v, str))


def _choice(choices: Iterable[str]) -> _Check:
    options = tuple(choices)
    return _Check(f"one of {', '.join(map(repr, options))}", lambda v: isinstance(v, str) and v in options)


class _Reader:
    """Collects the problems of one file; every accessor records what is wrong and returns None, never raises."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.problems: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.problems.append(f"{self.path}: {where}: {message}" if where else f"{self.path}: {message}")

    def known_keys(self, table: dict, where: str, allowed: Iterable[str]) -> None:
        allowed = tuple(allowed)
        for key in table:
            if key not in allowed:
                self.add(_join(where, key), f"unknown key; expected one of {', '.join(allowed)}")

    def table(self, parent: dict, where: str, key: str, *, required: bool) -> dict | None:
        at = _join(where, key)
        if key not in parent:
            if required:
                self.add(at, "missing required table")
            return None
        value = parent[key]
        if not isinstance(value, dict):
            self.add(at, f"expected a table, got {_found(value)}")
            return None
        return value

    def check(self, value: object, at: str, check: _Check) -> bool:
        if check.accept(value):
            return True
        self.add(at, f"expected {check.expected}, got {_found(value)}")
        return False

    def value(self, table: dict, where: str, key: str, check: _Check, default: Any = _REQUIRED) -> Any:
        """The checked value, ``default`` when absent, None when wrong or missing though required."""
        at = _join(where, key)
        if key not in table:
            if default is _REQUIRED:
                self.add(at, f"missing required key; expected {check.expected}")
                return None
            return default
        value = table[key]
        return value if self.check(value, at, check) else None

    def array(
        self, table: dict, where: str, key: str, item: _Check, default: Any = _REQUIRED, *, nonempty: bool = True
    ) -> tuple | None:
        """A list of checked, distinct items as a tuple; None when anything about it is wrong."""
        at = _join(where, key)
        if key not in table:
            if default is _REQUIRED:
                self.add(at, f"missing required key; expected an array, each item {item.expected}")
                return None
            return default
        value = table[key]
        if not isinstance(value, list):
            self.add(at, f"expected an array, each item {item.expected}, got {_found(value)}")
            return None
        if nonempty and not value:
            self.add(at, f"expected at least one item, each {item.expected}, got an empty array")
            return None
        ok = True
        first_at: dict[object, int] = {}
        for i, v in enumerate(value):
            if not self.check(v, f"{at}[{i}]", item):
                ok = False
            elif v in first_at:
                # a repeated design, mode or bucket is a typo: it would only run or capture the same thing twice
                self.add(f"{at}[{i}]", f"duplicate of {at}[{first_at[v]}] ({v!r})")
                ok = False
            else:
                first_at[v] = i
        return tuple(value) if ok else None


# ---- the document ---------------------------------------------------------------------------------------


def _parse(reader: _Reader, path: Path) -> dict | None:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        reader.add("", f"cannot read the file: {exc.strerror or exc}")
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        reader.add("", f"not UTF-8 text: {exc.reason} at byte {exc.start}")
        return None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        # tomllib ends its message with "(at line L, column C)"; lead with the position instead
        m = re.fullmatch(r"(.*) \(at line (\d+), column (\d+)\)", message, re.S)
        if m:
            reader.add(f"line {m[2]}, column {m[3]}", f"invalid TOML: {m[1]}")
        else:
            reader.add("", f"invalid TOML: {message}")
        return None


_TOP_KEYS = ("description", "tags", "model", "pool", "graphs", "timeline", "run", "expect")


def _read_document(r: _Reader, data: dict) -> dict | None:
    """The ScenarioSpec fields but name and path, or None when a part is missing (problems are in ``r``)."""
    r.known_keys(data, "", _TOP_KEYS)
    description = r.value(data, "", "description", _str(nonempty=True))
    tags = r.array(data, "", "tags", _str(nonempty=True), (), nonempty=False)
    model = _read_model(r, r.table(data, "", "model", required=True))
    pool = _read_pool(r, r.table(data, "", "pool", required=True))
    graphs, modes = _read_graphs(r, r.table(data, "", "graphs", required=False) or {})
    timeline = _read_timeline(r, r.table(data, "", "timeline", required=True), pool)
    run = _read_run(r, r.table(data, "", "run", required=False) or {}, pool)
    designs, backends, kv_write, faults = run
    expectations = _read_expectations(
        r, r.table(data, "", "expect", required=False) or {}, designs=designs, modes=modes, faults=faults
    )
    parts = dict(
        description=description, tags=tags, model=model, pool=pool, timeline=timeline, graphs=graphs, modes=modes,
        designs=designs, backends=backends, kv_write=kv_write, faults=faults, expectations=expectations,
    )
    if any(v is None for v in parts.values()):
        return None
    parts["description"] = description.strip()
    return parts


# ModelSpec fields a scenario may override, by the annotation that says how to read them. ``name`` stays
# the preset's; a field of another kind added to ModelSpec later is simply not overridable from a file.
_MODEL_READERS: dict[str, Callable[[_Reader, dict, str], Any]] = {
    "int": lambda r, t, k: r.value(t, "model", k, _int()),
    "float": lambda r, t, k: r.value(t, "model", k, _positive_number()),
    "str": lambda r, t, k: r.value(t, "model", k, _str()),
    "tuple[str, ...]": lambda r, t, k: r.array(t, "model", k, _str(), nonempty=False),
}
_MODEL_FIELDS = {
    f.name: str(f.type)
    for f in dataclasses.fields(ModelSpec)
    if f.name != "name" and str(f.type) in _MODEL_READERS
}


def _read_model(r: _Reader, table: dict | None) -> ModelSpec | None:
    if table is None:
        return None
    r.known_keys(table, "model", ("preset", *_MODEL_FIELDS))
    preset = r.value(table, "model", "preset", _choice(PRESETS))
    overrides: dict[str, Any] = {}
    ok = True
    for name, kind in _MODEL_FIELDS.items():
        if name not in table:
            continue
        value = _MODEL_READERS[kind](r, table, name)
        if value is None:
            ok = False
        else:
            overrides[name] = float(value) if kind == "float" else value
    if preset is None or not ok:
        return None
    spec = model_spec(preset, **overrides)
    problems = spec.problems()
    # fields ModelSpec.problems() leaves alone but the model cannot be built with
    if spec.vocab_size < 1:
        problems.append(f"vocab_size: expected a positive integer, got {spec.vocab_size}")
    for problem in problems:
        field, _, message = problem.partition(": ")
        r.add(f"model.{field}", message)
    return None if problems else spec


_POOL_KEYS = ("full_size", "swa_size", "kv_dtype", "max_context_len", "max_running_requests")


def _read_pool(r: _Reader, table: dict | None) -> PoolSpec | None:
    if table is None:
        return None
    r.known_keys(table, "pool", _POOL_KEYS)
    defaults = PoolSpec(full_size=2, swa_size=2)
    fields = dict(
        # slot 0 of each pool is the dummy padded rows write to, so a usable pool has at least two slots
        full_size=r.value(table, "pool", "full_size", _int(2, _LIMIT)),
        swa_size=r.value(table, "pool", "swa_size", _int(2, _LIMIT)),
        kv_dtype=r.value(table, "pool", "kv_dtype", _choice(KV_DTYPES), defaults.kv_dtype),
        # positions index the model's RoPE cos/sin cache, which has MAX_POSITIONS rows
        max_context_len=r.value(table, "pool", "max_context_len", _int(1, MAX_POSITIONS), defaults.max_context_len),
        max_running_requests=r.value(
            table, "pool", "max_running_requests", _int(1, _LIMIT), defaults.max_running_requests
        ),
    )
    if any(v is None for v in fields.values()):
        return None
    return PoolSpec(**fields)


_GRAPH_KEYS = ("modes", "decode_buckets", "prefill_buckets", "capture")


def _read_graphs(r: _Reader, table: dict) -> tuple[GraphSpec | None, tuple[str, ...] | None]:
    r.known_keys(table, "graphs", _GRAPH_KEYS)
    defaults = GraphSpec()
    modes = r.array(table, "graphs", "modes", _choice(MODES), MODES)
    decode = r.array(table, "graphs", "decode_buckets", _int(1, _LIMIT), defaults.decode_buckets)
    prefill = r.array(table, "graphs", "prefill_buckets", _int(1, _LIMIT), defaults.prefill_buckets)
    capture = r.value(table, "graphs", "capture", _choice(("startup", "on_demand")), defaults.capture)
    if decode is None or prefill is None or capture is None:
        return None, modes
    return GraphSpec(decode_buckets=decode, prefill_buckets=prefill, capture=capture), modes


_TIMELINE_KEYS = ("seed", "chunk_size", "draft_steps", "max_steps", "requests")
_REQUEST_KEYS = ("rid", "arrive", "prompt_len", "output_len", "abort")


def _read_timeline(r: _Reader, table: dict | None, pool: PoolSpec | None) -> TimelineSpec | None:
    if table is None:
        return None
    r.known_keys(table, "timeline", _TIMELINE_KEYS)
    defaults = TimelineSpec(requests=())
    seed = r.value(table, "timeline", "seed", _int(), defaults.seed)
    chunk_size = r.value(table, "timeline", "chunk_size", _int(1, _LIMIT), defaults.chunk_size)
    draft_steps = r.value(table, "timeline", "draft_steps", _int(0, _LIMIT), defaults.draft_steps)
    max_steps = r.value(table, "timeline", "max_steps", _int(1, _LIMIT), defaults.max_steps)
    ok = seed is not None and draft_steps is not None and max_steps is not None
    # chunk_size's default is None (whole prompts), so its failure is told apart by presence
    ok = ok and not ("chunk_size" in table and chunk_size is None)

    raw = table.get("requests")
    if raw is None:
        r.add("timeline.requests", "missing required key; expected an array of tables ([[timeline.requests]])")
        return None
    if not isinstance(raw, list) or not raw:
        found = "an empty array" if isinstance(raw, list) else _found(raw)
        r.add("timeline.requests", f"expected at least one [[timeline.requests]] table, got {found}")
        return None
    requests: list[RequestSpec] = []
    first_by_rid: dict[str, int] = {}
    for i, item in enumerate(raw):
        at = f"timeline.requests[{i}]"
        if not isinstance(item, dict):
            r.add(at, f"expected a table, got {_found(item)}")
            ok = False
            continue
        req = _read_request(r, item, at, i, pool=pool, max_steps=max_steps)
        if req is None:
            ok = False
            continue
        if req.rid in first_by_rid:
            r.add(f"{at}.rid", f"duplicate rid {req.rid!r}; timeline.requests[{first_by_rid[req.rid]}] has it")
            ok = False
            continue
        first_by_rid[req.rid] = i
        requests.append(req)
    if not ok:
        return None
    return TimelineSpec(
        requests=tuple(requests), chunk_size=chunk_size, draft_steps=draft_steps, seed=seed, max_steps=max_steps
    )


def _read_request(
    r: _Reader, item: dict, at: str, index: int, *, pool: PoolSpec | None, max_steps: int | None
) -> RequestSpec | None:
    r.known_keys(item, at, _REQUEST_KEYS)
    rid = r.value(item, at, "rid", _str(nonempty=True), f"r{index}")
    arrive = r.value(item, at, "arrive", _int(0, _LIMIT), 0)
    prompt_len = r.value(item, at, "prompt_len", _int(1, _LIMIT))
    output_len = r.value(item, at, "output_len", _int(0, _LIMIT), 0)
    abort = r.value(item, at, "abort", _int(0, _LIMIT), None)
    ok = None not in (rid, arrive, prompt_len, output_len) and not ("abort" in item and abort is None)
    if arrive is not None and max_steps is not None and arrive >= max_steps:
        # the scheduler would spin to max_steps and give up without ever admitting the request
        r.add(f"{at}.arrive", f"must come before timeline.max_steps (got {arrive} >= {max_steps})")
        ok = False
    if abort is not None and arrive is not None and abort <= arrive:
        r.add(f"{at}.abort", f"must come after arrive (got {abort} <= {arrive})")
        ok = False
    if prompt_len is not None and output_len is not None and pool is not None:
        needed = prompt_len + output_len
        if needed > pool.max_context_len:
            r.add(at, f"needs {needed} positions, pool.max_context_len is {pool.max_context_len}")
            ok = False
    if not ok:
        return None
    return RequestSpec(rid=rid, arrive=arrive, prompt_len=prompt_len, output_len=output_len, abort=abort)


_RUN_KEYS = ("designs", "backends", "kv_write", "faults")


def _read_run(
    r: _Reader, table: dict, pool: PoolSpec | None
) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None, str | None, frozenset[str] | None]:
    r.known_keys(table, "run", _RUN_KEYS)
    designs = r.array(table, "run", "designs", _str(nonempty=True), tuple(DESIGNS))
    if designs is not None:
        for i, name in enumerate(designs):
            if name in DESIGNS:
                continue
            try:
                resolve_design(name)
            except KeyError as exc:
                r.add(f"run.designs[{i}]", str(exc.args[0]) if exc.args else repr(name))
            except Exception as exc:  # noqa: BLE001 - a third-party module failing at import is the file's problem
                r.add(f"run.designs[{i}]", f"design {name!r} cannot be imported: {type(exc).__name__}: {exc}")
    backends = r.array(table, "run", "backends", _choice(BACKENDS), ("torch_native",))
    kv_write = r.value(table, "run", "kv_write", _choice(KV_WRITE_PATHS), "plain")
    if kv_write == "fused_fp8" and pool is not None and pool.kv_dtype != "fp8_e4m3":
        r.add("run.kv_write", f"'fused_fp8' needs pool.kv_dtype = 'fp8_e4m3', got {pool.kv_dtype!r}")
    faults = r.array(table, "run", "faults", _choice(FAULTS), (), nonempty=False)
    return designs, backends, kv_write, None if faults is None else frozenset(faults)


_EXPECT_KEYS = ("verdict", *MODES, "without_faults", "why")


def _read_expectations(
    r: _Reader,
    table: dict,
    *,
    designs: tuple[str, ...] | None,
    modes: tuple[str, ...] | None,
    faults: frozenset[str] | None,
) -> tuple[Expectation, ...] | None:
    """One Expectation per design in run order; cross-checks run only against parts that parsed."""
    verdict = _choice(OUTCOMES)
    by_design: dict[str, Expectation] = {}
    ok = True
    for design, sub in table.items():
        at = _join("expect", design)
        if designs is not None and design not in designs:
            r.add(at, f"no such design in run.designs ({', '.join(designs)})")
            ok = False
        if not isinstance(sub, dict):
            r.add(at, f"expected a table, got {_found(sub)}")
            ok = False
            continue
        r.known_keys(sub, at, _EXPECT_KEYS)
        default = r.value(sub, at, "verdict", verdict)
        why = r.value(sub, at, "why", _str(nonempty=True))
        without = r.value(sub, at, "without_faults", verdict, None)
        if "without_faults" in sub and faults is not None and not faults:
            # with no faults the 'without faults' run is the run itself: a second verdict would be noise
            r.add(_join(at, "without_faults"), "only allowed when run.faults is non-empty")
            ok = False
        by_mode: list[tuple[str, str]] = []
        for mode in MODES:
            if mode not in sub:
                continue
            value = r.value(sub, at, mode, verdict)
            if modes is not None and mode not in modes:
                r.add(_join(at, mode), f"mode not run; graphs.modes is {', '.join(modes)}")
                ok = False
            if value is None:
                ok = False
            else:
                by_mode.append((mode, value))
        if default is None or why is None or ("without_faults" in sub and without is None):
            ok = False
            continue
        by_design[design] = Expectation(
            design=design, verdict=default, by_mode=tuple(by_mode), without_faults=without, why=why.strip()
        )
    if designs is None:
        return None
    for design in designs:
        if design not in table:
            r.add(_join("expect", design), "missing table; every design in run.designs needs an expected verdict")
            ok = False
    if not ok:
        return None
    return tuple(by_design[d] for d in designs)


# ---- dry run ------------------------------------------------------------------------------------------

# which pool field to raise, by the allocator's name for what ran out
_EXHAUSTED_FIELD = {
    "SWA KV pool": "pool.swa_size",
    "full KV pool": "pool.full_size",
    "req_to_token rows": "pool.max_running_requests",
    "req_to_token": "pool.max_context_len",
}


def _dry_run(r: _Reader, model: ModelSpec, pool_spec: PoolSpec, timeline: TimelineSpec) -> None:
    """Schedule the whole timeline with the real allocators to find pools too small for it.

    Slot assignment depends on the timeline alone (tokens are teacher-forced), so no model or backend is
    needed. The pool is built without layers: the dry run exercises slot bookkeeping only, and K/V buffers
    would just cost memory.
    """
    pool = HybridSWAKVPool(spec=pool_spec, layer_is_swa=(), num_kv_heads=1, head_dim=1)
    req_to_token_pool = ReqToTokenPool(
        max_running_requests=pool_spec.max_running_requests, max_context_len=pool_spec.max_context_len
    )
    sched = Scheduler(
        timeline,
        pool=pool,
        allocator=SWATokenToKVPoolAllocator(pool),
        req_to_token_pool=req_to_token_pool,
        window=model.window,
        vocab_size=model.vocab_size,
    )
    try:
        while sched.next_step() is not None:
            sched.finish_step()
    except PoolExhausted as exc:
        # "SWA KV pool: need 9 slots, 4 free of 47; raise the SWA pool size in the scenario": the advice is
        # what the key path already says, so keep the measurement only
        what = str(exc).split("; ")[0]
        field = _EXHAUSTED_FIELD.get(what.partition(":")[0], "pool")
        r.add(field, f"too small for the timeline: {what} (at step {sched.step_index})")
    except RuntimeError as exc:
        if "max_steps" in str(exc):
            r.add("timeline.max_steps", f"too small: {exc}")
        else:
            r.add("timeline", f"the dry run failed at step {sched.step_index}: {type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - whatever the file causes is reported, never a traceback
        r.add("timeline", f"the dry run failed at step {sched.step_index}: {type(exc).__name__}: {exc}")

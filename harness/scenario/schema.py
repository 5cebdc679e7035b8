"""TOML to ``ScenarioSpec``: parse, check what only TOML can get wrong, build the specs.

Raw TOML is converted here and nowhere else; nothing downstream sees a dict. Each value is type-checked
(problems go to the ``Reader``); a value that is absent takes the spec's default, and one of the wrong type
is reported and then stands in as the default (a required one as a minimal placeholder), so that the other
values still meet their spec's ``problems()`` and every problem of the file is listed in one pass. When a
whole part cannot be built (no ``[model]``, an unknown preset), the parts that were built are still checked
on their own (``part_problems``).
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
import stat
import tomllib
from pathlib import Path
from typing import Any

from ..runspec import (
    TIMEOUT_DEFAULT_S,
    CapturePolicy,
    GraphSpec,
    KVWrite,
    Mode,
    Outcome,
    nested,
)
from ..serving.designs import DEFAULT_DESIGNS
from ..serving.eviction import EvictionSpec
from ..serving.model_spec import PRESETS, ModelSpec, model_spec
from ..serving.pool_spec import FREE_ORDERS, PoolSpec
from ..serving.timeline import DRAFT_EXTEND_V2, DRAFT_EXTEND_VALUES, RequestSpec, TimelineSpec
from .toml_access import (
    Check,
    Reader,
    boolean,
    choice,
    found,
    integer,
    join_key,
    number,
    string,
)
from .names import scenario_name
from .spec import DEFAULT_BACKENDS, BackendExpectation, Expectation, ScenarioSpec

_BOM = "\ufeff"


FILE_LIMIT = 1 << 20
"""bytes; the library's scenario files are 1-3 KiB, and a file is read whole"""
NESTING_LIMIT = 64
"""arrays and inline tables inside each other; tomllib recurses once per level"""


def parse(reader: Reader, path: Path) -> dict | None:
    """The TOML document of ``path``, or None with the reason in ``reader``."""
    raw = _read_bytes(reader, path)
    if raw is None:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, line_start = raw.count(b"\n", 0, exc.start) + 1, raw.rfind(b"\n", 0, exc.start) + 1
        reader.add(f"line {line}, column {exc.start - line_start + 1}",
                   f"not UTF-8 text: {exc.reason} (byte 0x{raw[exc.start]:02x}); save the file as UTF-8")
        return None
    if text.startswith(_BOM):
        # tomllib would say "Invalid statement" at line 1, column 1: name the invisible cause
        reader.add("line 1, column 1", "the file starts with a UTF-8 byte-order mark (BOM); save it without one")
        return None
    if (deep := _too_deep(text)) is not None:
        reader.add(f"line {deep[0]}, column {deep[1]}",
                   f"invalid TOML: arrays or inline tables nested too deeply (more than {NESTING_LIMIT} levels)")
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
    except RecursionError:  # past what _too_deep counts (it skips strings as TOML does): still one line
        reader.add("", "invalid TOML: arrays or tables nested too deeply to parse")
        return None


def _read_bytes(reader: Reader, path: Path) -> bytes | None:
    """The file's bytes when it is a regular file within ``FILE_LIMIT``; checked on the open file, before
    reading, so a FIFO never blocks the loader and a 4 GiB file is never read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        reader.add("", f"cannot read the file: {exc.strerror or exc}")
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        reader.add("", "not a regular file (a scenario is a .toml file)")
        return None
    with os.fdopen(fd, "rb") as f:
        if st.st_size > FILE_LIMIT:
            reader.add("", f"{st.st_size} bytes, more than the {FILE_LIMIT >> 10} KiB a scenario file may hold")
            return None
        os.set_blocking(f.fileno(), True)
        try:
            raw = f.read(FILE_LIMIT + 1)
        except OSError as exc:
            reader.add("", f"cannot read the file: {exc.strerror or exc}")
            return None
    if len(raw) > FILE_LIMIT:  # it grew after the check
        reader.add("", f"more than the {FILE_LIMIT >> 10} KiB a scenario file may hold")
        return None
    return raw


def _too_deep(text: str) -> tuple[int, int] | None:
    """(line, column) where arrays and inline tables first nest past ``NESTING_LIMIT``, skipping strings
    and comments; None when they never do."""
    if text.count("[") + text.count("{") <= NESTING_LIMIT:
        return None
    depth, line, line_start, i, n = 0, 1, 0, 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\n":
            line, line_start = line + 1, i + 1
        elif ch == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif ch in "\"'":
            quote = text[i : i + 3] if text[i : i + 3] in ('"""', "'''") else ch
            j = i + len(quote)
            while j < n and not text.startswith(quote, j) and (len(quote) == 3 or text[j] != "\n"):
                j += 2 if quote[0] == '"' and text[j] == "\\" else 1
            j = min(j, n)
            if "\n" in text[i:j]:
                line, line_start = line + text.count("\n", i, j), text.rfind("\n", i, j) + 1
            i = j + len(quote) if text.startswith(quote, j) else j  # an unterminated string ends at its line
            continue
        elif ch in "[{":
            depth += 1
            if depth > NESTING_LIMIT:
                return line, i - line_start + 1
        elif ch in "]}":
            depth = max(0, depth - 1)
        i += 1
    return None


_TOP_KEYS = ("description", "tags", "references", "model", "pool", "serving", "eviction", "graphs", "timeline", "run",
             "expect")


def read_document(r: Reader, data: dict, path: Path) -> ScenarioSpec | None:
    """The spec the document describes, or None when a required part is missing or unreadable."""
    r.known_keys(data, "", _TOP_KEYS)
    description = r.value(data, "", "description", string(nonempty=True))
    tags = r.array(data, "", "tags", string(nonempty=True), ())
    references = r.array(data, "", "references", string(nonempty=True), ())
    model = _read_model(r, r.table(data, "", "model", required=True))
    pool = _read_pool(r, r.table(data, "", "pool", required=True))
    serving, free_order = _read_serving(r, r.table(data, "", "serving", required=False) or {})
    if pool is not None and free_order is not None:
        if "free_order" in (data.get("pool") or {}):
            r.add("serving.free_order", "given in [pool] too; set it once, here (the order the stack hands freed "
                                        "slots out again)")
        else:
            pool = dataclasses.replace(pool, free_order=free_order)
    eviction = _read_eviction(r, r.table(data, "", "eviction", required=False) or {})
    graphs, modes = _read_graphs(r, r.table(data, "", "graphs", required=False) or {})
    timeline = _read_timeline(r, r.table(data, "", "timeline", required=True))
    designs, backends, kv_write, faults, timeout_s = _read_run(r, r.table(data, "", "run", required=False) or {})
    expectations = _read_expectations(r, r.table(data, "", "expect", required=False) or {})
    parts = dict(
        description=description, tags=tags, references=references, model=model, pool=pool, timeline=timeline,
        graphs=graphs, modes=modes,
        designs=designs, backends=backends, kv_write=kv_write, faults=faults, expectations=expectations,
    )
    if model is None or pool is None or timeline is None or expectations is None:
        for prefix, part in (("model", model), ("pool", pool), ("timeline", timeline)):
            if part is not None:
                for problem in nested(prefix, part.problems()):
                    if problem.key not in r.reported:
                        r.add(problem.key, problem.message)
        for problem in graphs.problems():
            r.add(f"graphs.{problem.key}", problem.message)
        return None
    parts.update(description=(description or "").strip(), tags=tags or (), references=references or (),
                 designs=designs or DEFAULT_DESIGNS,
                 backends=backends or DEFAULT_BACKENDS, kv_write=kv_write or KVWrite.PLAIN, faults=faults or ())
    return ScenarioSpec(name=scenario_name(path.stem), path=path, timeout_s=timeout_s, serving=serving,
                        eviction=eviction, **parts)


def _as_enum(enum_type: type[enum.StrEnum], value: str) -> Any:
    """The member when ``value`` names one; the raw string otherwise, for ``problems()`` to report."""
    return enum_type(value) if value in tuple(enum_type) else value


# ModelSpec fields a scenario may override, by the annotation that says how to read them. ``name`` stays
# the preset's; a field of another kind added to ModelSpec later is simply not overridable from a file.
_MODEL_CHECKS: dict[str, Check] = {
    "int": integer(),
    "float": number(),
    "str": string(),
    "tuple[str, ...]": string(),
}
_MODEL_FIELDS = {
    f.name: str(f.type) for f in dataclasses.fields(ModelSpec) if f.name != "name" and str(f.type) in _MODEL_CHECKS
}


def _read_model(r: Reader, table: dict | None) -> ModelSpec | None:
    if table is None:
        return None
    r.known_keys(table, "model", ("preset", *_MODEL_FIELDS, "layer_windows"))
    preset = r.value(table, "model", "preset", choice(PRESETS))
    if preset is None:  # reported; the first preset stands in so the overrides are still checked
        preset = next(iter(PRESETS))
    base = PRESETS[preset]
    overrides: dict[str, Any] = {}
    for name, kind in _MODEL_FIELDS.items():
        check = _MODEL_CHECKS[kind]
        if kind.startswith("tuple"):
            value = r.array(table, "model", name, check, getattr(base, name))
        else:
            value = r.value(table, "model", name, check, getattr(base, name))
        if value is not None:
            overrides[name] = float(value) if kind == "float" else value
    # per layer windows, a full layer's written as 0 (TOML has no null): ``ModelSpec.problems`` checks the rest
    windows = r.array(table, "model", "layer_windows", integer(), None)
    if windows is not None:
        overrides["layer_windows"] = tuple(w or None for w in windows)
    return model_spec(preset, **overrides)


_POOL_KEYS = ("full_size", "swa_size", "kv_dtype", "max_context_len", "max_running_requests", "page_size",
              "free_order")


def _read_pool(r: Reader, table: dict | None) -> PoolSpec | None:
    if table is None:
        return None
    r.known_keys(table, "pool", _POOL_KEYS)
    defaults = PoolSpec(full_size=2, swa_size=2)
    fields = {
        "full_size": r.value(table, "pool", "full_size", integer()),
        "swa_size": r.value(table, "pool", "swa_size", integer()),
        "kv_dtype": r.value(table, "pool", "kv_dtype", string(), defaults.kv_dtype),
        "max_context_len": r.value(table, "pool", "max_context_len", integer(), defaults.max_context_len),
        "max_running_requests": r.value(table, "pool", "max_running_requests", integer(),
                                        defaults.max_running_requests),
        "page_size": r.value(table, "pool", "page_size", integer(), defaults.page_size),
        "free_order": r.value(table, "pool", "free_order", string(), defaults.free_order),
    }
    return PoolSpec(**{k: (getattr(defaults, k) if v is None else v) for k, v in fields.items()})


_SERVING_KEYS = ("stack", "free_order")


def _read_serving(r: Reader, table: dict) -> tuple[str, str | None]:
    """(stack, free_order) of ``[serving]``: the stack by registered name or ``package.module:Class``, and
    the order it hands freed slots out again (``PoolSpec.free_order``; None: the pool's, ``[pool]``'s)."""
    r.known_keys(table, "serving", _SERVING_KEYS)
    default = ScenarioSpec.__dataclass_fields__["serving"].default
    stack = r.value(table, "serving", "stack", string(nonempty=True), default)
    # checked here, not by the pool's rules: a problem names the key the file has
    free_order = r.value(table, "serving", "free_order", choice(FREE_ORDERS), None)
    return (default if stack is None else stack.strip()), free_order


_EVICTION_KEYS = ("policy", "interval", "prefix_cache")


def _read_eviction(r: Reader, table: dict) -> EvictionSpec:
    r.known_keys(table, "eviction", _EVICTION_KEYS)
    defaults = EvictionSpec()
    policy = r.value(table, "eviction", "policy", string(nonempty=True), defaults.policy)
    interval = r.value(table, "eviction", "interval", integer(), defaults.interval)
    prefix_cache = r.value(table, "eviction", "prefix_cache", boolean(), defaults.prefix_cache)
    return EvictionSpec(policy=defaults.policy if policy is None else policy,
                        interval=defaults.interval if interval is None else interval,
                        prefix_cache=defaults.prefix_cache if prefix_cache is None else prefix_cache)


_GRAPH_KEYS = ("modes", "decode_buckets", "prefill_buckets", "capture")


def _read_graphs(r: Reader, table: dict) -> tuple[GraphSpec, tuple[Mode, ...]]:
    r.known_keys(table, "graphs", _GRAPH_KEYS)
    defaults = GraphSpec()
    modes = r.array(table, "graphs", "modes", string(), tuple(Mode))
    decode = r.array(table, "graphs", "decode_buckets", integer(), defaults.decode_buckets)
    prefill = r.array(table, "graphs", "prefill_buckets", integer(), defaults.prefill_buckets)
    capture = r.value(table, "graphs", "capture", string(), defaults.capture)
    graphs = GraphSpec(
        decode_buckets=defaults.decode_buckets if decode is None else decode,
        prefill_buckets=defaults.prefill_buckets if prefill is None else prefill,
        capture=_as_enum(CapturePolicy, defaults.capture if capture is None else capture),
    )
    return graphs, tuple(_as_enum(Mode, m) for m in (tuple(Mode) if modes is None else modes))


_TIMELINE_KEYS = ("seed", "chunk_size", "draft_steps", "draft_topk", "accept_lens", "draft_extend", "max_steps",
                  "requests")
_REQUEST_KEYS = ("rid", "arrive", "prompt_len", "output_len", "abort", "prefix_of", "shared_len")


def _read_timeline(r: Reader, table: dict | None) -> TimelineSpec | None:
    if table is None:
        return None
    r.known_keys(table, "timeline", _TIMELINE_KEYS)
    defaults = TimelineSpec(requests=())
    fields = {
        name: r.value(table, "timeline", name, integer(), getattr(defaults, name))
        for name in ("seed", "chunk_size", "draft_steps", "draft_topk", "max_steps")
    }
    accept_lens = r.array(table, "timeline", "accept_lens", integer(), ())
    draft_extend = r.value(table, "timeline", "draft_extend",
                           Check(f"{DRAFT_EXTEND_VALUES} (SGLang's DRAFT_EXTEND_V2)",
                                 lambda v: isinstance(v, bool) or v == DRAFT_EXTEND_V2), defaults.draft_extend)
    raw = table.get("requests")
    if raw is None:
        r.add("timeline.requests", "missing required key; expected an array of tables ([[timeline.requests]])")
        return None
    if not isinstance(raw, list) or not raw:
        what = "an empty array" if isinstance(raw, list) else found(raw)
        r.add("timeline.requests", f"expected at least one [[timeline.requests]] table, got {what}")
        return None
    requests = []
    for i, item in enumerate(raw):
        at = f"timeline.requests[{i}]"
        if not isinstance(item, dict):
            r.add(at, f"expected a table, got {found(item)}")
            continue
        req = _read_request(r, item, at, i)
        if req is not None:
            requests.append(req)
    if len(requests) != len(raw):
        return None
    return TimelineSpec(requests=tuple(requests), accept_lens=() if accept_lens is None else accept_lens,
                        draft_extend=defaults.draft_extend if draft_extend is None else draft_extend,
                        **{k: (getattr(defaults, k) if v is None and k != "chunk_size" else v)
                           for k, v in fields.items()})


def _read_request(r: Reader, item: dict, at: str, index: int) -> RequestSpec | None:
    r.known_keys(item, at, _REQUEST_KEYS)
    rid = r.value(item, at, "rid", string(nonempty=True), f"r{index}")
    prompt_len = r.value(item, at, "prompt_len", integer())
    values = {name: r.value(item, at, name, integer(), default)
              for name, default in (("arrive", 0), ("output_len", 0), ("abort", None), ("shared_len", 0))}
    values = {k: (0 if v is None and k != "abort" else v) for k, v in values.items()}
    prefix_of = r.value(item, at, "prefix_of", string(nonempty=True), None)
    return RequestSpec(rid=f"r{index}" if rid is None else rid, prompt_len=1 if prompt_len is None else prompt_len,
                       prefix_of=prefix_of, **values)


_RUN_KEYS = ("designs", "backends", "kv_write", "faults", "timeout_s")


def _read_run(r: Reader, table: dict) -> tuple[Any, Any, Any, Any, float]:
    r.known_keys(table, "run", _RUN_KEYS)
    designs = r.array(table, "run", "designs", string(nonempty=True), DEFAULT_DESIGNS)
    backends = r.array(table, "run", "backends", string(nonempty=True), DEFAULT_BACKENDS)
    kv_write = r.value(table, "run", "kv_write", string(), KVWrite.PLAIN)
    faults = r.array(table, "run", "faults", string(nonempty=True), ())
    timeout_s = r.value(table, "run", "timeout_s", number(), TIMEOUT_DEFAULT_S)
    return (designs, backends, None if kv_write is None else _as_enum(KVWrite, kv_write), faults,
            TIMEOUT_DEFAULT_S if timeout_s is None else float(timeout_s))


_VERDICT_KEYS = ("verdict", *Mode, "without_faults", "why")


def _read_verdicts(r: Reader, sub: dict, at: str) -> tuple[Any, tuple, Any, Any]:
    """(verdict, by_mode, without_faults, why) of one expectation table; an unreadable value is None."""
    verdict = r.value(sub, at, "verdict", string(), None)
    why = r.value(sub, at, "why", string(), None)
    without = r.value(sub, at, "without_faults", string(), None)
    by_mode = []
    for mode in Mode:
        if mode in sub:
            value = r.value(sub, at, mode, string())
            if value is not None:
                by_mode.append((mode, _as_enum(Outcome, value)))
    return (None if verdict is None else _as_enum(Outcome, verdict), tuple(by_mode),
            None if without is None else _as_enum(Outcome, without), why)


def _read_expectations(r: Reader, table: dict) -> tuple[Expectation, ...] | None:
    out = []
    ok = True
    for design, sub in table.items():
        at = join_key("expect", design)
        if not isinstance(sub, dict):
            r.add(at, f"expected a table, got {found(sub)}")
            ok = False
            continue
        r.known_keys(sub, at, (*_VERDICT_KEYS, "by_backend"))
        verdict, by_mode, without, why = _read_verdicts(r, sub, at)
        overrides = _read_backend_overrides(r, sub.get("by_backend", {}), join_key(at, "by_backend"))
        if overrides is None:
            ok = False
            continue
        if "verdict" not in sub:
            r.add(join_key(at, "verdict"), "missing required key; expected one of 'match', 'diverge', 'error'")
        if "why" not in sub:
            r.add(join_key(at, "why"), "missing required key; expected a non-empty string")
        out.append(Expectation(design=design, verdict=verdict or Outcome.MATCH, by_mode=by_mode,
                               without_faults=without, why=(why or "").strip(), by_backend=overrides))
    return tuple(out) if ok else None


def _read_backend_overrides(r: Reader, table: object, at: str) -> tuple[BackendExpectation, ...] | None:
    if not isinstance(table, dict):
        r.add(at, f"expected a table, got {found(table)}")
        return None
    out = []
    for backend, sub in table.items():
        sub_at = join_key(at, backend)
        if not isinstance(sub, dict):
            r.add(sub_at, f"expected a table, got {found(sub)}")
            return None
        r.known_keys(sub, sub_at, _VERDICT_KEYS)
        verdict, by_mode, without, why = _read_verdicts(r, sub, sub_at)
        if "why" not in sub:
            r.add(join_key(sub_at, "why"), "missing required key; say why this backend differs")
        out.append(BackendExpectation(backend=backend, verdict=verdict, by_mode=by_mode, without_faults=without,
                                      why=(why or "").strip()))
    return tuple(out)


__all__ = ["parse", "read_document"]

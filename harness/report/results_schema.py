"""The schema of a results file, checked once, on reading, before any record becomes a view.

A results file comes from another machine, another version, a hand edit or an attacker, so nothing in it
is taken on trust: every field is checked for its type (the view dataclasses' own annotations, so a field
added to a view is checked as soon as it exists), its enum (verdicts, modes, pools, forward paths) and its
bounds (counts are non-negative integers; a pool is never larger than a scenario may make it, since a
report loops over its slots), run names are unique, and the first problem refuses the file with one line
naming the file, the record and the field. JSON that Python would accept but a results file never
holds (``NaN``, ``Infinity``, a key twice in one object) is kept as a marker when the file is parsed and
refused where it stands, naming its field.

Fields a later version adds to a record are ignored, as ``CaseView.from_record`` ignores them; inside a
record's parts (a mismatch, a step) an unknown field is refused, since the view would not accept it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import stat
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..runspec import Device, Engine, Mode, Outcome
from ..serving.model import MAX_POSITIONS
from ..serving.pool import KV_DTYPES, POOL_SIZE_LIMIT
from .views import INFORMATION, RECORD_VERSION, CaseView, StepView, TokenSlotsView

FILE_LIMIT = 256 << 20
"""bytes; the library's results file is about 5 MiB"""
COUNT_LIMIT = 1 << 53
"""counts are exact in JSON up to here"""
_STEP_LIMIT = 1 << 20
_SEED_MAX = (1 << 63) - 1
SKIPPED = "skipped"
"""the verdict of a case its backend cannot run"""
NO_EXPECTATION = "no expectation"
"""``check.matrix.case.NO_EXPECTATION``, the expectation of a design nobody stated one for (not imported: reading a
results file needs nothing of the checking)"""


class ResultsFileError(ValueError):
    """A results file refused: one line naming the file, the record and the field."""


def _found(value: object) -> str:
    """What the file holds, in JSON's words."""
    if value is None:
        return "null"
    if isinstance(value, _NonFinite):
        return value.text
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value[:40] + '...' if len(value) > 40 else value!r}"
    if isinstance(value, list):
        return f"an array of {len(value)}"
    return "an object"


class _Refused(Exception):
    def __init__(self, at: str, message: str) -> None:
        super().__init__(at, message)
        self.at, self.message = at, message


def _choice(*choices: str) -> Callable[[Any], str | None]:
    options = tuple(str(c) for c in choices)  # enum members as the strings a file holds

    def check(value: Any) -> str | None:
        return None if value in options else f"expected one of {', '.join(map(repr, options))}"
    return check


def _between(lo: int, hi: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if lo <= value <= hi else f"expected an integer from {lo} to {hi}"
    return check


def _nonempty(value: Any) -> str | None:
    return None if value.strip() else "expected a non-empty string"


_COUNT = _between(0, COUNT_LIMIT)
_STEP = _between(0, _STEP_LIMIT)
def _group_name(value: Any) -> str | None:
    # a stack names its own KV groups ("full" and "swa" for SGLang's); "hidden" is a hidden state's record
    return None if value.isidentifier() and len(value) <= 64 else "expected a KV group's name (an identifier)"


_POOLS = _group_name
_OUTCOMES = tuple(Outcome)

# (view, field) -> the rule beyond its type; applied to each item of a tuple field
_RULES: dict[tuple[str, str], Callable[[Any], str | None]] = {
    ("CaseView", "name"): _nonempty,
    ("CaseView", "scenario"): _nonempty,
    ("CaseView", "design"): _nonempty,
    ("CaseView", "backend"): _nonempty,
    ("CaseView", "mode"): _choice(*Mode),
    ("CaseView", "engine"): _choice(*Engine),
    ("CaseView", "device"): _choice(*Device),
    ("CaseView", "expected"): _choice(*_OUTCOMES, NO_EXPECTATION, INFORMATION),
    ("CaseView", "verdict"): _choice(*_OUTCOMES, SKIPPED),
    ("CaseView", "mismatches"): _COUNT,
    ("CaseView", "mismatched_slots"): _COUNT,
    ("CaseView", "dummy_writes"): _COUNT,
    ("CaseView", "steps_compared"): _STEP,
    ("CaseView", "duration_s"): lambda v: None if math.isfinite(v) and v >= 0 else "expected a number of seconds",
    ("MismatchView", "step"): _STEP,
    ("MismatchView", "pool"): _POOLS,
    ("MismatchView", "layer"): _COUNT,
    ("MismatchView", "slot"): _between(0, POOL_SIZE_LIMIT - 1),
    ("MismatchView", "found_in"): _between(0, POOL_SIZE_LIMIT - 1),
    ("MismatchView", "written_at"): _STEP,
    ("ErrorView", "step"): _STEP,
    ("FrameView", "line"): _COUNT,
    ("FindingView", "kind"): _choice("unregistered", "stale", "moved"),
    ("FindingView", "shape"): _COUNT,
    ("FindingView", "replays"): _COUNT,
    ("GraphView", "captures"): _COUNT,
    ("GraphView", "replays"): _COUNT,
    ("GraphView", "padded_replays"): _COUNT,
    ("GraphView", "eager_fallbacks"): _COUNT,
    ("SetupView", "layers"): _group_name,
    ("SetupView", "window"): _between(1, MAX_POSITIONS),
    # a report draws every slot of a pool: bounded as a scenario's pools are (``setup.full_size = 10**9``
    # would loop over a billion slots)
    ("SetupView", "full_size"): _between(2, POOL_SIZE_LIMIT),
    ("SetupView", "swa_size"): _between(2, POOL_SIZE_LIMIT),
    ("SetupView", "kv_dtype"): _choice(*KV_DTYPES),
    ("SetupView", "model_seed"): _between(0, _SEED_MAX),
    ("SetupView", "timeline_seed"): _between(0, _SEED_MAX),
    ("SetupView", "decode_buckets"): _between(1, POOL_SIZE_LIMIT),
    ("SetupView", "prefill_buckets"): _between(1, POOL_SIZE_LIMIT),
    ("SetupView", "chunk_size"): _between(1, POOL_SIZE_LIMIT),
    ("SetupView", "draft_steps"): _between(0, POOL_SIZE_LIMIT),
    ("ForwardView", "path"): _choice("eager", "fallback", "replay"),
    ("ForwardView", "rows"): _COUNT,
    ("ForwardView", "bucket"): _between(1, POOL_SIZE_LIMIT),
    ("TokenSlotsView", "pos"): _between(0, MAX_POSITIONS),
    ("TokenSlotsView", "slots"): _between(0, POOL_SIZE_LIMIT - 1),
    ("GroupView", "name"): _group_name,
    ("GroupView", "label"): _nonempty,
    ("GroupView", "size"): _between(0, POOL_SIZE_LIMIT),
    ("GroupView", "window"): _between(0, MAX_POSITIONS),
    ("GroupView", "layers"): _between(0, 4095),
    ("StepView", "index"): _STEP,
    ("StepView", "kind"): _choice("extend", "decode", "draft"),
    ("StepView", "batch_size"): _COUNT,
    ("HeatView", "step"): _STEP,
    ("HeatView", "pool"): _POOLS,
    ("HeatView", "layer"): _COUNT,
    ("HeatView", "count"): _COUNT,
}
_SEQUENCE_LIMIT = {("CaseView", "details"): 10_000, ("SetupView", "layers"): 4096, ("FindingView", "shape"): 16,
                   ("ErrorView", "frames"): 64, ("SetupView", "groups"): 64, ("GroupView", "layers"): 4096,
                   ("TokenSlotsView", "slots"): 64}
"""items a tuple field may hold, where more would only be a way to make a report slow"""


_DERIVED_AT_READING = {("CaseView", "clean_rerun")}
"""fields a file of an older harness lacks that ``CaseView.from_record`` derives (from the run's name)"""


def _version_problem(value: Any, what: str) -> str | None:
    """Why ``value`` is not a version this harness reads: compared by type and value, as JSON has them (Python
    holds ``1.0 == True == 1``); an older file reads, its later fields defaulted; a newer one is named."""
    if not isinstance(value, int) or isinstance(value, bool):
        return f"expected {what} version, the integer {RECORD_VERSION}, got {_found(value)}"
    if value > RECORD_VERSION:
        return (f"written by a newer harness (version {value}); this one reads versions up to {RECORD_VERSION}: "
                "update the harness to read it")
    if value < 1:
        return f"expected {what} version from 1 to {RECORD_VERSION}, got {_found(value)}"
    return None


Checker = Callable[[Any], None]
"""checks one value; raises ``_Refused`` whose ``at`` is the path below the value"""

_SCALARS: dict[Any, tuple[str, Callable[[Any], bool]]] = {
    str: ("a string", lambda v: isinstance(v, str)),
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    bool: ("true or false", lambda v: isinstance(v, bool)),
}


def _within(at: str, exc: _Refused) -> _Refused:
    """``exc`` as seen from one level up: ``at`` joined in front of its path."""
    below = exc.at
    exc.at = at + ("" if not below else below if below.startswith("[") else f".{below}")
    return exc


def _compile(hint: Any, rule: Callable[[Any], str | None] | None = None, limit: int | None = None) -> Checker:
    """The checker of a value of type ``hint`` (a view's annotation), built once per field."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union) and type(None) in args:
        inner = _compile(next(a for a in args if a is not type(None)), rule, limit)

        def optional(value: Any) -> None:
            if value is not None:
                inner(value)
        return optional
    if dataclasses.is_dataclass(hint):
        return lambda value: _check_view(value, hint)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = _compile(args[0], rule)

        def sequence(value: Any) -> None:
            if not isinstance(value, list):
                raise _Refused("", f"expected an array, got {_found(value)}")
            if limit is not None and len(value) > limit:
                raise _Refused("", f"expected at most {limit} items, got {len(value)}")
            for i, v in enumerate(value):
                try:
                    item(v)
                except _Refused as exc:
                    raise _within(f"[{i}]", exc) from None
        return sequence
    if origin is tuple:
        items = [_compile(a) for a in args]

        def fixed(value: Any) -> None:
            if not isinstance(value, list) or len(value) != len(items):
                raise _Refused("", f"expected an array of {len(items)}, got {_found(value)}")
            for i, (check, v) in enumerate(zip(items, value)):
                try:
                    check(v)
                except _Refused as exc:
                    raise _within(f"[{i}]", exc) from None
        return fixed
    if hint not in _SCALARS:
        raise TypeError(f"results_schema cannot check a field of type {hint}")
    kind, accept = _SCALARS[hint]

    def scalar(value: Any) -> None:
        if not accept(value):
            raise _Refused("", f"expected {kind}, got {_found(value)}")
        if rule is not None and (problem := rule(value)) is not None:
            raise _Refused("", f"{problem}, got {_found(value)}")
    return scalar


@functools.cache
def _fields(view: type) -> tuple[tuple[str, bool, Checker], ...]:
    """(name, required, checker) of each field of a view, from its annotations."""
    hints = typing.get_type_hints(view)
    out = []
    for f in dataclasses.fields(view):
        if not f.init:
            continue
        key = (view.__name__, f.name)
        required = (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                    and key not in _DERIVED_AT_READING)
        check = _check_written if key == ("StepView", "written") else \
            _compile(hints[f.name], _RULES.get(key), _SEQUENCE_LIMIT.get(key))
        out.append((f.name, required, check))
    return tuple(out)


def _check_view(value: Any, view: type) -> None:
    if not isinstance(value, dict):
        raise _Refused("", f"expected an object, got {_found(value)}")
    _unique_keys(value)
    fields = _fields(view)
    if view is not CaseView:  # a record's own extra keys are ignored by ``from_record``; its parts' are not
        names = [name for name, _, _ in fields]
        for key in value:
            if key not in names:
                raise _Refused(key, f"unknown field; expected one of {', '.join(names)}")
    for name, required, check in fields:
        if name not in value:
            if required:
                raise _Refused(name, "missing")
            continue
        try:
            check(value[name])
        except _Refused as exc:
            raise _within(name, exc) from None


def _check_written(value: Any) -> None:
    # a step's tokens are ``[rid, pos, slot in each group...]`` arrays in a record, to keep files small
    # (``[rid, pos, full_slot, swa_slot]`` for SGLang's two groups, as every file before groups has them)
    if not isinstance(value, list):
        raise _Refused("", f"expected an array, got {_found(value)}")
    for i, row in enumerate(value):
        try:
            if not isinstance(row, list) or len(row) < 2:
                raise _Refused("", f"expected an array [rid, pos, slot...], got {_found(row)}")
            _check_view({"rid": row[0], "pos": row[1], "slots": row[2:]}, TokenSlotsView)
        except _Refused as exc:
            raise _within(f"[{i}]", exc) from None


_HYBRID_GROUPS = ("full", "swa")
"""the groups a setup without ``groups`` has: SGLang's full and SWA pools"""


def _check_groups(record: dict[str, Any]) -> None:
    """Every pool a record names is one of its setup's KV groups (SGLang's two without ``groups``) or
    "hidden", and every written token names one slot per group, so that the report can draw each group."""
    setup = record.get("setup") or {}
    names = tuple(g["name"] for g in setup.get("groups") or ()) or _HYBRID_GROUPS
    allowed = (*names, "hidden")
    places = [(f"details[{i}].pool", m["pool"]) for i, m in enumerate(record.get("details") or ())]
    places += [(f"heat[{i}].pool", h["pool"]) for i, h in enumerate(record.get("heat") or ())]
    places += [("first.pool", record["first"]["pool"])] if record.get("first") else []
    for i, name in enumerate(setup.get("layers") or ()):
        if name not in names:
            raise _Refused(f"setup.layers[{i}]", f"expected one of {', '.join(map(repr, names))}, got {_found(name)}")
    for at, name in places:
        if name not in allowed:
            raise _Refused(at, f"expected one of {', '.join(map(repr, allowed))}, got {_found(name)}")
    width = 2 + len(names)
    for i, step in enumerate(record.get("steps") or ()):
        for j, row in enumerate(step["written"]):
            if len(row) != width:
                raise _Refused(f"steps[{i}].written[{j}]", f"expected an array of {width}, got {_found(row)}")


def _check_record(record: Any, at: str) -> None:
    """``at``: the record, ``records[3] (run 'x')``; a problem reads ``records[3] (run 'x'): field: ...``."""
    try:
        _check_view(record, CaseView)
        if "version" in record and (problem := _version_problem(record["version"], "a record")) is not None:
            raise _Refused("version", problem)
        if "ok" in record and not isinstance(record["ok"], bool):
            raise _Refused("ok", f"expected true or false, got {_found(record['ok'])}")
        _check_groups(record)
    except _Refused as exc:
        exc.at = f"{at}: {exc.at}" if exc.at else at
        raise


def check_document(doc: Any) -> None:
    """Refuse a results document that breaks its schema: ``ResultsFileError`` with the first problem."""
    try:
        _check_document(doc)
    except _Refused as refused:
        raise ResultsFileError(f"{refused.at}: {refused.message}" if refused.at else refused.message) from None


def _check_document(doc: Any) -> None:
    if not isinstance(doc, dict):
        raise _Refused("", f"expected a results document (a JSON object), got {_found(doc)}")
    _unique_keys(doc)
    if (problem := _version_problem(doc.get("version"), "a results document")) is not None:
        raise _Refused("version", problem)
    if "complete" in doc and not isinstance(doc["complete"], bool):
        raise _Refused("complete", f"expected true or false, got {_found(doc['complete'])}")
    env = doc.get("environment", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise _Refused("environment", "expected an object of strings")
    try:
        _unique_keys(env)
    except _Refused as exc:
        raise _within("environment", exc) from None
    duration = doc.get("duration_s")
    if duration is not None and (not isinstance(duration, (int, float)) or isinstance(duration, bool)
                                 or not 0 <= duration < math.inf):
        raise _Refused("duration_s", f"expected a number of seconds or null, got {_found(duration)}")
    records = doc.get("records")
    if not isinstance(records, list):
        raise _Refused("records", f"expected an array of records, got {_found(records)}")
    first: dict[str, int] = {}
    for i, record in enumerate(records):
        name = record.get("name") if isinstance(record, dict) else None
        at = f"records[{i}]" + (f" (run {name!r})" if isinstance(name, str) else "")
        _check_record(record, at)
        if name in first:
            raise _Refused(f"{at}: name", f"the run is in the file twice: records[{first[name]}] has it too")
        first[name] = i


class _NonFinite:
    """``NaN``, ``Infinity`` or ``-Infinity`` in the file: Python's JSON reads them, no results file holds
    them; kept as this marker so that the check names the field that holds one."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class _Twice(dict):
    """An object in which a key appears twice (Python's JSON would keep the last silently)."""

    twice: str


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out and not isinstance(out, _Twice):
            out = _Twice(out)
            out.twice = key
        out[key] = value
    return out


def _unique_keys(value: dict) -> None:
    if isinstance(value, _Twice):
        raise _Refused(value.twice, "appears twice in one object")


def read_document(path: Path) -> dict[str, Any]:
    """The checked results document in ``path``; ``ResultsFileError`` naming the file when it is not one."""
    try:
        text = _read_text(path)
        try:
            doc = json.loads(text, parse_constant=_NonFinite, object_pairs_hook=_pairs)
        except json.JSONDecodeError as exc:
            raise ResultsFileError(f"line {exc.lineno}, column {exc.colno}: not JSON: {exc.msg}") from None
        except RecursionError:
            raise ResultsFileError(f"line {_deep_line(text)}: arrays or objects nested too deeply") from None
        except ValueError as exc:  # an integer of more digits than Python converts
            raise ResultsFileError(f"not JSON a results file holds: {exc}") from None
        check_document(doc)
    except ResultsFileError as exc:
        raise ResultsFileError(f"{path}: not a harness results file: {exc}") from None
    return doc


def _read_text(path: Path) -> str:
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise ResultsFileError(f"cannot read the file: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ResultsFileError("not a regular file")
    with os.fdopen(fd, "rb") as f:
        if st.st_size > FILE_LIMIT:
            raise ResultsFileError(f"{st.st_size} bytes, more than the {FILE_LIMIT >> 20} MiB a results file may hold")
        os.set_blocking(f.fileno(), True)
        try:
            raw = f.read(FILE_LIMIT + 1)
        except OSError as exc:
            raise ResultsFileError(f"cannot read the file: {exc.strerror or exc}") from None
    if len(raw) > FILE_LIMIT:
        raise ResultsFileError(f"more than the {FILE_LIMIT >> 20} MiB a results file may hold")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ResultsFileError(f"line {line}: not UTF-8 text: {exc.reason}") from None


_DEPTH_LIMIT = 100


def _deep_line(text: str) -> int:
    """The line where arrays and objects first nest past ``_DEPTH_LIMIT`` (strings skipped)."""
    depth, line, in_string, escaped = 0, 1, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > _DEPTH_LIMIT:
                return line
        elif ch in "]}":
            depth -= 1
        if ch == "\n":
            line += 1
    return line

"""Typed access to a parsed TOML document, collecting every problem instead of raising.

TOML can get types wrong (a string where an integer belongs, a table where an array does) and keys
unknown; that is all this module checks. Ranges and relations between values are the specs' own rules
(``problems()``), applied to whatever the reader builds.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

REQUIRED: Any = object()
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string: JSON's escapes are TOML's, and TOML also wants DEL escaped."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_key(key: str) -> str:
    """``key`` as a TOML file writes it: bare when it can be, quoted otherwise (design import paths)."""
    return key if _BARE_KEY.fullmatch(key) else toml_string(key)


def join_key(where: str, key: str) -> str:
    """The dotted key path of ``key`` inside ``where``."""
    return f"{where}.{toml_key(key)}" if where else toml_key(key)


def found(value: object) -> str:
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
class Check:
    """What a value must be: a description for messages and a predicate (conversion is the caller's)."""

    expected: str
    accept: Callable[[object], bool]


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # TOML true is a Python int subclass


def integer() -> Check:
    return Check("an integer", _is_int)


def boolean() -> Check:
    return Check("true or false", lambda v: isinstance(v, bool))


def number() -> Check:
    return Check("a number", lambda v: _is_int(v) or isinstance(v, float))


def string(nonempty: bool = False) -> Check:
    if nonempty:
        return Check("a non-empty string", lambda v: isinstance(v, str) and bool(v.strip()))
    return Check("a string", lambda v: isinstance(v, str))


def choice(choices: Iterable[str]) -> Check:
    options = tuple(choices)
    return Check(f"one of {', '.join(map(repr, options))}", lambda v: isinstance(v, str) and v in options)


class Reader:
    """Collects the problems of one file; every accessor records what is wrong and returns None, never raises."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.problems: list[str] = []
        self.reported: set[str] = set()
        """key paths with a problem already, whose placeholder value the spec's rules must not judge again"""

    def add(self, where: str, message: str) -> None:
        self.reported.add(where)
        self.problems.append(f"{self.path}: {where}: {message}" if where else f"{self.path}: {message}")

    def known_keys(self, table: dict, where: str, allowed: Iterable[str]) -> None:
        allowed = tuple(allowed)
        for key in table:
            if key not in allowed:
                self.add(join_key(where, key), f"unknown key; expected one of {', '.join(allowed)}")

    def table(self, parent: dict, where: str, key: str, *, required: bool) -> dict | None:
        at = join_key(where, key)
        if key not in parent:
            if required:
                self.add(at, "missing required table")
            return None
        value = parent[key]
        if not isinstance(value, dict):
            self.add(at, f"expected a table, got {found(value)}")
            return None
        return value

    def check(self, value: object, at: str, check: Check) -> bool:
        if check.accept(value):
            return True
        self.add(at, f"expected {check.expected}, got {found(value)}")
        return False

    def value(self, table: dict, where: str, key: str, check: Check, default: Any = REQUIRED) -> Any:
        """The checked value, ``default`` when absent, None when wrong or missing though required."""
        at = join_key(where, key)
        if key not in table:
            if default is REQUIRED:
                self.add(at, f"missing required key; expected {check.expected}")
                return None
            return default
        value = table[key]
        return value if self.check(value, at, check) else None

    def array(
        self, table: dict, where: str, key: str, item: Check, default: Any = REQUIRED, *, nonempty: bool = False
    ) -> tuple | None:
        """A list of checked items as a tuple; None when anything about it is wrong."""
        at = join_key(where, key)
        if key not in table:
            if default is REQUIRED:
                self.add(at, f"missing required key; expected an array, each item {item.expected}")
                return None
            return default
        value = table[key]
        if not isinstance(value, list):
            self.add(at, f"expected an array, each item {item.expected}, got {found(value)}")
            return None
        if nonempty and not value:
            self.add(at, f"expected at least one item, each {item.expected}, got an empty array")
            return None
        ok = True
        for i, v in enumerate(value):
            ok = self.check(v, f"{at}[{i}]", item) and ok
        return tuple(value) if ok else None

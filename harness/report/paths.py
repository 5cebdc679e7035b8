"""File names of report pages: derived from scenario names, which come from files and may hold anything.

A page name never leaves the report folder: only ``[A-Za-z0-9_.-]`` survive, no leading dot, no ``..``,
bounded length, and a name that had to change (or that collides with another, ignoring case, as macOS
and Windows file systems do) gets a short hash of the original so that two scenarios never share a page.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_MAX = 80
_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10)), "index"}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def safe_stem(name: str) -> str:
    """A file stem for ``name`` that is safe in any folder: no separator, no ``..``, no leading dot."""
    stem = _UNSAFE.sub("_", name)
    stem = re.sub(r"\.{2,}", "_", stem).strip("._-")[:_MAX].rstrip("._-")
    if stem != name or not stem or stem.lower() in _RESERVED:
        stem = f"{stem or 'scenario'}-{_digest(name)}"
    return stem


def page_names(keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """``(scenario name, scenario path) -> "stem.html"``, one distinct page per key."""
    out: dict[tuple[str, str], str] = {}
    taken: set[str] = set()
    for name, path in keys:
        if (name, path) in out:
            continue
        stem = safe_stem(name)
        if stem.lower() in taken:
            stem = f"{stem}-{_digest(path + chr(0) + name)}"
        taken.add(stem.lower())
        out[(name, path)] = f"{stem}.html"
    return out

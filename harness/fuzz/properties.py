"""Fuzz properties a target package adds: ``python -m harness fuzz --target NAME`` runs the one registered as
NAME (the SGLang target registers ``sglang-differential``, the miniature against the installed SGLang), so the
fuzzer and the command line name no target.

An entry is the import path of a function taking the parsed ``fuzz`` arguments (``--budget``, ``--seed``,
``--out``, ``--database``, ``--no-write``) and returning the exit status.
"""

from __future__ import annotations

from ..imports import Registry

LIBRARY = "library"
"""the fuzzer's own property: one design and mode against the eager reference (``search.fuzz``)"""

FUZZ_PROPERTIES: Registry[str] = Registry()


def register_fuzz_property(name: str, path: str) -> None:
    """Add ``path`` (``package.module:function``) as the property ``--target name`` runs."""
    if name == LIBRARY:
        raise ValueError(f"{name!r} is the fuzzer's own property")
    FUZZ_PROPERTIES[name] = path


__all__ = ["FUZZ_PROPERTIES", "LIBRARY", "register_fuzz_property"]

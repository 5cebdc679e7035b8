"""Fuzz properties a target package adds: ``python -m harness fuzz --target NAME`` runs the one registered as
NAME (the SGLang target registers ``sglang-differential``, the miniature against the installed SGLang), so the
fuzzer and the command line name no target.

An entry is the import path of a function taking the parsed ``fuzz`` arguments (``--budget``, ``--seed``,
``--out``, ``--database``, ``--no-write``, and those of the library target's flags it registered as taking)
and returning the exit status.

A target's serving stack joins the library property the same way (``register_fuzz_stack``): ``--serving NAME``
moves every generated run onto the stack registered as NAME, with what that stack needs of a run (its free
order, its eviction), and drops the runs it cannot express.
"""

from __future__ import annotations

from ..imports import Registry

LIBRARY = "library"
"""the fuzzer's own property: one design and mode against the eager reference (``search.fuzz``)"""

FUZZ_PROPERTIES: Registry[str] = Registry()


PROPERTY_FLAGS: Registry[tuple[str, ...]] = Registry()
"""the library target's flags a property takes too (``--fault``), by property name; it takes none by default"""


def register_fuzz_property(name: str, path: str, *, takes: tuple[str, ...] = ()) -> None:
    """Add ``path`` (``package.module:function``) as the property ``--target name`` runs; ``takes``: which of
    the library target's flags (``--design``, ``--mode``, ``--backend``, ``--fault``, ``--serving``) it reads."""
    if name == LIBRARY:
        raise ValueError(f"{name!r} is the fuzzer's own property")
    FUZZ_PROPERTIES[name] = path
    PROPERTY_FLAGS[name] = tuple(takes)


FUZZ_STACKS: Registry[str] = Registry()
"""serving stacks the library property can run on, by ``[serving] stack`` name -> ``package.module:function``
taking a generated ``RunSpec`` and returning it moved onto the stack, or a string saying why the stack cannot
run it"""


def register_fuzz_stack(name: str, path: str) -> None:
    """Let ``--serving name`` fuzz the library property on the stack ``name``, each run moved by ``path``."""
    FUZZ_STACKS[name] = path


__all__ = ["FUZZ_PROPERTIES", "FUZZ_STACKS", "LIBRARY", "PROPERTY_FLAGS", "register_fuzz_property",
           "register_fuzz_stack"]

"""Named extension points: a registered short name, or ``package.module:attr`` for code outside the harness.

Designs, backends, serving stacks, eviction policies and runners are all found this way, so a third-party
one is named on the command line or in a scenario exactly like a built-in one. A target package adds its
own stacks and faults to the registries through the ``harness.targets`` entry-point group (``Registry``). Importing the module is no
safer than importing it yourself; a module that raises or exits at import is reported as a bad name.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.metadata
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import TypeVar

V = TypeVar("V")

TARGET_GROUP = "harness.targets"
"""the entry-point group a target package (the installed SGLang's adapter, ``harness/sglang``) registers in:
each entry names a function of no arguments that registers the target's stacks, faults and patches through
``serving.registry.register_stack`` and ``serving.faults.register_faults``"""

_targets_loaded = False


def load_targets() -> None:
    """Call every registered target's registration function, once per process, at a registry's first use.

    Registering imports only the target's declarations (names and import paths), never what they name, so
    loading a scenario still imports no optional install. A target that fails to register is a warning
    naming it; the harness's own entries stand.
    """
    global _targets_loaded
    if _targets_loaded:
        return
    _targets_loaded = True  # first: a target's registration itself goes through the registries
    for entry in sorted(importlib.metadata.entry_points(group=TARGET_GROUP), key=lambda e: e.name):
        try:
            entry.load()()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - one broken target must not stop the harness
            warnings.warn(f"target {entry.name!r} ({entry.value}) cannot register: {type(exc).__name__}: "
                          f"{' '.join(str(exc).split())}", stacklevel=2)


class Registry(MutableMapping[str, V]):
    """A registry table (name -> entry) that target packages add to: the targets register at its first use
    (``load_targets``), so a table reads the same whether or not any target has been imported yet."""

    def __init__(self, entries: Mapping[str, V] | Iterable[tuple[str, V]] = ()) -> None:
        self._entries: dict[str, V] = dict(entries)

    def _all(self) -> dict[str, V]:
        load_targets()
        return self._entries

    def __getitem__(self, name: str) -> V:
        return self._all()[name]

    def __setitem__(self, name: str, entry: V) -> None:
        self._all()[name] = entry

    def __delitem__(self, name: str) -> None:
        del self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __repr__(self) -> str:
        return f"Registry({self._all()!r})"


def is_import_path(name: str) -> bool:
    """``package.module:attr``, as opposed to a registered short name: the one way a scenario, the command
    line or a plugin option names code outside the harness."""
    module, sep, attr = name.partition(":")
    return bool(sep) and all(p.isidentifier() for p in module.split(".")) and attr.isidentifier()


def unknown_name(kind: str, name: str, known: Iterable[str], *, also: str = "") -> str:
    """``unknown design 'stale_stat' (did you mean 'stale_state'?); known designs: translate, ...``;
    ``also`` is what else is accepted (``an import path 'package.module:function'``)."""
    known = [str(k) for k in known]  # plain values: an enum's members would show as their reprs
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown {kind} {name!r}{hint}; known {kind}s: {', '.join(known)}" + (f", or {also}" if also else "")


def name_type(kind: str, known: Iterable[str]) -> Callable[[str], str]:
    """An argparse ``type`` that takes one of ``known`` and refuses anything else with ``unknown_name``'s
    message (argparse's own ``choices`` error shows enum reprs and guesses nothing)."""
    known = tuple(map(str, known))

    def check(text: str) -> str:
        if text not in known:
            raise argparse.ArgumentTypeError(unknown_name(kind, text, known))
        return text

    check.__name__ = kind  # argparse names the type in some of its messages
    return check


def load_named(name: str, table: Mapping[str, str], *, kind: str, check: Callable[[object], str | None]) -> object:
    """The object ``name`` designates: ``table[name]`` (itself an import path) or ``name`` as an import path.

    ``check`` returns why a loaded object is not a ``kind`` (None when it is). Every failure is a KeyError
    whose message names the kind, the name and what would be accepted.
    """
    path = table.get(name, name)
    if not is_import_path(path):
        raise KeyError(unknown_name(kind, name, table, also="an import path 'package.module:attr'"))
    module_name, _, attr = path.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a module that exits or raises at import is a bad name, not a crash
        raise KeyError(f"{kind} {name!r} cannot be imported: {type(exc).__name__}: {exc}") from None
    if (why := check(obj)) is not None:
        raise KeyError(f"{kind} {name!r} {why}")
    return obj


def subclass_of(base: type) -> Callable[[object], str | None]:
    """A ``check`` for ``load_named``: the object must be a subclass of ``base``."""
    def check(obj: object) -> str | None:
        article = "an" if base.__name__[:1].lower() in "aeiou" else "a"
        return None if isinstance(obj, type) and issubclass(obj, base) else f"is not {article} {base.__name__} subclass"
    return check

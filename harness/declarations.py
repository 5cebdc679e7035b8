"""Declarations of code named by import path, checked as the scenario loader checks a file.

A design, backend, runner, serving stack or eviction policy of a third party declares what it is (class
attributes, a ``Design`` record) and keeps a contract in its hooks (a backend's ``unsupported()`` returns
reasons, a stack's ``kv_groups`` returns KV groups, a policy's ``frontier`` an int). That is input like a
scenario file: a wrong one is one line naming the class, the declaration and what was expected
(``backend pkg.mod:Class.devices: expected a non-empty set of 'cpu'/'cuda', got ()``), and the runs of that
plug-in become error verdicts while every other run goes on. Each registry checks its own kind's
declarations with these primitives when it loads one (``backends/registry.py``, ``serving/registry.py``,
``runners/registry.py``, ``serving/designs.py``); nothing here imports what it checks.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import TypeVar

T = TypeVar("T")

SHOWN_LIMIT = 80
"""characters of a wrong value a message shows"""


class DeclarationError(KeyError):
    """A plug-in's declaration that does not keep its contract, or a plug-in that does not load: one line.

    A KeyError, as every failure to load a named extension point is (``imports.load_named``), so each
    caller that already says "this name does not load" says this too."""

    def __str__(self) -> str:  # KeyError's own quotes the message
        return str(self.args[0]) if self.args else ""


def owner(cls: object) -> str:
    """``package.module:Class``: how a message names the class whose declaration is wrong."""
    module = getattr(cls, "__module__", None) or "?"
    return f"{module}:{getattr(cls, '__qualname__', None) or getattr(cls, '__name__', repr(cls))}"


def shown(value: object) -> str:
    """A wrong value in one short line."""
    text = " ".join(repr(value).split())
    return text if len(text) <= SHOWN_LIMIT else text[:SHOWN_LIMIT - 3] + "..."


def one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}".rstrip(": ")


def expected(kind: str, where: str, what: str, got: object) -> DeclarationError:
    """``{kind} {where}: expected {what}, got {got}``: the one line of a declaration with a wrong value."""
    return DeclarationError(f"{kind} {where}: expected {what}, got {shown(got)}")


def is_collection(value: object) -> bool:
    """A set, tuple or list (a string is one value, not a collection of them)."""
    return isinstance(value, Collection) and not isinstance(value, (str, bytes))


def values_of(kind: str, where: str, value: object, allowed: Iterable[str], *, empty: bool = False) -> None:
    """``value`` is a collection of values among ``allowed`` (at least one unless ``empty``)."""
    allowed = tuple(map(str, allowed))
    what = f"{'a' if empty else 'a non-empty'} set of {'/'.join(map(repr, allowed))}"
    if not is_collection(value) or (not value and not empty):
        raise expected(kind, where, what, value)
    if bad := [v for v in value if not isinstance(v, str) or v not in allowed]:  # type: ignore[union-attr]
        raise expected(kind, where, what, bad[0])


def is_int(value: object) -> bool:
    """An int that is not a bool (True is an int to Python, never a count to a declaration)."""
    return isinstance(value, int) and not isinstance(value, bool)


def call_hook(kind: str, where: str, hook: Callable[..., object], *args: object, returns: str,
              valid: Callable[[object], bool], **kwargs: object) -> object:
    """Call a plug-in's hook; what it returns must be ``valid`` (``returns`` says what that is). A hook that
    raises breaks the contract as much as one that returns the wrong thing: both are one line naming it."""
    try:
        got = hook(*args, **kwargs)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - a third party's hook: whatever it raises is its declaration's fault
        raise DeclarationError(f"{kind} {where}: expected {returns}, raised {one_line(exc)}") from None
    if not valid(got):
        raise expected(kind, where, returns, got)
    return got


def tuple_of(item: type | tuple[type, ...]) -> Callable[[object], bool]:
    """A ``valid`` for ``call_hook``: a tuple whose every element is an ``item``."""
    return lambda got: isinstance(got, tuple) and all(isinstance(x, item) for x in got)

"""Input audit: name every tensor a graph reads and notice when its attribute is rebound.

A graph binds tensors by identity.  If the program later rebinds an attribute
(``pool.loc = torch.empty(...)``) the graph keeps reading the old tensor; nothing
fails, the numbers are just wrong.  At capture end we walk the caller's ``roots``
to map each graph input to the attribute path that held it, and compile that path
into a getter chain.  Replay re-resolves the chains (a handful of C-level
``attrgetter``/``itemgetter`` calls) and reports paths that now hold another object.
"""

from __future__ import annotations

import dataclasses
import enum
import types
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from operator import attrgetter, itemgetter
from typing import Any

import torch

from ._record import storage_key
from .engine import GraphInput, InputAudit, StaleInput

_MAX_DEPTH = 6
_MAX_ITEMS = 10_000  # per container; a list of a million ints is not worth walking
_MAX_OBJECTS = 200_000  # per walk, so a root that reaches a huge object graph stays cheap
_OWN_PACKAGE = __name__.rpartition(".")[0]

_LEAVES = (
    str, bytes, bytearray, int, float, complex, bool, type(None), range, slice,
    enum.Enum, torch.dtype, torch.device, torch.Size, torch.layout, torch.memory_format,
)
_SKIPPED = (
    types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
    types.BuiltinMethodType, type, property, staticmethod, classmethod,
)

Step = tuple[str, Any]  # ("attr", name) | ("item", key)
_ViewKey = tuple[Any, ...]


def describe(obj: object) -> str:
    if obj is None:
        return "None"
    if isinstance(obj, torch.Tensor):
        # no address: reports of two runs of the same inputs must be equal
        return f"{_dtype_name(obj.dtype)}{list(obj.shape)}"
    return type(obj).__name__


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _view_key(t: torch.Tensor) -> _ViewKey | None:
    key = storage_key(t)
    if key is None:
        return None
    return (key, t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def _slot_names(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        if isinstance(slots, str):
            slots = (slots,)
        names.extend(s for s in slots if s not in ("__dict__", "__weakref__"))
    return names


def _children(obj: object) -> Iterable[tuple[Step, object]]:
    if isinstance(obj, dict):
        for i, (k, v) in enumerate(obj.items()):
            if i >= _MAX_ITEMS:
                break
            if isinstance(k, str):
                yield ("item", k), v
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj[:_MAX_ITEMS]):
            yield ("item", i), v
        return
    seen: set[str] = set()
    if isinstance(obj, torch.nn.Module):
        # Registered tensors live in private dicts; module.__getattr__ reaches them by name.
        for store in ("_parameters", "_buffers", "_modules"):
            for k, v in getattr(obj, store, {}).items():
                if k not in seen:
                    seen.add(k)
                    yield ("attr", k), v
        seen.update(("_parameters", "_buffers", "_modules"))
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            if f.name not in seen and hasattr(obj, f.name):
                seen.add(f.name)
                yield ("attr", f.name), getattr(obj, f.name)
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict):
        for k, v in list(attrs.items())[:_MAX_ITEMS]:
            if isinstance(k, str) and k not in seen:
                seen.add(k)
                yield ("attr", k), v
    for name in _slot_names(type(obj)):
        if name not in seen and hasattr(obj, name):
            seen.add(name)
            yield ("attr", name), getattr(obj, name)


def _path_text(root: str, steps: tuple[Step, ...]) -> str:
    parts = [root]
    for kind, key in steps:
        parts.append(f".{key}" if kind == "attr" else f"[{key}]")
    return "".join(parts)


def _getters(steps: tuple[Step, ...]) -> tuple[Callable[[Any], Any], ...]:
    """Compile a path; consecutive attribute steps fold into one ``attrgetter``."""
    getters: list[Callable[[Any], Any]] = []
    attrs: list[str] = []
    for kind, key in steps:
        if kind == "attr" and "." not in key:
            attrs.append(key)
            continue
        if attrs:
            getters.append(attrgetter(".".join(attrs)))
            attrs = []
        getters.append(itemgetter(key) if kind == "item" else (lambda o, _k=key: getattr(o, _k)))
    if attrs:
        getters.append(attrgetter(".".join(attrs)))
    return tuple(getters)


class _Found:
    __slots__ = ("root", "steps", "held")

    def __init__(self, root: object, steps: tuple[Step, ...], held: torch.Tensor) -> None:
        self.root, self.steps, self.held = root, steps, held


def _walk(roots: Mapping[str, object]) -> tuple[dict[int, tuple[str, _Found]], dict[_ViewKey, tuple[str, _Found]]]:
    """Breadth-first, so each tensor gets its shortest path; the first root wins ties."""
    by_id: dict[int, tuple[str, _Found]] = {}
    by_view: dict[_ViewKey, tuple[str, _Found]] = {}
    visited: set[int] = set()
    queue: deque[tuple[str, object, tuple[Step, ...], object]] = deque(
        (name, root, (), root) for name, root in roots.items()
    )
    while queue:
        name, root, steps, obj = queue.popleft()
        if isinstance(obj, torch.Tensor):
            if id(obj) not in by_id:
                found = (_path_text(name, steps), _Found(root, steps, obj))
                by_id[id(obj)] = found
                vk = _view_key(obj)
                if vk is not None:
                    by_view.setdefault(vk, found)
            continue
        if isinstance(obj, _LEAVES) or isinstance(obj, _SKIPPED) or id(obj) in visited:
            continue
        if len(steps) >= _MAX_DEPTH or len(visited) >= _MAX_OBJECTS:
            continue
        if type(obj).__module__.startswith(_OWN_PACKAGE + "."):
            # A runner holding its captured graphs must not lead the walk into their tapes.
            continue
        visited.add(id(obj))
        try:
            children = list(_children(obj))
        except Exception:  # objects with hostile __getattr__/__slots__ are just not walked
            continue
        for step, child in children:
            queue.append((name, root, steps + (step,), child))
    return by_id, by_view


_MISSING = object()


class StaleWatch:
    """Precomputed getter chains; ``check()`` is what replay calls."""

    __slots__ = ("_watch",)

    def __init__(self, watch: tuple[tuple[object, tuple[Callable[[Any], Any], ...], torch.Tensor, str, str], ...]) -> None:
        self._watch = watch

    def check(self) -> tuple[StaleInput, ...]:
        stale: list[StaleInput] | None = None
        for root, getters, held, path, captured in self._watch:
            obj: Any = root
            try:
                for get in getters:
                    obj = get(obj)
            except (AttributeError, LookupError, TypeError):
                obj = _MISSING
            if obj is not held:
                if stale is None:
                    stale = []
                now = "<missing>" if obj is _MISSING else describe(obj)
                stale.append(StaleInput(path=path, captured=captured, now=now))
        return tuple(stale) if stale else ()


def build_audit(
    inputs: Iterable[torch.Tensor],
    roots: Mapping[str, object],
    static_inputs: Iterable[torch.Tensor],
) -> tuple[InputAudit, StaleWatch]:
    static = list(static_inputs)
    static_ids = {id(t) for t in static}
    static_keys = {k for k in (storage_key(t) for t in static) if k is not None}
    by_id, by_view = _walk(roots)
    entries: list[GraphInput] = []
    watch = []
    for t in inputs:
        found = by_id.get(id(t))
        if found is None:
            vk = _view_key(t)
            found = by_view.get(vk) if vk is not None else None
        key = storage_key(t)
        registered = id(t) in static_ids or (key is not None and key in static_keys)
        path = found[0] if found is not None else None
        entries.append(GraphInput(path=path, shape=tuple(t.shape), dtype=_dtype_name(t.dtype), registered=registered))
        if found is not None:
            f = found[1]
            watch.append((f.root, _getters(f.steps), f.held, path, describe(t)))
    return InputAudit(inputs=tuple(entries)), StaleWatch(tuple(watch))

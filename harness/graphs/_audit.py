"""Input audit: name every tensor a graph reads, and notice at replay what moved under it.

A graph binds memory.  Two things make it read other data than the program
believes it reads.  The program rebinds an attribute (``pool.loc =
torch.empty(...)``): the graph keeps reading the tensor it captured.  Or the
program re-points the captured tensor itself (``t.data = ...``, ``t.set_(...)``,
``t.resize_(...)``, ``t.t_()``): the graph keeps reading the old storage with the
old layout.  Nothing fails either way; the numbers are just wrong.

At capture end we walk the caller's ``roots`` (attributes, ``__slots__``,
dataclass fields, module parameters/buffers/submodules, lists, tuples, and dicts,
whose string, integer and tuple keys are written as they read back
(``pool._cache[(4, 'decode')]``) and any other key by its type and place
(``pool._cache[<ForwardBatch #3>]``); a Python module given as a root, by
``module_roots``, is walked through its globals after every object root) to map
each graph input to the attribute path that held it (``pool.swa_loc``,
``my_backend.impl._cache``).  A view of a held tensor is named by its base's path plus the slice
that makes it (``runner.out_cache_loc_swa[:4]``), and the base is what is
watched.  Paths and inputs are compiled into a generated, unrolled probe that
re-resolves every path with plain attribute and item access (module attributes
straight from ``_parameters``/``_buffers``/``_modules``, never through
``Module.__getattr__``) and reads each watched tensor's version counter and data
pointer: a few microseconds before each replay.  Only when something differs
from the previous replay is a report built (``StaleInput``):

* ``kind="rebound"``: the attribute holds another object now.  It is ``benign``
  when the tensor the graph captured was still written in place since the
  previous replay began (its version counter moved, which every in-place write
  through it or any view of it does, while a graph's own kernels move none): the
  program refreshes the graph's buffer and only keeps another tensor under the
  name.  Otherwise it is a finding: nothing
  refreshes what the graph reads.
* ``kind="memory"``: the captured tensor's storage, storage offset or strides
  differ from capture (``changed`` says which, sizes included).  Sizes alone
  are no finding: a tensor trimmed or grown with ``resize_`` inside its
  storage's capacity keeps its memory, and the graph reads the rows it captured.

A re-pointing that changes neither the data pointer nor the version counter
(``t.data = t.t()``: same address, new strides, and ``.data`` assignment bumps no
version) goes unseen; every other re-pointing moves one of the two.
"""

from __future__ import annotations

import dataclasses
import enum
import keyword
import types
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from operator import attrgetter, itemgetter
from typing import Any, Union

import torch

from ..fields import field_names
from ._ops import storage_key
from .engine import GraphInput, InputAudit, StaleInput

_MAX_DEPTH = 6
_COMPILE_AFTER = 8
"""checks a watch runs from lists before its probe is compiled (the tape's ``COMPILE_AFTER``)"""
_MAX_ITEMS = 10_000  # per container; a list of a million ints is not worth walking
_MAX_OBJECTS = 200_000  # per walk, so a root that reaches a huge object graph stays cheap
_OWN_PACKAGE = __name__.rpartition(".")[0]

_LEAVES = (
    str, bytes, bytearray, int, float, complex, bool, type(None), range, slice,
    enum.Enum, torch.dtype, torch.device, torch.Size, torch.layout, torch.memory_format,
)
_SCALARS = frozenset({str, int, float, bool, type(None)})
"""the leaves most containers hold, by exact type (a subclass still goes through ``_LEAVES``)"""
_SKIPPED = (
    types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
    types.BuiltinMethodType, type, property, staticmethod, classmethod,
)
_MODULE_STORES = {"param": "_parameters", "buffer": "_buffers", "module": "_modules"}

Step = tuple[str, Any]  # ("attr" | "param" | "buffer" | "module", name) | ("item", key) | ("key", (label, key))
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


_SLOT_NAMES: dict[type, tuple[str, ...]] = {}


def _slot_names(cls: type) -> tuple[str, ...]:
    found = _SLOT_NAMES.get(cls)
    if found is None:  # once per class: every capture walks the same few classes' objects
        names: list[str] = []
        for klass in cls.__mro__:
            slots = klass.__dict__.get("__slots__", ())
            if isinstance(slots, str):
                slots = (slots,)
            names.extend(s for s in slots if s not in ("__dict__", "__weakref__"))
        found = _SLOT_NAMES[cls] = tuple(names)
    return found


def _children(obj: object) -> Iterable[tuple[Step, object]]:
    if isinstance(obj, types.ModuleType):  # a module root: its globals, not its import machinery
        for k, v in list(vars(obj).items())[:_MAX_ITEMS]:
            if not (k.startswith("__") and k.endswith("__")):
                yield ("attr", k), v
        return
    if isinstance(obj, dict):
        for i, (k, v) in enumerate(obj.items()):
            if i >= _MAX_ITEMS:
                break
            if type(v) in _SCALARS:
                continue  # nothing below a scalar
            if isinstance(k, (str, int)) or _literal(k):  # written back by its repr (``[(4, 'decode')]``)
                yield ("item", k), v
            else:  # an object key: shown by its type and place, looked up by the object itself
                yield ("key", (f"<{type(k).__name__} #{i}>", k)), v
        return
    if isinstance(obj, (list, tuple)):
        # a free list holds thousands of ints: dropped here, by exact type, they cost no queue entry each
        for i, v in enumerate(obj[:_MAX_ITEMS]):
            if type(v) not in _SCALARS:
                yield ("item", i), v
        return
    seen: set[str] = set()
    if isinstance(obj, torch.nn.Module):
        # Registered tensors live in private dicts; module.__getattr__ reaches them by name.
        for kind, store in _MODULE_STORES.items():
            for k, v in getattr(obj, store, {}).items():
                if k not in seen:
                    seen.add(k)
                    yield (kind, k), v
        seen.update(_MODULE_STORES.values())
    for name in field_names(type(obj)) or ():
        if name not in seen and hasattr(obj, name):
            seen.add(name)
            yield ("attr", name), getattr(obj, name)
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


def _literal(key: object) -> bool:
    """A tuple key whose repr reads back as an equal tuple (of str, int, bool, None and such tuples)."""
    return isinstance(key, tuple) and all(
        isinstance(k, (str, int)) or k is None or _literal(k) for k in key)


def _path_text(root: str, steps: tuple[Step, ...]) -> str:
    parts = [root]
    for kind, key in steps:
        parts.append(f"[{key!r}]" if kind == "item" and isinstance(key, tuple) else f"[{key}]" if kind == "item"
                     else f"[{key[0]}]" if kind == "key" else f".{key}")
    return "".join(parts)


def _getter(step: Step) -> Callable[[Any], Any]:
    kind, key = step
    if kind == "item":
        return itemgetter(key)
    if kind == "key":
        return itemgetter(key[1])
    if kind in _MODULE_STORES:
        store = attrgetter(_MODULE_STORES[kind])
        return lambda o: store(o)[key]
    return lambda o: getattr(o, key)


class _Found:
    __slots__ = ("root", "steps", "held")

    def __init__(self, root: object, steps: tuple[Step, ...], held: torch.Tensor) -> None:
        self.root, self.steps, self.held = root, steps, held


_Index = dict[Any, list[tuple[str, _Found]]]


def _walk(roots: Mapping[str, object]) -> tuple[dict[int, tuple[str, _Found]], dict[_ViewKey, tuple[str, _Found]], _Index]:
    """Breadth-first, so each tensor gets its shortest path; the first root wins ties.

    Object roots are walked first, module roots (``module_roots``: their globals) after them, so a
    tensor an object holds keeps the object's name however near a module global it is.
    """
    by_id: dict[int, tuple[str, _Found]] = {}
    by_view: dict[_ViewKey, tuple[str, _Found]] = {}
    by_storage: _Index = {}
    visited: set[int] = set()
    objects = [(name, root) for name, root in roots.items() if not isinstance(root, types.ModuleType)]
    modules = [(name, root) for name, root in roots.items() if isinstance(root, types.ModuleType)]
    for group in (objects, modules):
        _walk_from(group, by_id, by_view, by_storage, visited)
    return by_id, by_view, by_storage


def _walk_from(roots: list[tuple[str, object]], by_id: dict[int, tuple[str, _Found]],
               by_view: dict[_ViewKey, tuple[str, _Found]], by_storage: _Index, visited: set[int]) -> None:
    queue: deque[tuple[str, object, tuple[Step, ...], object]] = deque(
        (name, root, (), root) for name, root in roots
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
                    by_storage.setdefault(vk[0], []).append(found)
            continue
        if isinstance(obj, _LEAVES) or (isinstance(obj, _SKIPPED) and steps) or id(obj) in visited:
            continue  # a module is walked only as a root: its globals
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
            # an attribute holding a plain number or string leads nowhere: skipped here, by exact type, it
            # costs no queue entry (it would be dropped as a leaf when taken off the queue)
            if type(child) not in _SCALARS:
                queue.append((name, root, steps + (step,), child))


# ---------------------------------------------------------------- naming a view by its base


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """[first, last] element offsets ``t`` covers in its storage."""
    lo = hi = t.storage_offset()
    for size, stride in zip(t.shape, t.stride()):
        if size == 0:
            return (lo, lo - 1)
        span = (size - 1) * stride
        lo, hi = (lo + span, hi) if span < 0 else (lo, hi + span)
    return lo, hi


def _slices(base: torch.Tensor, t: torch.Tensor) -> str | None:
    """``[...]`` making ``t`` from ``base`` by basic indexing, if there is one."""
    bsz, bst = tuple(base.shape), base.stride()
    tsz, tst = tuple(t.shape), t.stride()
    rel = t.storage_offset() - base.storage_offset()
    if rel < 0:
        return None
    starts = [0] * len(bsz)
    for k in sorted(range(len(bsz)), key=lambda k: -bst[k]):
        if bst[k] > 0 and bsz[k] > 1:
            starts[k] = min(rel // bst[k], bsz[k] - 1)
            rel -= starts[k] * bst[k]
    if rel != 0:
        return None
    parts: list[str] = []
    sizes: list[int] = []
    strides: list[int] = []
    j = 0
    for k, (size, stride, start) in enumerate(zip(bsz, bst, starts)):
        step = tst[j] // stride if j < len(tsz) and stride > 0 and tst[j] % stride == 0 else 0
        if j < len(tsz) and tsz[j] == 1 and step < 1:
            step = 1
        if j < len(tsz) and step >= 1 and start + (tsz[j] - 1) * step < size:
            stop = start + (tsz[j] - 1) * step + 1
            to_end = -(-(size - start) // step) == tsz[j]  # the slice runs to the end of the dim
            text = f"{start or ''}:{'' if to_end else stop}" + (f":{step}" if step != 1 else "")
            parts.append(text)
            sizes.append(tsz[j])
            strides.append(stride * step)
            j += 1
        else:
            parts.append(str(start))
    if j != len(tsz) or tuple(sizes) != tsz or any(s != ts for s, ts, n in zip(strides, tst, tsz) if n > 1):
        return None
    while parts and parts[-1] == ":":
        parts.pop()
    return f"[{', '.join(parts)}]" if parts else None


def _index_text(base: torch.Tensor, t: torch.Tensor) -> str:
    if base.dtype == t.dtype and (t.shape, t.stride(), t.storage_offset()) == (
            base.shape, base.stride(), base.storage_offset()):
        return "[:]"  # a view of all of it
    if base.dtype == t.dtype:
        found = _slices(base, t)
        if found is not None:
            return found
        return f".as_strided({list(t.shape)}, {t.stride()}, {t.storage_offset()})"
    return f".view({t.dtype}).as_strided({list(t.shape)}, {t.stride()}, {t.storage_offset()})"


def _base_of(candidates: list[tuple[str, _Found]], t: torch.Tensor) -> tuple[str, _Found] | None:
    lo, hi = _extent(t)
    size = t.element_size()
    for path, found in candidates:
        b = found.held
        blo, bhi = _extent(b)
        es = b.element_size()
        if blo * es <= lo * size and (hi + 1) * size <= (bhi + 1) * es:
            return path, found
    return candidates[0] if candidates else None


# ---------------------------------------------------------------- the watch


class _Held:
    """A root that takes no weak reference (a dict, a class with ``__slots__``): held, as the program holds it."""

    __slots__ = ("obj",)

    def __init__(self, obj: object) -> None:
        self.obj = obj

    def __call__(self) -> object:
        return self.obj


_RootRef = Union["weakref.ref[Any]", _Held]


def _root_ref(root: object) -> _RootRef:
    """How the watch reaches a root: weakly where it can.

    The program holds its graphs (a runner's ``graphs``) and the graph's watch holds the roots it resolves
    paths from (the runner): a strong reference would tie the two into a cycle that only the cyclic
    collector frees, and with them everything the graph holds. A CUDA graph keeps no Python object alive
    either. A root the program dropped is one it can no longer rebind anything under: its paths report
    nothing.
    """
    try:
        return weakref.ref(root)
    except TypeError:
        return _Held(root)


def _compile_watch(
    leaves: list[tuple[_RootRef, tuple[Step, ...], torch.Tensor]],
    tensors: list[torch.Tensor],
    layouts: list[_Layout],
    tracked: list[bool],
    versions: list[int],
    ptrs: list[int],
) -> Callable[[], tuple[tuple[int, ...] | list[int] | None, list[int], list[int]] | None]:
    """One generated, unrolled function (no loop per replay) that checks everything replay needs.

    It returns None when every path still reaches the tensor it held and no watched tensor's
    version counter or data pointer moved since the previous call.  Otherwise it returns
    (stale leaves, refreshed tensors, moved tensors): the leaves whose path no longer
    reaches the tensor it held at capture (``()`` when none, None when resolving a path raised,
    an attribute gone, and the caller resolves every path the slow way); the watched tensors
    whose version counter moved since the previous call (it updates ``versions``, read by
    reference, in place); the tensors whose data pointer, size or stride may differ from capture.
    """
    names: dict[str, Any] = {"V": versions}
    roots: list[str] = []
    walk: list[str] = []
    nodes: dict[tuple[int, tuple[Step, ...]], str] = {}
    ends: list[str] = []
    for n, (root, steps, held) in enumerate(leaves):
        var = nodes.get((id(root), ()))
        if var is None:
            var = f"r{len(names)}"
            names[f"{var}w"] = root
            roots.append(f"        {var} = {var}w()")
            nodes[(id(root), ())] = var
        for depth in range(1, len(steps) + 1):
            prefix = steps[:depth]
            child = nodes.get((id(root), prefix))
            if child is None:
                child = f"v{len(nodes)}"
                kind, key = prefix[-1]
                if kind == "item":
                    expr = f"{var}[{key!r}]"
                elif kind == "key":  # the key object itself, from the probe's scope
                    names[f"k{len(nodes)}"] = key[1]
                    expr = f"{var}[k{len(nodes)}]"
                elif kind in _MODULE_STORES:
                    expr = f"{var}.{_MODULE_STORES[kind]}[{key!r}]"
                elif key.isidentifier() and not keyword.iskeyword(key) and not key.startswith("__"):
                    expr = f"{var}.{key}"
                else:
                    expr = f"getattr({var}, {key!r})"
                walk.append(f"        {child} = {expr}")
                nodes[(id(root), prefix)] = child
            var = child
        names[f"h{n}"] = held
        ends.append(var)
    watch: list[str] = []
    for k, (t, was, ok) in enumerate(zip(tensors, layouts, tracked)):
        names[f"t{k}"], names[f"p{k}"], names[f"s{k}"], names[f"d{k}"] = t, ptrs[k], was.size, was.stride
        if not ok:  # no version counter (an inference tensor): compared in full every time
            watch.append(f"    moved.append({k})")
            continue
        watch += [
            f"    v = t{k}._version",
            f"    if v != V[{k}]:",
            f"        V[{k}] = v",
            f"        refreshed.append({k})",
            f"        if t{k}.shape != s{k} or t{k}.stride() != d{k}: moved.append({k})",
            f"    if t{k}.data_ptr() != p{k}: moved.append({k})",
        ]
    same = " and ".join(f"{var} is h{n}" for n, var in enumerate(ends)) or "True"
    unchanged = " and ".join(
        f"t{k}._version == V[{k}] and t{k}.data_ptr() == p{k}" if ok else "False" for k, ok in enumerate(tracked)
    ) or "True"
    lines = [
        "def probe():", "    stale = ()", "    try:", "        pass", *roots, *walk, "    except Exception:", "        stale = None",
        "    else:", f"        if {same}:",
        f"            if {unchanged}:", "                return None",  # the fast path: nothing moved
        "        else:", "            stale = []",
        *(f"            if {var} is not h{n}: stale.append({n})" for n, var in enumerate(ends)),
        "    refreshed = []", "    moved = []", *watch, "    return stale, refreshed, moved",
    ]
    source = "\n".join(lines)
    code = _CODE.get(source)
    if code is None:  # graphs of one runner share their paths: compile each shape once
        code = _CODE[source] = compile(source, "<graph input watch>", "exec")
    scope: dict[str, Any] = dict(names)
    exec(code, scope)  # noqa: S102 - generated from walked attribute names, keys via repr
    return scope.pop("probe")  # not left in its own globals: a cycle only the cyclic collector frees


_CODE: dict[str, Any] = {}


def _walk_plan(leaves: list[tuple[_RootRef, tuple[Step, ...], torch.Tensor]]
               ) -> tuple[list[tuple[int, _RootRef]], int, list[tuple[int, int, Callable[[Any], Any]]], list[int]]:
    """``_compile_watch``'s walk as data: each root's slot and reference, the number of slots, then per path
    node (in the generated function's order, each prefix once) its slot, its parent's slot and its getter; and
    the slot each leaf ends at."""
    roots: list[tuple[int, _RootRef]] = []
    nodes: dict[tuple[int, tuple[Step, ...]], int] = {}  # each node's slot: the order it was met in
    walk: list[tuple[int, int, Callable[[Any], Any]]] = []
    ends: list[int] = []
    for root, steps, _ in leaves:
        at = nodes.get((id(root), ()))
        if at is None:
            at = nodes[(id(root), ())] = len(nodes)
            roots.append((at, root))
        for depth in range(1, len(steps) + 1):
            prefix = steps[:depth]
            child = nodes.get((id(root), prefix))
            if child is None:
                child = nodes[(id(root), prefix)] = len(nodes)
                walk.append((child, at, _getter(prefix[-1])))
            at = child
        ends.append(at)
    return roots, len(nodes), walk, ends


def _listed_watch(
    leaves: list[tuple[_RootRef, tuple[Step, ...], torch.Tensor]],
    tensors: list[torch.Tensor],
    layouts: list[_Layout],
    tracked: list[bool],
    versions: list[int],
    ptrs: list[int],
) -> Callable[[], tuple[tuple[int, ...] | list[int] | None, list[int], list[int]] | None]:
    """``_compile_watch``'s probe as loops over lists: the same reads in the same order and the same answers,
    without the cost of compiling its source (``StaleWatch`` uses it for a graph's first replays)."""
    roots, slots, walk, ends = _walk_plan(leaves)
    held = [h for _, _, h in leaves]
    checks = list(zip(range(len(tensors)), tensors, layouts, tracked, ptrs))

    def probe() -> tuple[tuple[int, ...] | list[int] | None, list[int], list[int]] | None:
        stale: tuple[int, ...] | list[int] | None = ()
        now: list[Any] = [None] * slots
        for at, ref in roots:
            now[at] = ref()
        try:
            for child, parent, get in walk:
                now[child] = get(now[parent])
        except Exception:  # noqa: BLE001 - as the generated probe: every path is resolved again the slow way
            stale = None
        else:
            if all(now[e] is h for e, h in zip(ends, held)):
                if all(ok and t._version == versions[k] and t.data_ptr() == p for k, t, _, ok, p in checks):
                    return None
            else:
                stale = [n for n, (e, h) in enumerate(zip(ends, held)) if now[e] is not h]
        refreshed: list[int] = []
        moved: list[int] = []
        for k, t, was, ok, p in checks:
            if not ok:
                moved.append(k)
                continue
            v = t._version
            if v != versions[k]:
                versions[k] = v
                refreshed.append(k)
                if t.shape != was.size or t.stride() != was.stride:
                    moved.append(k)
            if t.data_ptr() != p:
                moved.append(k)
        return stale, refreshed, moved

    return probe


_MISSING = object()


@dataclasses.dataclass(slots=True)
class _Leaf:
    path: str  # the input's path (the base's path plus the slice for a view)
    root: _RootRef  # the object the path starts from (``_root_ref``)
    steps: tuple[Step, ...]
    getters: tuple[Callable[[Any], Any], ...]
    held: torch.Tensor  # what the path held at capture
    captured: str
    watched: int  # index of ``held`` among the watched tensors


@dataclasses.dataclass(slots=True)
class _Layout:
    path: str
    key: int | None
    storage_ptr: int
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def _layout(path: str, t: torch.Tensor) -> _Layout:
    return _Layout(path, storage_key(t), t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())


def _same_memory(was: _Layout, now: _Layout) -> bool:
    """Whether each element index both layouts hold lands on the same address (sizes may differ).

    A tensor trimmed or grown with ``resize_`` inside its storage's capacity keeps its storage,
    offset and strides: the program's rows are the graph's rows, only fewer or more of them.
    """
    return (was.key == now.key and was.storage_ptr == now.storage_ptr and was.offset == now.offset
            and len(was.size) == len(now.size)
            and all(a == b for a, b, m, n in zip(was.stride, now.stride, was.size, now.size) if m > 1 and n > 1))


def _changes(was: _Layout, now: _Layout) -> str:
    if _same_memory(was, now):
        return ""
    found = []
    if was.key != now.key:
        found.append(f"storage {was.storage_ptr:#x} -> {now.storage_ptr:#x} (another storage)")
    elif was.storage_ptr != now.storage_ptr:
        found.append(f"storage {was.storage_ptr:#x} -> {now.storage_ptr:#x} (reallocated)")
    if was.offset != now.offset:
        found.append(f"storage offset {was.offset} -> {now.offset}")
    if was.size != now.size:
        found.append(f"size {list(was.size)} -> {list(now.size)}")
    if was.stride != now.stride:
        found.append(f"stride {was.stride} -> {now.stride}")
    return "; ".join(found)


class StaleWatch:
    """What replay checks, before running the graph."""

    __slots__ = ("_leaves", "_probe", "_tensors", "_layouts", "_moved_ones", "_last", "_checks", "_compile")

    def __init__(self, leaves: list[_Leaf], tensors: list[torch.Tensor], layouts: list[_Layout]) -> None:
        self._leaves = leaves
        self._tensors = tensors
        self._layouts = layouts
        # inference tensors keep no version counter: they are compared in full at every replay
        tracked = [not t.is_inference() for t in tensors]
        # version counters at the previous check: writes after it are refreshes before the next replay
        versions = [t._version if ok else -1 for t, ok in zip(tensors, tracked)]
        ptrs = [t.data_ptr() for t in tensors]  # where each sat at capture, whenever the probe is compiled
        args = ([(leaf.root, leaf.steps, leaf.held) for leaf in leaves], tensors, layouts, tracked, versions, ptrs)
        # the first checks loop over lists; the generated probe is compiled once the graph is replayed often
        # (the tape's ``COMPILE_AFTER``): compiling it cost more than most graphs' every replay
        self._probe = _listed_watch(*args)
        self._compile: Callable[[], Any] | None = lambda: _compile_watch(*args)
        self._checks = 0
        # tensors found moved: compared in full at every replay until they are back where they were
        self._moved_ones: set[int] = set()
        # per leaf, the last rebinding reported: (what the path reached, benign, the report), reused while it persists
        self._last: dict[int, tuple[Any, bool, StaleInput]] = {}

    def check(self) -> tuple[StaleInput, ...]:
        """Before a replay: what moved since capture.  Two reads per input when nothing did."""
        if self._compile is not None:
            self._checks += 1
            if self._checks > _COMPILE_AFTER:
                self._probe, self._compile = self._compile(), None
        probed = self._probe()
        if probed is None and not self._moved_ones:
            return ()
        stale_leaves, refreshed, moved = probed or ((), [], [])
        if not stale_leaves and stale_leaves is not None and not moved and not self._moved_ones:
            return ()
        found = self._rebound(range(len(self._leaves)) if stale_leaves is None else stale_leaves, set(refreshed))
        found.extend(self._moved(moved))
        return tuple(found)

    def _rebound(self, indices: Iterable[int], refreshed: set[int]) -> list[StaleInput]:
        out = []
        for n in indices:
            leaf = self._leaves[n]
            obj: Any = leaf.root()
            if obj is None:  # the program dropped the root: nothing can rebind what its path reached
                continue
            try:
                for get in leaf.getters:
                    obj = get(obj)
            except Exception:  # noqa: BLE001 - whatever the path hits now, it no longer reaches the tensor
                obj = _MISSING
            if obj is leaf.held:
                continue
            benign = leaf.watched in refreshed
            last = self._last.get(n)
            if last is None or last[0] is not obj or last[1] != benign:
                now = "<missing>" if obj is _MISSING else describe(obj)
                last = self._last[n] = (obj, benign, StaleInput(path=leaf.path, captured=leaf.captured, now=now,
                                                                  kind="rebound", benign=benign))
            out.append(last[2])
        return out

    def _moved(self, moved: list[int]) -> list[StaleInput]:
        out = []
        for i in sorted(self._moved_ones.union(moved)):
            t, was = self._tensors[i], self._layouts[i]
            layout = _layout(was.path, t)
            changed = _changes(was, layout)
            if changed:
                self._moved_ones.add(i)
                out.append(StaleInput(path=was.path, captured=_layout_text(was, t), now=_layout_text(layout, t),
                                      kind="memory", changed=changed))
            else:
                self._moved_ones.discard(i)
        return out


def _layout_text(layout: _Layout, t: torch.Tensor) -> str:
    return f"{_dtype_name(t.dtype)}{list(layout.size)} stride {layout.stride} at {layout.storage_ptr:#x}+{layout.offset}"


def build_audit(
    inputs: Iterable[torch.Tensor],
    roots: Mapping[str, object],
    static_inputs: Iterable[torch.Tensor],
    *,
    notes: Iterable[str] = (),
    rerun_ops: Iterable[str] = (),
) -> tuple[InputAudit, StaleWatch]:
    static = list(static_inputs)
    static_ids = {id(t) for t in static}
    static_keys = {k for k in (storage_key(t) for t in static) if k is not None}
    by_id, by_view, by_storage = _walk(roots)
    entries: list[GraphInput] = []
    leaves: list[_Leaf] = []
    watched: dict[int, int] = {}
    tensors: list[torch.Tensor] = []
    layouts: list[_Layout] = []
    refs: dict[int, _RootRef] = {}  # one per root: the watch groups paths by their root

    def root_ref(root: object) -> _RootRef:
        found = refs.get(id(root))
        if found is None:
            found = refs[id(root)] = _root_ref(root)
        return found

    def watch(t: torch.Tensor, path: str) -> int:
        index = watched.get(id(t))
        if index is None:
            index = watched[id(t)] = len(tensors)
            tensors.append(t)
            layouts.append(_layout(path, t))
        return index

    for k, t in enumerate(inputs):
        found = by_id.get(id(t))
        key = storage_key(t)
        if found is None:
            vk = _view_key(t)
            found = by_view.get(vk) if vk is not None else None
        path = found[0] if found is not None else None
        if found is None and key is not None:
            base = _base_of(by_storage.get(key, []), t)
            if base is not None:
                found = base
                path = base[0] + _index_text(base[1].held, t)
        registered = id(t) in static_ids or (key is not None and key in static_keys)
        entries.append(GraphInput(path=path, shape=tuple(t.shape), dtype=_dtype_name(t.dtype), registered=registered))
        watch(t, path or f"<input {k}: {_dtype_name(t.dtype)}{list(t.shape)}>")
        if found is not None and path is not None:
            f = found[1]
            held_index = watch(f.held, found[0])
            leaves.append(_Leaf(path, root_ref(f.root), f.steps, tuple(_getter(s) for s in f.steps), f.held, describe(t), held_index))
        # A view held under its own name (pool.swa_loc) may also be a slice of a buffer another attribute owns
        # (runner.out_cache_loc_swa): watch that owner too, so rebinding the buffer is named where it happens.
        others = [h for h in by_storage.get(key, []) if found is not None and h[1].held is not found[1].held]
        base = _base_of(others, t) if others else None
        if base is not None:
            b = base[1]
            base_path = base[0] + _index_text(b.held, t)
            leaves.append(_Leaf(base_path, root_ref(b.root), b.steps, tuple(_getter(s) for s in b.steps), b.held, describe(t),
                                watch(b.held, base[0])))
    audit = InputAudit(inputs=tuple(entries), notes=tuple(notes), rerun_ops=tuple(rerun_ops))
    return audit, StaleWatch(leaves, tensors, layouts)

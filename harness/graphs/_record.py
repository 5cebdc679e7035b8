"""Capture-time machinery shared by the tape and cuda engines.

One ``Recorder`` sits under a capture as a ``TorchDispatchMode`` (sees every aten
op below autograd) plus a ``TorchFunctionMode`` (sees ``Tensor.tolist`` and the
``torch.tensor`` family, which either dispatch no aten op or dispatch one that is
only wrong in context).  Depending on the engine it

* checks ops against what CUDA refuses during stream capture (``check``),
* snapshots pre-existing storages before the first write and restores them at
  the end, so that capture does not compute (``undo``),
* tracks which tensors capture produced and which it read (``observe``), for the
  input audit and for poisoning capture-allocated storage,
* appends an ``OpStep`` per op, the raw tape the tape engine compiles (``record``).

Storages are identified by ``(device, data_ptr)``.  That is only sound while both
storages are alive, which is why the tape keeps every capture output alive and the
cuda engine never asks about freed intermediates.
"""

from __future__ import annotations

import dataclasses
import linecache
import os
import sys
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .engine import CaptureError, _set_island_host, _tls

StorageKey = tuple[torch.device, int]

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_location() -> str:
    """``file:line: code`` of the first caller outside torch and outside this package."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not (filename.startswith(_TORCH_DIR) or os.path.abspath(filename).startswith(_PKG_DIR)):
            break
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    code = linecache.getline(filename, frame.f_lineno).strip()
    shown = filename
    try:
        rel = os.path.relpath(filename)
        if not rel.startswith(".."):
            shown = rel
    except ValueError:  # other drive on Windows
        pass
    return f"{shown}:{frame.f_lineno}: {code}"


# ---------------------------------------------------------------- refusal checker

_HOST_SYNC = "host sync: copies a device value into Python (.item(), bool(), int(), float())"
_DATA_SIZED = "host sync: the output size depends on tensor values"
_MASK_INDEX = "boolean-mask indexing goes through nonzero, whose output size depends on values"
_FROM_DATA = "tensor built from Python data needs a host-to-device copy of host memory"
_D2H = "device-to-host copy synchronizes the host"

_REFUSED_OPS: dict[str, str] = {
    "aten::_local_scalar_dense": _HOST_SYNC,
    "aten::is_nonzero": _HOST_SYNC,
    "aten::equal": "host sync: returns a Python bool",
    "aten::nonzero": _DATA_SIZED,
    "aten::masked_select": _DATA_SIZED,
    "aten::_unique": _DATA_SIZED,
    "aten::_unique2": _DATA_SIZED,
    "aten::unique_dim": _DATA_SIZED,
    "aten::unique_consecutive": _DATA_SIZED,
    "aten::unique_dim_consecutive": _DATA_SIZED,
    "aten::bincount": _DATA_SIZED,
}
_LIFT_OPS = frozenset({"aten::lift_fresh", "aten::lift_fresh_copy"})
_INDEX_PUT_OPS = frozenset({"aten::index_put_", "aten::index_put", "aten::_index_put_impl_"})

# Host reads that dispatch no aten op of their own.
_HOST_READ_FUNCS: dict[Any, tuple[str, str]] = {
    torch.Tensor.tolist: ("Tensor.tolist", "host sync: reads device values into a Python list"),
    torch.Tensor.numpy: ("Tensor.numpy", "host sync: reads tensor values into numpy"),
    torch.Tensor.__array__: ("Tensor.__array__", "host sync: reads tensor values into numpy"),
}
# Tensors built from Python data: their aten.lift_fresh is refused, while the
# lift_fresh that indexing uses for a Python scalar value is not.
_FROM_DATA_FUNCS = frozenset({torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor})


def _is_mask(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)


def _masked_fill_path(self: torch.Tensor, indices: list[Any], value: Any, accumulate: bool) -> bool:
    """Whether index_put_ takes ATen's masked_fill shortcut, which needs no nonzero."""
    if accumulate or not isinstance(value, torch.Tensor):
        return False
    if value.numel() != 1 or value.device.type != "cpu":
        return False
    masks = [i for i in indices if i is not None]
    return len(masks) == 1 and _is_mask(masks[0]) and masks[0].device == self.device


def check_refused(func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], from_data: bool) -> None:
    """Raise ``CaptureError`` if CUDA stream capture refuses this call."""
    reason = _REFUSED_OPS.get(name)
    if reason is None:
        if name == "aten::repeat_interleave":
            if func._schema.overload_name in ("Tensor", "self_Tensor") and kwargs.get("output_size") is None:
                reason = _DATA_SIZED + "; pass output_size"
        elif name == "aten::index":
            if any(_is_mask(i) for i in args[1]):
                reason = _MASK_INDEX
        elif name in _INDEX_PUT_OPS:
            indices = args[1]
            if any(_is_mask(i) for i in indices):
                accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
                if not _masked_fill_path(args[0], indices, args[2], bool(accumulate)):
                    reason = _MASK_INDEX
        elif name in _LIFT_OPS:
            if from_data:
                reason = _FROM_DATA
        elif name == "aten::_to_copy":
            device = kwargs.get("device")
            if args[0].is_cuda and device is not None and torch.device(device).type == "cpu":
                reason = _D2H
        elif name == "aten::copy_":
            if args[0].device.type == "cpu" and isinstance(args[1], torch.Tensor) and args[1].is_cuda:
                reason = _D2H
    if reason is not None:
        raise CaptureError(str(func), user_location(), reason)


# ---------------------------------------------------------------- small helpers


def storage_key(t: torch.Tensor) -> StorageKey | None:
    """Identity of ``t``'s storage; None for empty storage, which holds nothing to track."""
    st = t.untyped_storage()
    if st.nbytes() == 0:
        return None
    return (t.device, st.data_ptr())


def flat_tensors(obj: Any, into: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Tensors in ``obj``, looking through lists, tuples and dict values."""
    if into is None:
        into = []
    if isinstance(obj, torch.Tensor):
        into.append(obj)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            flat_tensors(item, into)
    elif isinstance(obj, dict):
        for item in obj.values():
            flat_tensors(item, into)
    return into


def flat_outputs(out: Any) -> list[Any]:
    """An op's return, flattened one list deep, keeping positions (None stays None)."""
    if isinstance(out, (tuple, list)):
        flat: list[Any] = []
        for item in out:
            if isinstance(item, (tuple, list)):
                flat.extend(item)
            else:
                flat.append(item)
        return flat
    return [out]


def poison_value(dtype: torch.dtype) -> float | int | bool:
    if dtype == torch.bool:
        return True
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    info = torch.iinfo(dtype)
    if info.min == 0:  # unsigned: 0 is too common a value to stand out
        return info.max
    if info.bits >= 32:
        return -(2**31) + 7
    return info.min


def poison_storage(t: torch.Tensor) -> None:
    """Fill the whole storage behind ``t`` with the poison of ``t``'s dtype."""
    st = t.untyped_storage()
    n = st.nbytes() // t.element_size()
    flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(st, 0, (n,), (1,))
    try:
        flat.fill_(poison_value(t.dtype))
    except (RuntimeError, TypeError):  # exotic dtypes: any loud bit pattern will do
        torch.empty(0, dtype=torch.uint8, device=t.device).set_(st).fill_(0xFF)


@dataclass(frozen=True, slots=True)
class OpInfo:
    """What the schema says about an op, computed once per overload."""

    name: str
    writes: tuple[tuple[int, str], ...]  # (position, name) of arguments the op writes
    inplace_view: bool  # mutates metadata only (t_, resize_, set_, ...)


_INFO_CACHE: dict[Any, OpInfo] = {}


def op_info(func: Any) -> OpInfo:
    info = _INFO_CACHE.get(func)
    if info is None:
        schema = func._schema
        writes = tuple(
            (i, a.name)
            for i, a in enumerate(schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        )
        info = OpInfo(schema.name, writes, torch.Tag.inplace_view in func.tags)
        _INFO_CACHE[func] = info
    return info


def written_tensors(info: OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for pos, name in info.writes:
        value = args[pos] if pos < len(args) else kwargs.get(name)
        flat_tensors(value, found)
    return found


@dataclass(frozen=True, slots=True)
class OpStep:
    """One recorded aten call, exactly as dispatched."""

    func: Any
    info: OpInfo
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    out: Any
    outputs: tuple[Any, ...]  # flat_outputs(out)
    fresh: tuple[bool, ...]  # per output: storage newly allocated by this op


@dataclass(frozen=True, slots=True)
class IslandStep:
    """An eager island: Python re-run at replay, results copied into ``statics``."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    statics: tuple[torch.Tensor, ...]
    single: bool  # fn returned one tensor rather than a tuple


IslandImpl = Callable[["Recorder", Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]


# ---------------------------------------------------------------- recorder


class Recorder:
    """Capture-time state; see the module docstring for the modes."""

    def __init__(
        self,
        *,
        check: bool = True,
        undo: bool = False,
        observe: bool = False,
        record: bool = False,
        keep_fresh: bool = False,
        island_impl: IslandImpl | None = None,
    ) -> None:
        self.check = check
        self.undo = undo
        self.observe = observe or record
        self.record = record
        self.keep_fresh = keep_fresh or record
        self.island_impl = island_impl
        self.steps: list[OpStep | IslandStep] = []
        # Captured-read tensors that capture did not produce, first-seen order.
        self.inputs: dict[int, torch.Tensor] = {}
        # Weak so that the audit-only mode does not keep intermediates alive (and
        # so change how a CUDA graph's pool reuses memory); ids are compared with
        # `is` so a recycled id cannot fool it.
        self.produced: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        # Tensors made from Python data by indexing (a scalar value, an index list):
        # constants of the graph, not inputs and not capture allocations.
        self.constants: dict[int, torch.Tensor] = {}
        self.fresh: dict[StorageKey, torch.Tensor | None] = {}
        self._snapshots: dict[StorageKey, tuple[torch.Tensor, torch.Tensor]] = {}
        # Stand-ins that keep a tensor's pre-mutation metadata in earlier steps; alias id -> tensor.
        self.aliases: dict[int, torch.Tensor] = {}
        self._paused = 0
        self._from_data = 0

    # -- entering / leaving

    @contextmanager
    def active(self) -> Iterator[None]:
        if getattr(_tls, "capturing", False):
            raise RuntimeError("graph captures do not nest: a capture is already running on this thread")
        _tls.capturing = True
        previous = _set_island_host(self if self.island_impl is not None else None)
        try:
            with _HostReadHook(self), _OpHook(self):
                yield
        finally:
            _set_island_host(previous)
            _tls.capturing = False

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Ops run plainly: no checks, no snapshots, nothing recorded."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def restore(self) -> None:
        """Undo capture-time writes to storages that existed before capture."""
        with torch.no_grad():
            for whole, saved in self._snapshots.values():
                whole.copy_(saved)
        self._snapshots.clear()

    def poison_fresh(self) -> None:
        with torch.no_grad():
            for t in self.fresh.values():
                if t is not None:
                    poison_storage(t)

    # -- bookkeeping

    def note_inputs(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            tid = id(t)
            if tid in self.inputs or tid in self.constants or self.produced.get(tid) is t:
                continue
            self.inputs[tid] = t

    def adopt_fresh(self, tensors: tuple[torch.Tensor, ...]) -> None:
        """Register tensors allocated on the capture's behalf (island statics)."""
        for t in tensors:
            self.produced[id(t)] = t
            key = storage_key(t)
            if key is not None:
                self.fresh[key] = t if self.keep_fresh else None

    def _snapshot(self, t: torch.Tensor) -> None:
        key = storage_key(t)
        if key is None or key in self.fresh or key in self._snapshots:
            return
        whole = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
        self._snapshots[key] = (whole, whole.clone())

    def _freeze_metadata(self, t: torch.Tensor) -> None:
        """Before ``t_``/``resize_``/``set_`` & co. change ``t``, point earlier steps at an alias.

        A graph's kernels keep the layout they were captured with while Python
        goes on with the new one, so steps recorded so far must keep seeing ``t``
        as it is now.  The alias shares ``t``'s storage with today's metadata.
        """
        alias: torch.Tensor | None = None

        def sub(v: Any) -> Any:
            nonlocal alias
            if v is t:
                if alias is None:
                    alias = torch.empty(0, dtype=t.dtype, device=t.device).set_(
                        t.untyped_storage(), t.storage_offset(), t.shape, t.stride()
                    )
                    self.aliases[id(alias)] = t
                return alias
            if isinstance(v, list):
                return [sub(x) for x in v]
            if isinstance(v, tuple):
                return tuple(sub(x) for x in v)
            if isinstance(v, dict):
                return {k: sub(x) for k, x in v.items()}
            return v

        for i, step in enumerate(self.steps):
            if isinstance(step, OpStep):
                if any(x is t for x in flat_tensors((step.args, step.kwargs, step.outputs))):
                    self.steps[i] = dataclasses.replace(
                        step, args=sub(step.args), kwargs=sub(step.kwargs), out=sub(step.out), outputs=sub(step.outputs)
                    )
            elif any(x is t for x in flat_tensors((step.args, step.kwargs, step.statics))):
                self.steps[i] = dataclasses.replace(step, args=sub(step.args), kwargs=sub(step.kwargs), statics=sub(step.statics))

    # -- hooks

    def on_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._paused:
            return func(*args, **kwargs)
        info = op_info(func)
        if self.check:
            check_refused(func, info.name, args, kwargs, self._from_data > 0)
        if self.undo and info.writes:
            for t in written_tensors(info, args, kwargs):
                self._snapshot(t)
        if self.record and info.inplace_view:
            for t in written_tensors(info, args, kwargs):
                self._freeze_metadata(t)
        out = func(*args, **kwargs)
        if self.observe:
            self._observe(func, info, args, kwargs, out)
        return out

    def _observe(self, func: Any, info: OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        ins = flat_tensors(args)
        flat_tensors(kwargs, ins)
        if info.name in _LIFT_OPS:
            for t in ins:
                self.constants[id(t)] = t
        self.note_inputs(ins)
        in_ids = {id(t) for t in ins}
        in_keys = {storage_key(t) for t in ins}
        outputs = flat_outputs(out)
        fresh: list[bool] = []
        for t in outputs:
            if not isinstance(t, torch.Tensor):
                fresh.append(False)
                continue
            if id(t) not in in_ids:
                self.produced[id(t)] = t
            key = storage_key(t)
            is_fresh = key is not None and key not in in_keys and key not in self.fresh
            if is_fresh:
                self.fresh[key] = t if self.keep_fresh else None
            fresh.append(is_fresh)
        if self.record:
            self.steps.append(OpStep(func, info, args, dict(kwargs), out, tuple(outputs), tuple(fresh)))

    def on_function(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._paused or not self.check:
            return func(*args, **kwargs)
        refused = _HOST_READ_FUNCS.get(func)
        if refused is not None:
            raise CaptureError(refused[0], user_location(), refused[1])
        if func in _FROM_DATA_FUNCS:
            data = args[1] if func is torch.Tensor.new_tensor and len(args) > 1 else (args[0] if args else kwargs.get("data"))
            if not isinstance(data, torch.Tensor):
                self._from_data += 1
                try:
                    return func(*args, **kwargs)
                finally:
                    self._from_data -= 1
        return func(*args, **kwargs)

    def run_island(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._paused or self.island_impl is None:  # an island inside an island is plain code
            return fn(*args, **kwargs)
        if self.observe:
            self.note_inputs(flat_tensors((args, kwargs)))
        return self.island_impl(self, fn, args, kwargs)


def island_outputs(fn: Callable[..., Any], result: Any) -> tuple[tuple[torch.Tensor, ...], bool]:
    """Validate an island's return; (tensors, single)."""
    if isinstance(result, torch.Tensor):
        return (result,), True
    if isinstance(result, tuple) and all(isinstance(t, torch.Tensor) for t in result):
        return result, False
    name = getattr(fn, "__qualname__", repr(fn))
    raise TypeError(f"eager island {name} must return a tensor or a tuple of tensors, got {type(result).__name__}")


class _OpHook(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Captures never run under torch.compile; torch's dynamo-disable wrapper around
        # __torch_dispatch__ would import torch._dynamo on first use (seconds) and hook
        # every recorded op.
        return False

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self._recorder = recorder

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        return self._recorder.on_op(func, args, kwargs or {})


class _HostReadHook(TorchFunctionMode):
    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self._recorder = recorder

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        return self._recorder.on_function(func, args, kwargs or {})

def island_runner(step: IslandStep) -> Callable[[], None]:
    """What replay runs for an island: its Python again, fresh results copied into the capture's statics."""
    fn, args, kwargs, statics = step.fn, step.args, step.kwargs, step.statics

    def run() -> None:
        fresh, _ = island_outputs(fn, fn(*args, **kwargs))
        if len(fresh) != len(statics):
            raise RuntimeError(f"eager island {fn.__qualname__} returned {len(fresh)} tensors at replay, {len(statics)} at capture")
        with torch.no_grad():
            for static, new in zip(statics, fresh):
                if new.shape != static.shape:
                    raise RuntimeError(
                        f"eager island {fn.__qualname__} returned shape {tuple(new.shape)} at replay, {tuple(static.shape)} at capture"
                    )
                static.copy_(new)

    return run


def static_outputs(result: object) -> tuple[torch.Tensor, ...]:
    """Validate what a captured callable returned."""
    if result is None:
        return ()
    if isinstance(result, torch.Tensor):
        return (result,)
    if isinstance(result, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in result):
        return tuple(result)
    raise TypeError(f"a captured callable must return a tensor, a tuple of tensors or None, got {type(result).__name__}")

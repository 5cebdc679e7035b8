"""Capture-time machinery shared by the tape and cuda engines.

One ``Recorder`` sits under a capture as a ``TorchDispatchMode``
(it sees every aten op below autograd), together with wrappers around the few
Python-level calls that dispatch no op of their own (``_refusals.HOOKS``).  It

* checks every call against what CUDA refuses during stream capture
  (``_refusals.TABLE``), raising ``CaptureError`` with the user's source line;
* with ``undo`` (a capture: capture does not compute), undoes writes to
  storages that existed before it started.  It rolls back contents only: on
  CUDA a resize at capture really happens, and its new memory is graph memory,
  so it is poisoned.  No recorder sits under a warm-up run: it is a plain eager
  run, as on a device, and what it writes stays written (``_warm_up.py``);
* tracks which tensors it produced and which it read (the graph's inputs, for
  the input audit; a tensor first met as a target an op writes whole, with
  ``out=``, ``copy_``, ``fill_`` or ``zero_``, is no input) and which storages
  ops allocated (``fresh``, poisoned after capture);
* runs a ``torch.library`` op's kernel with itself active again, so the ops the
  body dispatches are checked and recorded like the program's own (CUDA
  captures the kernels, not the Python); in record mode an op whose recorded
  body does not account for what it returns or mutates did work the dispatcher
  cannot see (an FFI launch) and is recorded as one opaque op (``rerun_ops``).
  An op that reaches it above its composite decomposition (autograd excluded:
  in such a body, under ``inference_mode``) is decomposed the same way;
* registers a capture in ``capture_error_mode="global"`` so that another
  thread's host sync is refused and invalidates it (``_refusals``);
* with ``record``, appends an ``OpStep`` per op: the raw tape the tape engine
  compiles.  Recorded steps never hold the program's tensors.  Each tensor is
  represented by a *pin*: a tensor object of its own over the same storage with
  the layout of that moment (``detach()``).  The tape therefore binds memory,
  as a CUDA graph binds device addresses: a program that later swaps a
  tensor's memory (``t.data = ...``, ``t.set_(...)``, ``t.t_()``) does not move
  the tape, and an in-place layout change during capture leaves the steps
  recorded before it alone.  A storage an op reallocates in place during
  capture (``resize_`` past its capacity) is the exception: the pins recorded
  before the op move to a stand-in for the freed old block, and the copy CUDA
  captures from the old block into the new one is recorded after it.  Because
  the recorder holds only weak references to
  the program's tensors, a tensor that is dead at capture end is one the program
  can no longer read, which is what lets the tape reuse its memory.

Storages are identified by their ``StorageImpl`` (``torch._C._storage_id``),
which a resize keeps.  In record mode every storage stays alive (through a pin,
a snapshot or the program) so identities stay unique; the cuda engine's capture
keeps nothing alive and only compares storages within one op.

What it knows of an op's schema is in ``_ops.py``; the warm-up routine in ``_warm_up.py``; islands' and
captured callables' outputs in ``_islands.py``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ._cuda_queries import AVAILABILITY
from ._ops import (
    INFO_CACHE,
    OpInfo,
    StorageKey,
    runs_its_composite,
    tensor_args,
    flat_outputs,
    flat_tensors,
    op_info,
    poison_bytes,
    storage_key,
    written_tensors,
)
from ._refusals import (
    FUNCTION_HOOKS,
    HOOKS,
    SCALAR_SYNC_HOOKS,
    CaptureError,
    _tls,
    capturing_globally,
    check_op,
    refuse_nested,
)

CAPTURE_ERROR_MODES = ("global", "thread_local", "relaxed")
"""``torch.cuda.graph``'s capture error modes (``cudaStreamCaptureMode``)."""


def check_capture_error_mode(mode: str) -> None:
    if mode not in CAPTURE_ERROR_MODES:
        raise ValueError(f"capture_error_mode must be one of {', '.join(CAPTURE_ERROR_MODES)}, got {mode!r}")


class OpStep(NamedTuple):
    """One recorded aten call; every tensor in it is a pin."""

    func: Any
    info: OpInfo
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outputs: tuple[Any, ...]  # flat_outputs of the return
    fresh: tuple[bool, ...]  # per output: storage newly allocated by this op
    arg_keys: tuple[StorageKey, ...]  # storages of every tensor argument
    out_keys: tuple[StorageKey | None, ...]  # per output: its storage (None for a non-tensor)
    write_keys: tuple[StorageKey, ...]  # storages of the arguments the op writes


@dataclass(frozen=True, slots=True)
class IslandStep:
    """An eager island: Python re-run at replay, results copied into ``statics``."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    statics: tuple[torch.Tensor, ...]
    single: bool  # fn returned one tensor rather than a tuple


IslandImpl = Callable[["Recorder", Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]

# What the recorder knows of one tensor object of the program:
# (weakref to it, produced by this recording, its pin (record mode), serial, storage key).
_Seen = tuple[weakref.ref, bool, "torch.Tensor | None", int, "StorageKey | None"]
_REF, _PRODUCED, _PIN, _SERIAL, _KEY = range(5)
_Tensor = torch.Tensor
_ref = weakref.ref
_COPY = torch.ops.aten.copy_.default
_below_inplace_view = torch._C._AutoDispatchBelowADInplaceOrView
_BELOW_PYTHON = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.Python)


# ---------------------------------------------------------------- recorder


class Recorder:
    """Capture-time state; see the module docstring for the modes."""

    def __init__(
        self,
        *,
        undo: bool = False,
        track: bool = True,
        record: bool = False,
        capturing: bool = False,
        capture_error_mode: str = "global",
        island_impl: IslandImpl | None = None,
    ) -> None:
        check_capture_error_mode(capture_error_mode)
        self.undo = undo
        self.track = track or record
        self.record = record
        self.capturing = capturing
        # "global": while this capture runs, another thread's host sync fails and invalidates it
        self.capture_error_mode = capture_error_mode
        self.invalidated: CaptureError | None = None
        self.device_type: str | None = None  # of the first tensor seen: what another thread's sync is judged on
        self.island_impl = island_impl
        self.steps: list[OpStep | IslandStep] = []
        # Captured-read tensors that this recording did not produce, first-seen order.
        self.inputs: dict[int, torch.Tensor] = {}
        # Storages allocated by ops during this recording: key -> a pin over it (record) or None.
        self.fresh: dict[StorageKey, torch.Tensor | None] = {}
        # record: every pin made, by storage, so the tape can move a storage's pins at once.
        self.pins_by_key: dict[StorageKey, list[torch.Tensor]] = {}
        # record: pin id -> serial of the program tensor it stands for (one name per tensor in traces).
        self.serial_of_pin: dict[int, int] = {}
        # record: storages an op reallocated during capture, and the stand-ins for their old blocks
        # (memory of the tape's own that the steps recorded before the op keep reading and writing)
        self.relocated: set[StorageKey] = set()
        self.old_block_keys: set[StorageKey] = set()
        self.block_copies: set[int] = set()  # indices of the steps that copy an old block into its new one
        # record: custom ops recorded as one opaque op, re-run at every replay (work the dispatcher cannot see)
        self.rerun_ops: list[str] = []
        self.rerun_steps: set[int] = set()
        self._old_blocks: list[tuple[torch.UntypedStorage, torch.dtype]] = []
        self.cpu_only_syncs = 0
        # what a capture could not model and says instead of staying silent (_cuda_queries), in order, once each
        self.notes: list[str] = []
        self._seen: dict[int, _Seen] = {}
        self._keys: set[StorageKey] = set()  # record: every storage seen, so "never seen" means fresh
        self._constants: dict[int, torch.Tensor] = {}
        self._snapshots: dict[StorageKey, tuple[torch.UntypedStorage, torch.Tensor, torch.dtype]] = {}
        self._serial = 0
        self._paused = 0

    # -- entering / leaving

    @contextmanager
    def active(self) -> Iterator[None]:
        refuse_nested("CUDAGraph.capture_begin")
        _tls.recorder = self
        previous = getattr(_tls, "island_host", None)
        _tls.island_host = self if self.island_impl is not None else None  # engine.eager_island looks here
        globally = self.capturing and self.capture_error_mode == "global"
        try:
            with ExitStack() as stack:
                if globally:
                    stack.enter_context(capturing_globally(self))
                stack.enter_context(HOOKS.held(_ACTIVE_PATCHES + SCALAR_SYNC_HOOKS if globally else _ACTIVE_PATCHES))
                stack.enter_context(_OpHook(self))
                yield
        finally:
            _tls.island_host = previous
            _tls.recorder = None
        if self.invalidated is not None:  # another thread's host sync: CUDA fails the capture at its end
            raise self.invalidated

    def invalidate(self, error: CaptureError) -> None:
        """Another thread did what this capture's mode prohibits (called from that thread)."""
        if self.invalidated is None:
            self.invalidated = error

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Ops run plainly: no checks, no snapshots, nothing recorded."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def is_constant(self, t: torch.Tensor) -> bool:
        """A scalar the program wrote as a Python number (a graph constant on the host)."""
        return self._constants.get(id(t)) is t

    def restore(self) -> None:
        """Undo writes to storages that existed before recording."""
        with torch.no_grad():
            for storage, saved, dtype in self._snapshots.values():
                old, now = saved.numel(), storage.nbytes()
                whole = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
                if now == old:
                    whole.copy_(saved)
                else:  # an op at capture moved this storage into graph memory: nothing computed stays
                    poison_bytes(storage, dtype)
            for storage, dtype in self._old_blocks:  # the allocator freed them when the op reallocated
                poison_bytes(storage, dtype)
        self._snapshots.clear()

    # -- bookkeeping

    def _new(self, t: torch.Tensor, produced: bool, key: StorageKey | None) -> _Seen:
        if self.device_type is None:
            self.device_type = t.device.type
        self._serial += 1
        pin = None
        if self.record:
            pin = t.detach()
            self._pinned(pin, key, self._serial)
        e = (_ref(t), produced, pin, self._serial, key)
        self._seen[id(t)] = e
        return e

    def _pinned(self, pin: torch.Tensor, key: StorageKey | None, serial: int) -> None:
        self.serial_of_pin[id(pin)] = serial
        if key is not None:
            self._keys.add(key)
            found = self.pins_by_key.get(key)
            if found is None:
                self.pins_by_key[key] = [pin]
            else:
                found.append(pin)

    def _take(self, t: torch.Tensor) -> _Seen:
        """The entry of a tensor the program handed to an op; a tensor not seen before is an input."""
        e = self._seen.get(id(t))
        if e is None or e[_REF]() is not t:
            e = self._new(t, False, storage_key(t))
            if self._constants.get(id(t)) is not t:
                self.inputs[id(t)] = t
        return e

    def _repin(self, t: torch.Tensor) -> None:
        """After an op changed ``t``'s layout or storage, later steps see it through a new pin."""
        e = self._take(t)
        pin = e[_PIN]
        if pin is not None and not pin.is_set_to(t):
            key = storage_key(t)
            pin = t.detach()
            self._pinned(pin, key, e[_SERIAL])
            self._seen[id(t)] = (e[_REF], e[_PRODUCED], pin, e[_SERIAL], key)

    def adopt_fresh(self, tensors: tuple[torch.Tensor, ...]) -> None:
        """Register tensors allocated on the capture's behalf (island statics)."""
        with self.paused():  # outside an op, making a pin would itself dispatch through the recorder
            for t in tensors:
                key = storage_key(t)
                e = self._new(t, True, key)
                if key is not None:
                    self.fresh[key] = e[_PIN]

    def live_fresh(self) -> list[torch.Tensor]:
        """Tensors this recording produced over storages it allocated that the program still holds."""
        found = []
        for ref, produced, _, _, key in self._seen.values():
            if produced and key is not None and key in self.fresh and (t := ref()) is not None:
                found.append(t)
        return found

    def held_keys(self) -> set[StorageKey]:
        """Storages that a program tensor still alive aliases (record mode; the program can read them)."""
        return {e[_KEY] for e in self._seen.values() if e[_KEY] is not None and e[_REF]() is not None}

    def pin_of(self, t: torch.Tensor) -> torch.Tensor:
        e = self._seen.get(id(t))
        return e[_PIN] if e is not None and e[_REF]() is t and e[_PIN] is not None else t

    def serial_of(self, t: torch.Tensor) -> int | None:
        e = self._seen.get(id(t))
        return e[_SERIAL] if e is not None and e[_REF]() is t else None

    def _before_write(self, t: torch.Tensor) -> None:
        key = storage_key(t)
        if key is None or key in self.fresh:
            return
        if key not in self._snapshots:
            storage = t.untyped_storage()
            whole = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
            self._snapshots[key] = (storage, whole.clone(), t.dtype)

    # -- hooks

    def on_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._paused:
            return func(*args, **kwargs)
        info = INFO_CACHE.get(id(func))
        if info is None or info.func is not func:
            info = op_info(func)
        if info.implicit and runs_its_composite(func, args, kwargs):
            with _OpHook(self):  # its constituents come back through this recorder, checked and recorded
                return func.decompose(*args, **kwargs)
        if info.rule is not None or info.gen_pos is not None:
            check_op(func, info.rule, info.gen_pos, args, kwargs, self)
        written = None
        memory = None
        if info.writes and (self.undo or self.record):  # an observing capture needs no write list
            written = written_tensors(info, args, kwargs)
            if self.undo:
                for t in written:
                    self._before_write(t)
            if self.record and info.relayouts:
                memory = [(t, storage_key(t), t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
                          for t in written]
        if info.custom:
            return self._custom_op(func, info, args, kwargs, written)
        out = info.call(*args, **kwargs)
        if info.lift:
            for t in tensor_args(args, kwargs):
                self._constants[id(t)] = t
        if self.record:
            moved = self._reallocated(memory) if memory else None
            if info.overwrites:
                self._overwritten(info, args, kwargs)
            self._record(func, info, args, kwargs, out, written)
            if moved and not info.has_out:
                self._record_block_copies(moved)
        elif self.track:
            if info.overwrites:
                self._overwritten(info, args, kwargs)
            self._observe(args, kwargs, out)
        return out

    def _overwritten(self, info: OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Tensors first met as a target the op writes whole, without reading it: graph outputs, not inputs.

        A buffer the graph fills with ``out=`` (or ``copy_``, ``fill_``, ``zero_``) before it reads it
        holds nothing the graph depends on; listing it as an unregistered input is a false finding.
        """
        positions = {pos for pos, _ in info.overwrites}
        names = {name for _, name in info.overwrites}
        targets = flat_tensors([args[p] for p in positions if p < len(args)] + [kwargs[n] for n in names if n in kwargs])
        reads = flat_tensors([a for i, a in enumerate(args) if i not in positions]
                             + [v for k, v in kwargs.items() if k not in names])
        for t in targets:
            e = self._seen.get(id(t))
            if (e is None or e[_REF]() is not t) and not any(r is t for r in reads):
                self._new(t, False, storage_key(t))

    # -- custom ops

    def _custom_op(self, func: Any, info: OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any],
                   written: list[torch.Tensor] | None) -> Any:
        """Run a ``torch.library`` op's kernel with this recorder active, so its body's own ops are checked and recorded.

        CUDA captures the kernels the body launches, not the Python that launched them.  When the body's
        recorded ops do not account for everything the op returns or declares it mutates, part of its
        work is invisible to the dispatcher (an FFI kernel launch): the op is recorded as one opaque op,
        called again at every replay, and named in ``rerun_ops``.
        """
        keys = None
        for t in tensor_args(args, kwargs):
            keys = torch._C._dispatch_keys(t) if keys is None else keys | torch._C._dispatch_keys(t)
        mark, made_from = len(self.steps), len(self.fresh)
        if keys is None:  # nothing to dispatch on below this mode: the kernel runs out of sight
            out = info.call(*args, **kwargs)
        else:
            with _OpHook(self):  # the kernel below the Python key, its own ops back through this recorder
                out = func.redispatch(keys & _BELOW_PYTHON, *args, **kwargs)
        if not self.record:
            if self.track:
                self._observe(args, kwargs, out)
            return out
        if keys is not None and self._accounted(written, out, mark):
            return out
        del self.steps[mark:]
        self.block_copies = {i for i in self.block_copies if i < mark}
        self.rerun_steps = {i for i in self.rerun_steps if i < mark}
        self.rerun_steps.add(mark)
        if info.name not in self.rerun_ops:
            self.rerun_ops.append(info.name)
        self._record(func, info, args, kwargs, out, written, made=set(list(self.fresh)[made_from:]))
        return out

    def _accounted(self, written: list[torch.Tensor] | None, out: Any, mark: int) -> bool:
        """Whether the steps recorded since ``mark`` wrote every storage the op mutates and computed every one it returns."""
        computed: set[StorageKey | None] = set()
        for step in self.steps[mark:]:
            if isinstance(step, IslandStep):
                return False
            computed.update(step.write_keys)
            if not step.info.alloc:  # an allocation is no computation: memory left to a kernel out of sight
                computed.update(k for k, fresh in zip(step.out_keys, step.fresh) if fresh)
        for t in written or ():
            if storage_key(t) not in computed:
                return False
        return all(storage_key(o) in computed for o in flat_outputs(out) if isinstance(o, _Tensor))

    # -- storages reallocated during capture

    def _reallocated(self, memory: list[tuple[torch.Tensor, StorageKey | None, int, int]]
                     ) -> list[tuple[torch.Tensor, StorageKey, torch.Tensor, int]]:
        """Storages the op just reallocated (a ``resize_`` past capacity), their earlier pins moved to stand-ins.

        On CUDA the kernels captured before the op keep the old block's address; the allocator frees
        that block at the op, so the graph's later reads of it find whatever was put there (poison, here).
        """
        moved = []
        done: set[StorageKey] = set()
        for t, key, ptr, nbytes in memory:
            if key is None or key in done or nbytes == 0 or storage_key(t) != key:
                continue  # set_ binds another storage: earlier pins keep the old one by themselves
            storage = t.untyped_storage()
            if storage.data_ptr() == ptr and storage.nbytes() == nbytes:
                continue
            done.add(key)
            old = torch.empty(nbytes, dtype=torch.uint8, device=t.device)
            old_key = storage_key(old)
            assert old_key is not None
            with torch.no_grad(), _below_inplace_view():
                for pin in self.pins_by_key.pop(key, []):
                    pin.set_(old.untyped_storage(), pin.storage_offset(), pin.size(), pin.stride())
                    self._pinned(pin, old_key, self.serial_of_pin[id(pin)])
            for tid, e in list(self._seen.items()):  # later ops see live tensors over the storage at its new block
                obj = e[_REF]()
                if e[_KEY] == key and e[_PIN] is not None and obj is not None:
                    pin = obj.detach()
                    self._pinned(pin, key, e[_SERIAL])
                    self._seen[tid] = (e[_REF], e[_PRODUCED], pin, e[_SERIAL], key)
            if key in self.fresh:  # graph memory either way: the new block is poisoned after capture too
                self.fresh[key] = self._seen[id(t)][_PIN] if id(t) in self._seen else t.detach()
            self.relocated.update((key, old_key))
            self.old_block_keys.add(old_key)
            self._old_blocks.append((old.untyped_storage(), t.dtype))
            moved.append((t, key, old, nbytes))
        return moved

    def _record_block_copies(self, moved: list[tuple[torch.Tensor, StorageKey, torch.Tensor, int]]) -> None:
        """The device-to-device copy of each old block into the head of the new one (CUDA's ``resize_bytes_cuda``)."""
        for t, key, old, nbytes in moved:
            storage = t.untyped_storage()
            n = min(nbytes, storage.nbytes())
            serial = self._seen[id(t)][_SERIAL]
            src = old[:n]
            dst = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage, 0, (n,), (1,))
            old_key = storage_key(old)
            assert old_key is not None
            self._pinned(src, old_key, serial)
            self._pinned(dst, key, serial)
            self.block_copies.add(len(self.steps))
            self.steps.append(OpStep(_COPY, op_info(_COPY), (dst, src), {}, (dst,), (False,), (key, old_key), (key,),
                                     (key,)))

    def _observe(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """Inputs and fresh outputs without recording (cuda capture): nothing is kept alive."""
        seen = self._seen
        in_keys = set()
        for t in tensor_args(args, kwargs):
            e = seen.get(id(t))
            if e is None or e[_REF]() is not t:
                e = self._take(t)
            in_keys.add(e[_KEY])
        for o in (out,) if isinstance(out, _Tensor) else flat_outputs(out):
            if isinstance(o, _Tensor):
                e = seen.get(id(o))
                if e is None or e[_REF]() is not o:
                    key = storage_key(o)
                    self._new(o, True, key)
                    if key is not None and key not in in_keys:
                        self.fresh[key] = None

    def _pin_args(self, values: Any, keys: list[StorageKey]) -> Any:
        seen = self._seen
        out = []
        for a in values:
            if isinstance(a, _Tensor):
                e = seen.get(id(a))
                if e is None or e[_REF]() is not a:
                    e = self._take(a)
                if e[_KEY] is not None:
                    keys.append(e[_KEY])
                out.append(e[_PIN])
            elif isinstance(a, (list, tuple)) and a:
                out.append(type(a)(self._pin_args(a, keys)))
            else:
                out.append(a)
        return out

    def _output(self, o: torch.Tensor, made: set[StorageKey] | None = None
                ) -> tuple[torch.Tensor | None, bool, StorageKey | None]:
        """(pin, fresh, storage) of a tensor an op returned; a storage never seen before is fresh.

        ``made``: storages the op allocated, for an opaque op whose body's ops saw its outputs first.
        """
        e = self._seen.get(id(o))
        if e is not None and e[_REF]() is o:  # an in-place op hands back its argument
            return e[_PIN], made is not None and e[_KEY] in made, e[_KEY]
        key = storage_key(o)
        fresh = key is not None and key not in self._keys
        e = self._new(o, True, key)
        if fresh:
            self.fresh[key] = e[_PIN]  # type: ignore[index]
        return e[_PIN], fresh, key

    def _record(self, func: Any, info: OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                written: list[torch.Tensor] | None, made: set[StorageKey] | None = None) -> None:
        if written and info.relayouts:
            for t in written:
                self._repin(t)
        keys: list[StorageKey] = []
        pinned = tuple(self._pin_args(args, keys))
        pinned_kwargs = dict(zip(kwargs, self._pin_args(kwargs.values(), keys))) if kwargs else {}
        write_keys = tuple(k for k in (self._seen[id(t)][_KEY] for t in written) if k is not None) if written else ()
        if isinstance(out, _Tensor):  # the common case: one output
            pin, fresh, key = self._output(out, made)
            self.steps.append(OpStep(func, info, pinned, pinned_kwargs, (pin,), (fresh,), tuple(keys), (key,), write_keys))
            return
        outputs: list[Any] = []
        flags: list[bool] = []
        out_keys: list[StorageKey | None] = []
        for o in flat_outputs(out):
            if isinstance(o, _Tensor):
                pin, fresh, key = self._output(o, made)
            else:
                pin, fresh, key = o, False, None
            outputs.append(pin)
            flags.append(fresh)
            out_keys.append(key)
        self.steps.append(OpStep(func, info, pinned, pinned_kwargs, tuple(outputs), tuple(flags), tuple(keys),
                                 tuple(out_keys), write_keys))

    def run_island(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._paused or self.island_impl is None:  # an island inside an island is plain code
            return fn(*args, **kwargs)
        if self.track:
            with self.paused():
                for t in flat_tensors((args, kwargs)):
                    self._take(t)
        return self.island_impl(self, fn, args, kwargs)


class _OpHook(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Captures never run under torch.compile; torch's dynamo-disable wrapper around
        # __torch_dispatch__ would import torch._dynamo on first use (seconds) and hook
        # every recorded op.
        return False

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self._on_op = recorder.on_op

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        return self._on_op(func, args, kwargs or {})


_ACTIVE_PATCHES = FUNCTION_HOOKS + (AVAILABILITY,)

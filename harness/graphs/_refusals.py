"""What CUDA refuses during stream capture: one table, and the checks that read it.

The tape engine decides every CPU verdict, so "refused" must mean what a real
``torch.cuda.CUDAGraph`` capture refuses, not what the CPU kernels happen to do.
The two differ both ways: a CPU kernel reads host memory freely where its CUDA
twin must synchronize (``masked_fill_`` with a tensor value, ``histc`` without a
range), and a CPU kernel validates its input with ``.item()`` where the CUDA one
relies on device asserts (``F.one_hot`` with ``num_classes``).  ``TABLE`` holds
every such decision once, keyed by the op's schema name (``aten::nonzero``) or,
for Python-level calls that dispatch no aten op of their own, by a Python name
(``Tensor.tolist``).  Each ``Rule`` says why CUDA behaves so and names the
PyTorch source that shows it.

The device model: on a CPU-only machine every tensor a captured program touches
plays the part of a device tensor, except scalars the program wrote as Python
numbers (``x[mask] = 0.0``), which stay host scalars as they do on CUDA.  An
explicit trip to the host (``.cpu()``, ``.to("cpu")``, ``.numpy()``, printing)
is therefore a device-to-host read even though nothing moves on a CPU, and host
data (a Python list, a numpy array) reaching an op is a host-to-device copy.
``.to(device)`` with a ``torch.device`` object is read as the program moving a
tensor to its own device; only a device named by a string (``"cpu"``) is taken
as a deliberate host copy.

How the table was checked: every entry was read against the named function of
the PyTorch source (``pytorch/pytorch``: ATen native kernels and the Python
bindings), the header-only ones (``Repeat.h``, ``IndexingUtils.h``,
``TensorAdvancedIndexingUtils.h``) also against the headers installed with the
torch this project runs; ``tests/graphs/_refusal_cases.py`` holds one small
program per decision (and per exception of a decision);
``tests/graphs/test_refusals.py`` runs each on the tape and checks that the table
and the programs cover each other; and ``tests/graphs/test_cuda_gpu.py``
captures the same programs with a bare ``torch.cuda.graph`` on a GPU, no harness
involved, and asserts that CUDA refuses exactly the programs the table refuses.
"""

from __future__ import annotations

import linecache
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch

# Dispatch modes are thread-local in torch, so the capture state is too: the active recorder (which the
# Python-level hooks below consult) and the island host ``engine.eager_island`` hands islands to.
_tls = threading.local()


class CaptureError(RuntimeError):
    """An op CUDA refuses during stream capture.

    ``op`` names the op (``aten._local_scalar_dense.default``, ``Tensor.tolist``);
    ``location`` is the user source line that called it, as ``file:line: code``.
    """

    op: str
    location: str
    reason: str

    def __init__(self, op: str, location: str, reason: str = "") -> None:
        self.op = op
        self.location = location
        self.reason = reason
        why = f" ({reason})" if reason else ""
        super().__init__(f"{op} is not allowed during CUDA graph capture{why}\n  at {location}")

    def __reduce__(self) -> tuple[Any, ...]:
        # The custom __init__ signature would otherwise break pickling (xdist, multiprocessing).
        return (type(self), (self.op, self.location, self.reason))



class CaptureContext(Protocol):
    """What the rules read of the capture running on this thread (a ``_record.Recorder``)."""

    cpu_only_syncs: int
    _paused: int
    device_type: str | None

    def is_constant(self, t: torch.Tensor) -> bool: ...

    def invalidate(self, error: CaptureError) -> None: ...

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
    return frame_location(frame)


def frame_location(frame: Any) -> str:
    """``file:line: code`` of a frame, the file relative to the working directory when it lies below it."""
    filename = frame.f_code.co_filename
    code = linecache.getline(filename, frame.f_lineno).strip()
    shown = filename
    try:
        rel = os.path.relpath(filename)
        if not rel.startswith(".."):
            shown = rel
    except ValueError:  # other drive on Windows
        pass
    return f"{shown}:{frame.f_lineno}: {code}"


Predicate = Callable[[tuple[Any, ...], dict[str, Any], CaptureContext], bool]


@dataclass(frozen=True, slots=True)
class Rule:
    """One decision of the table."""

    why: str
    """what CUDA does with the call during capture"""
    source: str
    """the PyTorch source, ``file: function``, that shows it"""
    when: Predicate | None = None
    """None: the rule always applies; else it applies only when this returns True"""
    refused: bool = True
    """False: CUDA captures the call although the CPU kernel syncs; its CPU-only host reads are let through"""


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], pos: int, name: str, default: Any = None) -> Any:
    if pos < len(args):
        return args[pos]
    return kwargs.get(name, default)


# ---------------------------------------------------------------- the device model


def _host_scalar(value: Any, self: torch.Tensor, rec: CaptureContext) -> bool:
    """A value the op reads on the host: a CPU tensor next to a device tensor, or a Python number."""
    if not isinstance(value, torch.Tensor):
        return True
    if value.device.type != "cpu":
        return False
    return self.device.type != "cpu" or rec.is_constant(value)


def _is_mask(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)


def _host_sequence(obj: object) -> bool:
    return isinstance(obj, (list, tuple)) or type(obj).__name__ == "ndarray"


# Index parts that hold no host data; tested first because nearly every index a capture meets is one of them
# (or a tuple of them), and this predicate runs on every ``Tensor.__getitem__`` while a recorder is active.
_PLAIN_INDEX = (slice, int, torch.Tensor, type(None), type(Ellipsis))


def _host_index(index: object) -> bool:
    """Whether an index holds Python or numpy data that torch turns into a device tensor."""
    if isinstance(index, _PLAIN_INDEX):
        return False
    if type(index) is tuple:
        for i in index:
            if not isinstance(i, _PLAIN_INDEX) and _host_sequence(i):
                return True
        return False
    if type(index).__name__ == "ndarray":
        return True
    if isinstance(index, list):
        # torch reads a short list holding slices, None, Ellipsis, tensors or sequences as a tuple
        # (treatSequenceAsTuple); a list of numbers is one index tensor built on the host
        if len(index) < 32 and any(
            i is None or i is Ellipsis or isinstance(i, (slice, torch.Tensor)) or _host_sequence(i) for i in index
        ):
            return any(_host_sequence(i) for i in index)
        return True
    if isinstance(index, tuple):
        return any(_host_sequence(i) for i in index)
    return False


# ---------------------------------------------------------------- predicates


def _cpu_check_outside_allowance(args: tuple[Any, ...], kwargs: dict[str, Any], rec: CaptureContext) -> bool:
    return not (rec.cpu_only_syncs and args[0].device.type == "cpu")


def _repeat_interleave_unsized(args: tuple[Any, ...], kwargs: dict[str, Any], rec: CaptureContext) -> bool:
    repeats_tensor = isinstance(args[0], torch.Tensor) and (len(args) == 1 or isinstance(args[1], torch.Tensor))
    return repeats_tensor and kwargs.get("output_size") is None


def _mask_index(args: tuple[Any, ...], kwargs: dict[str, Any], rec: CaptureContext) -> bool:
    return any(_is_mask(i) for i in args[1])


def _mask_put_needs_nonzero(args: tuple[Any, ...], kwargs: dict[str, Any], rec: CaptureContext) -> bool:
    self, indices, value = args[0], args[1], args[2]
    if not any(_is_mask(i) for i in indices):
        return False
    accumulate = bool(_arg(args, kwargs, 3, "accumulate", False))
    masks = [i for i in indices if i is not None]
    # ATen's canDispatchToMaskedFill: one mask on self's device and a one-element CPU value
    masked_fill_path = (
        not accumulate
        and isinstance(value, torch.Tensor)
        and value.numel() == 1
        and _host_scalar(value, self, rec)
        and len(masks) == 1
        and masks[0].device == self.device
    )
    return not masked_fill_path


def _device_fill_value(args: tuple[Any, ...], kwargs: dict[str, Any], rec: CaptureContext) -> bool:
    value = args[2]
    return isinstance(value, torch.Tensor) and not _host_scalar(value, args[0], rec)


def _histc_without_range(args: tuple[Any, ...], kwargs: dict[str, Any], rec: CaptureContext) -> bool:
    return _arg(args, kwargs, 2, "min", 0) == _arg(args, kwargs, 3, "max", 0) and args[0].numel() > 0


def _to_host(args: tuple[Any, ...], kwargs: dict[str, Any], rec: CaptureContext) -> bool:
    device = kwargs.get("device")
    return device is not None and args[0].device.type == "cuda" and torch.device(device).type == "cpu"


def _copy_to_host(args: tuple[Any, ...], kwargs: dict[str, Any], rec: CaptureContext) -> bool:
    return args[0].device.type == "cpu" and isinstance(args[1], torch.Tensor) and args[1].device.type == "cuda"


def _tensor_to_host_string(args: tuple[Any, ...], kwargs: dict[str, Any], rec: CaptureContext) -> bool:
    device = kwargs.get("device", args[1] if len(args) > 1 else None)
    return isinstance(device, str) and torch.device(device).type == "cpu"


def _python_data(pos: int, name: str) -> Predicate:
    def when(args: tuple[Any, ...], kwargs: dict[str, Any], rec: CaptureContext) -> bool:
        return not isinstance(_arg(args, kwargs, pos, name), torch.Tensor)

    return when


def _getitem_host_data(args: tuple[Any, ...], kwargs: dict[str, Any], rec: CaptureContext) -> bool:
    return _host_index(args[1])


def _setitem_host_data(args: tuple[Any, ...], kwargs: dict[str, Any], rec: CaptureContext) -> bool:
    return _host_index(args[1]) or _host_sequence(args[2])


def _one_hot_sized(args: tuple[Any, ...], kwargs: dict[str, Any], rec: CaptureContext) -> bool:
    return _arg(args, kwargs, 1, "num_classes", -1) >= 1


# ---------------------------------------------------------------- the table

_HOST_SYNC = "host sync: copies a device value into Python (.item(), bool(), int(), float())"
_DATA_SIZED = "host sync: the output size depends on tensor values"
_D2H = "device-to-host copy: the host waits for the device"
_HOST_READ = "host read: device values copied into host memory"
_H2D = "host data copied to the device from pageable memory, which stream capture forbids"
_NOT_REGISTERED = "random op with an explicit generator: only the default generator is registered with the graph"
SEEDED = "random op with generator="
"""Table key of the rule for any op tagged ``nondeterministic_seeded`` that is given a generator."""

TABLE: dict[str, Rule] = {
    # -- host syncs
    "aten::_local_scalar_dense": Rule(
        _HOST_SYNC, "aten/src/ATen/native/cuda/CUDAScalar.cu: _local_scalar_dense_cuda (memcpy_and_sync)",
        _cpu_check_outside_allowance),
    "aten::equal": Rule("host sync: returns a Python bool", "aten/src/ATen/native/cuda/Equal.cpp: cuda_equal (.all().item())"),
    "aten::allclose": Rule("host sync: returns a Python bool",
                           "aten/src/ATen/native/TensorCompare.cpp: allclose (isclose(...).all().item())"),
    "aten::_linalg_check_errors": Rule(
        "host sync: reads the solver's info tensor to raise (linalg.inv, cholesky, solve; the *_ex variants skip it)",
        "aten/src/ATen/native/BatchLinearAlgebra.cpp: _linalg_check_errors (infos.any().item())"),
    # -- output sizes that depend on values
    "aten::nonzero": Rule(_DATA_SIZED, "aten/src/ATen/native/cuda/Nonzero.cu: nonzero_out_cuda (copies the count to the host)"),
    "aten::masked_select": Rule(_DATA_SIZED, "aten/src/ATen/native/cuda/IndexKernel.cpp: masked_select_out_cuda_impl"),
    "aten::_unique": Rule(_DATA_SIZED, "aten/src/ATen/native/cuda/Unique.cu: _unique_cuda"),
    "aten::_unique2": Rule(_DATA_SIZED, "aten/src/ATen/native/cuda/Unique.cu: _unique2_cuda"),
    "aten::unique_dim": Rule(_DATA_SIZED, "aten/src/ATen/native/cuda/Unique.cu: unique_dim_cuda"),
    "aten::unique_consecutive": Rule(_DATA_SIZED, "aten/src/ATen/native/cuda/Unique.cu: unique_consecutive_cuda"),
    "aten::unique_dim_consecutive": Rule(_DATA_SIZED, "aten/src/ATen/native/cuda/Unique.cu: unique_dim_consecutive_cuda"),
    "aten::bincount": Rule(_DATA_SIZED, "aten/src/ATen/native/cuda/SummaryOps.cu: _bincount_cuda_template (max().item())"),
    "aten::repeat_interleave": Rule(
        _DATA_SIZED + "; pass output_size",
        "aten/src/ATen/native/Repeat.h: repeat_interleave_common (cumsum[-1].item() without output_size)",
        _repeat_interleave_unsized),
    "aten::index": Rule(
        "boolean-mask indexing goes through nonzero, whose output size depends on values",
        "aten/src/ATen/native/IndexingUtils.h: expandTensors (mask.nonzero())", _mask_index),
    "aten::index_put_": Rule(
        "boolean-mask assignment of a device value goes through nonzero (a host scalar takes the masked_fill path)",
        "aten/src/ATen/native/TensorAdvancedIndexingUtils.h: canDispatchToMaskedFill", _mask_put_needs_nonzero),
    "aten::index_put": Rule(
        "boolean-mask assignment of a device value goes through nonzero (a host scalar takes the masked_fill path)",
        "aten/src/ATen/native/TensorAdvancedIndexingUtils.h: canDispatchToMaskedFill", _mask_put_needs_nonzero),
    "aten::_index_put_impl_": Rule(
        "boolean-mask assignment of a device value goes through nonzero (a host scalar takes the masked_fill path)",
        "aten/src/ATen/native/TensorAdvancedIndexingUtils.h: canDispatchToMaskedFill", _mask_put_needs_nonzero),
    # -- CUDA kernels that read a device value on the host where the CPU kernel reads memory directly
    "aten::masked_fill_": Rule(
        "host sync: the CUDA kernel reads a 0-dim device value with .item()",
        "aten/src/ATen/native/cuda/Indexing.cu: masked_fill__cuda (Tensor value: value.item())", _device_fill_value),
    "aten::masked_fill": Rule(
        "host sync: the CUDA kernel reads a 0-dim device value with .item()",
        "aten/src/ATen/native/cuda/Indexing.cu: masked_fill__cuda (Tensor value: value.item())", _device_fill_value),
    "aten::histc": Rule(
        "host sync: without a range (min == max) the CUDA kernel reads the data's min and max on the host",
        "aten/src/ATen/native/cuda/SummaryOps.cu: _histc_cuda_template (self.min().cpu())", _histc_without_range),
    # -- device-to-host copies of CUDA tensors
    "aten::_to_copy": Rule(_D2H, "aten/src/ATen/native/cuda/Copy.cu: copy_kernel_cuda (device-to-host memcpy_and_sync)", _to_host),
    "aten::copy_": Rule(_D2H, "aten/src/ATen/native/cuda/Copy.cu: copy_kernel_cuda (device-to-host memcpy_and_sync)", _copy_to_host),
    # -- random numbers
    # (check_op applies it to any op tagged nondeterministic_seeded given a generator other than the default)
    SEEDED: Rule(_NOT_REGISTERED,
                 "aten/src/ATen/cuda/CUDAGeneratorImpl.cpp: CUDAGeneratorImpl::philox_cuda_state "
                 "(\"unexpected CUDA generator used during capture\"); CUDAGraph::capture_begin registers the default one"),
    # -- Python-level host reads (no aten op of their own)
    "Tensor.tolist": Rule(_HOST_READ + " (a Python list)", "torch/csrc/utils/tensor_list.cpp: tensor_to_list (copies to the CPU)"),
    "Tensor.numpy": Rule(_HOST_READ + " (numpy)", "torch/csrc/utils/tensor_numpy.cpp: tensor_to_numpy (CPU tensors only)"),
    "Tensor.__array__": Rule(_HOST_READ + " (numpy)", "torch/_tensor.py: Tensor.__array__ (self.numpy())"),
    "Tensor.__repr__": Rule(_HOST_READ + " (printing a tensor formats its values)",
                            "torch/_tensor_str.py: _str_intern (device tensors are copied to the CPU to format)"),
    "Tensor.__format__": Rule(_HOST_READ + " (formatting a tensor reads its values)",
                              "torch/_tensor.py: Tensor.__format__ (item() or __repr__)"),
    "Tensor.cpu": Rule(_D2H, "aten/src/ATen/native/cuda/Copy.cu: copy_kernel_cuda (device-to-host memcpy_and_sync)"),
    "Tensor.to": Rule(_D2H + " (.to('cpu'))", "aten/src/ATen/native/cuda/Copy.cu: copy_kernel_cuda (device-to-host memcpy_and_sync)",
                      _tensor_to_host_string),
    # -- host data reaching the device
    "torch.tensor": Rule("tensor built from Python data: " + _H2D,
                         "torch/csrc/utils/tensor_new.cpp: internal_new_from_data (CPU tensor, then .to(device))",
                         _python_data(0, "data")),
    "torch.as_tensor": Rule("tensor built from Python data: " + _H2D,
                            "torch/csrc/utils/tensor_new.cpp: internal_new_from_data (CPU tensor, then .to(device))",
                            _python_data(0, "data")),
    "torch.asarray": Rule("tensor built from Python data: " + _H2D,
                          "torch/csrc/utils/tensor_new.cpp: asarray (CPU tensor, then .to(device))", _python_data(0, "obj")),
    "Tensor.new_tensor": Rule("tensor built from Python data: " + _H2D,
                              "torch/csrc/utils/tensor_new.cpp: new_tensor (internal_new_from_data)", _python_data(1, "data")),
    "torch.from_numpy": Rule("tensor over host (numpy) memory: " + _H2D,
                             "torch/csrc/utils/tensor_numpy.cpp: tensor_from_numpy (a CPU tensor)"),
    "torch.frombuffer": Rule("tensor over a host buffer: " + _H2D,
                             "torch/csrc/utils/tensor_new.cpp: tensor_frombuffer (a CPU tensor)"),
    "Tensor.__getitem__": Rule("indexing with a Python list or numpy array: the index is built on the host; " + _H2D,
                               "torch/csrc/autograd/python_variable_indexing.cpp: sequenceToVariable "
                               "(indexing_tensor_from_data)", _getitem_host_data),
    "Tensor.__setitem__": Rule("indexing or assigning with a Python list or numpy array: built on the host; " + _H2D,
                               "torch/csrc/autograd/python_variable_indexing.cpp: THPVariable_setitem "
                               "(sequenceToVariable, valueToTensor)", _setitem_host_data),
    # -- captured by CUDA although the CPU kernel syncs
    "torch.nn.functional.one_hot": Rule(
        "captured: with num_classes the CUDA kernel checks ranges with device asserts; only the CPU kernel reads "
        "min()/max() on the host", "aten/src/ATen/native/Onehot.cpp: one_hot (the .item() checks run off CUDA only)",
        _one_hot_sized, refused=False),
}


# ---------------------------------------------------------------- per-op lookup


def op_rule(name: str) -> Rule | None:
    return TABLE.get(name)


def _default_generator(gen: Any) -> bool:
    device = gen.device
    if device.type == "cpu":
        return gen._cdata == torch.default_generator._cdata
    if device.type == "cuda":
        return gen._cdata == torch.cuda.default_generators[device.index or 0]._cdata
    return False


def check_op(func: Any, rule: Rule | None, gen_pos: int | None, args: tuple[Any, ...], kwargs: dict[str, Any],
             rec: CaptureContext) -> None:
    """Raise ``CaptureError`` if CUDA stream capture refuses this aten call."""
    if rule is not None and (rule.when is None or rule.when(args, kwargs, rec)):
        raise CaptureError(str(func), user_location(), rule.why)
    if gen_pos is not None:
        gen = _arg(args, kwargs, gen_pos, "generator")
        if gen is not None and not _default_generator(gen):
            raise CaptureError(str(func), user_location(), TABLE[SEEDED].why)


def refuse_nested(op: str) -> None:
    """Raise ``CaptureError`` when a capture is already open on this thread, as CUDA refuses a second one."""
    if getattr(_tls, "recorder", None) is not None:
        raise CaptureError(op, user_location(), "a capture is already open on this thread: captures do not nest "
                           "(CUDA refuses to begin a capture on a capturing stream, and the synchronize that "
                           "torch.cuda.graph opens with)")


# ---------------------------------------------------------------- Python-level hooks


def _resolve(name: str) -> tuple[Any, str]:
    owner_path, _, attr = name.rpartition(".")
    if owner_path == "Tensor":
        return torch.Tensor, attr
    owner: Any = sys.modules[owner_path]
    return owner, attr


class Patches:
    """Process-wide attribute patches, each installed while at least one holder needs it.

    The table's Python-level calls are wrapped this way while any capture or warm-up runs: a
    dispatch mode cannot see them (``torch.from_numpy`` does not even go through
    ``__torch_function__``), and a function mode would tax every torch call of the program,
    where a wrapper costs one thread-local lookup and only on these names.  A wrapper asks the
    recorder active on the calling thread, so captures on other threads are unaffected, and
    a patch is counted per holder so overlapping holders restore the original exactly once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._makers: dict[tuple[Any, str], Callable[[Any], Callable[..., Any]]] = {}
        self._count: dict[tuple[Any, str], int] = {}
        self._saved: dict[tuple[Any, str], Any] = {}

    def add(self, owner: Any, attr: str, make: Callable[[Any], Callable[..., Any]]) -> tuple[Any, str]:
        key = (owner, attr)
        self._makers[key] = make
        self._count[key] = 0
        return key

    @contextmanager
    def held(self, keys: tuple[tuple[Any, str], ...]) -> Iterator[None]:
        with self._lock:
            for key in keys:
                if self._count[key] == 0:
                    self._install(key)
                self._count[key] += 1
        try:
            yield
        finally:
            with self._lock:
                for key in keys:
                    self._count[key] -= 1
                    if self._count[key] == 0:
                        self._uninstall(key)

    def _install(self, key: tuple[Any, str]) -> None:
        owner, attr = key
        self._saved[key] = owner.__dict__.get(attr, _MISSING) if isinstance(owner, type) else getattr(owner, attr)
        setattr(owner, attr, self._makers[key](getattr(owner, attr)))

    def _uninstall(self, key: tuple[Any, str]) -> None:
        owner, attr = key
        own = self._saved.pop(key)
        if own is _MISSING:
            delattr(owner, attr)
        else:
            setattr(owner, attr, own)


_MISSING = object()
HOOKS = Patches()


# ---------------------------------------------------------------- other threads

# Captures running in capture_error_mode="global", by thread.  CUDA then prohibits potentially unsafe
# calls on every other thread: a host sync there fails and invalidates the capture.
GLOBAL_CAPTURES: dict[int, CaptureContext] = {}
_CAPTURES_LOCK = threading.Lock()
OTHER_THREAD_SYNCS = frozenset({"Tensor.tolist", "Tensor.numpy", "Tensor.__array__", "Tensor.__repr__",
                                "Tensor.__format__", "Tensor.cpu", "Tensor.to"})
"""Entries of the table that are host syncs on any thread (the rest concern what the capture itself reads)."""
_OTHER_THREAD = ("host sync on another thread while a capture runs in capture_error_mode='global', which "
                 "prohibits it on every thread")


@contextmanager
def capturing_globally(rec: CaptureContext) -> Iterator[None]:
    """Register ``rec`` as a global-mode capture of this thread while the block runs."""
    me = threading.get_ident()
    with _CAPTURES_LOCK:
        GLOBAL_CAPTURES[me] = rec
    try:
        yield
    finally:
        with _CAPTURES_LOCK:
            GLOBAL_CAPTURES.pop(me, None)


def refuse_on_other_threads(name: str, args: tuple[Any, ...]) -> None:
    """Raise ``CaptureError`` for a host sync of this thread if a global-mode capture runs on another; invalidate it too."""
    me = threading.get_ident()
    tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
    hit = [rec for tid, rec in list(GLOBAL_CAPTURES.items())
           if tid != me and (tensor is None or rec.device_type in (None, tensor.device.type))]
    if not hit:
        return
    location = user_location()
    for rec in hit:
        rec.invalidate(CaptureError(name, location, _OTHER_THREAD + "; the capture is invalidated"))
    raise CaptureError(name, location, _OTHER_THREAD)


def _wrap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` under the table's rule for ``name`` while a recorder runs on this thread."""
    rule = TABLE[name]
    when, refused, why = rule.when, rule.refused, rule.why
    other_threads = name in OTHER_THREAD_SYNCS

    def hooked(*args: Any, **kwargs: Any) -> Any:
        rec = getattr(_tls, "recorder", None)
        if rec is None and other_threads and GLOBAL_CAPTURES:
            captures = list(GLOBAL_CAPTURES.values())
            if captures and (when is None or when(args, kwargs, captures[0])):
                refuse_on_other_threads(name, args)
        if rec is None or rec._paused or (when is not None and not when(args, kwargs, rec)):
            return original(*args, **kwargs)
        if refused:
            raise CaptureError(name, user_location(), why)
        rec.cpu_only_syncs += 1  # CUDA captures it: the CPU kernel's own host reads are let through
        try:
            return original(*args, **kwargs)
        finally:
            rec.cpu_only_syncs -= 1

    hooked.__name__ = getattr(original, "__name__", name)
    hooked.__qualname__ = getattr(original, "__qualname__", name)
    hooked.__doc__ = getattr(original, "__doc__", None)
    return hooked


FUNCTION_HOOKS: tuple[tuple[Any, str], ...] = tuple(
    HOOKS.add(*_resolve(name), lambda original, _name=name: _wrap(_name, original))
    for name in TABLE
    if not name.startswith("aten::") and name != SEEDED
)


def _refused_on_other_threads(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def hooked(*args: Any, **kwargs: Any) -> Any:
        if GLOBAL_CAPTURES and getattr(_tls, "recorder", None) is None:
            refuse_on_other_threads(name, args)
        return original(*args, **kwargs)  # on the capturing thread the recorder sees the op it dispatches

    hooked.__name__ = getattr(original, "__name__", name)
    hooked.__qualname__ = getattr(original, "__qualname__", name)
    hooked.__doc__ = getattr(original, "__doc__", None)
    return hooked


SCALAR_SYNC_HOOKS: tuple[tuple[Any, str], ...] = tuple(
    HOOKS.add(torch.Tensor, attr, lambda original, _name=f"Tensor.{attr}": _refused_on_other_threads(_name, original))
    for attr in ("item", "__bool__", "__int__", "__float__", "__index__", "__complex__")
)
"""Python entry points of ``_local_scalar_dense``, held while a global-mode capture runs: another thread's
dispatch is invisible to the capturing thread's recorder, so its host syncs are caught where Python calls them."""

"""What the recorder knows of an op from its schema, and the small tensor helpers around it.

``op_info`` reads an overload's schema once (what it writes, whether it is a view, an
allocation, an ``out=`` overload, a ``torch.library`` op, a composite one) and the refusal
table's rule for it.  The rest: storage identity, flattening an op's arguments and outputs,
and the poison that marks memory no kernel has written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ._refusals import Rule, op_rule

StorageKey = int
_storage_id: Callable[[torch.Tensor], int] = getattr(torch._C, "_storage_id", None) or (
    lambda t: t.untyped_storage()._cdata
)


def storage_key(t: torch.Tensor) -> StorageKey | None:
    """Identity of ``t``'s storage; None for a tensor without one (sparse, nested)."""
    try:
        return _storage_id(t)
    except (RuntimeError, NotImplementedError):
        return None


# ---------------------------------------------------------------- small helpers


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


def poison_bytes(storage: torch.UntypedStorage, dtype: torch.dtype, start: int = 0) -> None:
    """Fill ``storage`` from byte ``start`` on with the poison of ``dtype``."""
    size = dtype.itemsize
    first = -(-start // size)
    n = storage.nbytes() // size - first
    if n <= 0:
        return
    flat = torch.empty(0, dtype=dtype, device=storage.device).set_(storage, first, (n,), (1,))
    try:
        flat.fill_(poison_value(dtype))
    except (RuntimeError, TypeError):  # exotic dtypes: any loud bit pattern will do
        torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, first * size, (n * size,), (1,)).fill_(0xFF)


def poison_storage(t: torch.Tensor) -> None:
    """Fill the whole storage behind ``t`` with the poison of ``t``'s dtype."""
    poison_bytes(t.untyped_storage(), t.dtype)


@dataclass(frozen=True, slots=True)
class OpInfo:
    """What the schema says about an op, computed once per overload."""

    func: Any
    call: Callable[..., Any]  # the overload's C++ entry point (skips OpOverload.__call__)
    name: str
    writes: tuple[tuple[int, str], ...]  # (position, name) of arguments the op writes
    inplace_view: bool  # mutates metadata only (t_, resize_, set_, ...)
    relayouts: bool  # may change the layout of an argument it writes (inplace views, out= resizes, set_data)
    rule: Rule | None  # the refusal table's rule for this op
    gen_pos: int | None  # position of a ``generator`` argument of a random op
    seeded: bool  # draws random numbers
    lift: bool  # turns a Python scalar into a tensor (a graph constant)
    alloc: bool  # only allocates (empty*, new_empty*)
    returns: bool  # has a return value (an op without one acts by its effect: an assert)
    has_out: bool  # an ``out=`` overload: it writes its whole output, after resizing it if need be
    custom: bool  # not an ATen or prims op (torch.library): recorded through its body
    implicit: bool  # has a CompositeImplicitAutograd kernel and no explicit composite one
    overwrites: tuple[tuple[int, str], ...]  # (position, name) of arguments written whole and not read


# Keyed by id: OpOverload.__hash__ is Python code, and overloads live as long as the process.
INFO_CACHE: dict[int, OpInfo] = {}
_LIFT_OPS = frozenset({"aten::lift_fresh", "aten::lift_fresh_copy"})
_BUILTIN_NAMESPACES = frozenset({"aten", "prims", "prim"})
# in-place ops that write all of ``self`` without reading it (an ``out=`` overload does the same to its outputs)
_OVERWRITE_SELF = frozenset({"aten::copy_", "aten::fill_", "aten::zero_"})
_has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
_DECOMPOSES: dict[tuple[int, str], bool] = {}


def runs_its_composite(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the backend of the call's tensors runs the op's CompositeImplicitAutograd kernel.

    Such an op reaches a dispatch mode only when autograd is excluded (inside a custom op's kernel,
    under ``torch.inference_mode``); above autograd the dispatcher decomposes it before the mode.
    """
    tensors = tensor_args(args, kwargs)
    device = tensors[0].device.type if tensors else "cpu"
    key = (id(func), device)
    found = _DECOMPOSES.get(key)
    if found is None:
        backend = {"cpu": "CPU", "cuda": "CUDA"}.get(device)
        found = _DECOMPOSES[key] = backend is None or not _has_kernel(func.name(), backend)
    return found


def op_info(func: Any) -> OpInfo:
    info = INFO_CACHE.get(id(func))
    if info is None or info.func is not func:
        schema = func._schema
        args = schema.arguments
        writes = tuple((i, a.name) for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write)
        inplace_view = torch.Tag.inplace_view in func.tags
        seeded = torch.Tag.nondeterministic_seeded in func.tags
        gen_pos = next((i for i, a in enumerate(args) if a.name == "generator"), None) if seeded else None
        relayouts = inplace_view or any(a.is_out for a in args) or (bool(writes) and not schema.returns)
        alloc = schema.name.split("::", 1)[-1].startswith(("empty", "new_empty"))
        info = OpInfo(func, getattr(func, "_op", func), schema.name, writes, inplace_view, relayouts,
                      op_rule(schema.name), gen_pos, seeded, schema.name in _LIFT_OPS, alloc, bool(schema.returns),
                      any(a.is_out for a in args), schema.name.split("::", 1)[0] not in _BUILTIN_NAMESPACES,
                      _has_kernel(func.name(), "CompositeImplicitAutograd")
                      and not _has_kernel(func.name(), "CompositeExplicitAutograd")
                      and not _has_kernel(func.name(), "CompositeExplicitAutogradNonFunctional"),
                      tuple((i, a.name) for i, a in enumerate(args) if a.is_out)
                      or (((0, args[0].name),) if schema.name in _OVERWRITE_SELF else ()))
        INFO_CACHE[id(func)] = info
    return info


def written_tensors(info: OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for pos, name in info.writes:
        value = args[pos] if pos < len(args) else kwargs.get(name)
        flat_tensors(value, found)
    return found


def tensor_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors an aten call takes (schemas nest at most one list deep)."""
    found = []
    for a in args:
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            found.extend(x for x in a if isinstance(x, torch.Tensor))
    if kwargs:
        for a in kwargs.values():
            if isinstance(a, torch.Tensor):
                found.append(a)
            elif isinstance(a, (list, tuple)):
                found.extend(x for x in a if isinstance(x, torch.Tensor))
    return found

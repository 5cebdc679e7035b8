"""Replay calls for ops whose ``.out`` overload only the boxed call reaches, written as cheaper calls that
leave the same bytes.

A replayed op with no public ``out=`` binding goes through the boxed, schema-driven call (about 8 us for a
gather of a few rows) or through its functional binding and a copy into its output (about 6 us for a roll).
Two kinds that a decode graph replays dozens of times each are pure data movement, so they have calls of
their own here, bound once at a graph's first replay:

* ``src[idx]`` with one integer index tensor (``aten.index.Tensor``: the K/V rows a page table names) is
  ``index_select`` over the flattened index, into the output's rows. The two differ only on indices that
  ``index_select`` refuses (negative ones, which ``index`` counts from the end, and out-of-range ones): on
  any refusal the boxed call runs instead, so the output, and an error's type, text and frames, are the
  boxed call's;
* ``roll`` along one dimension is the two slices of the input copied to their places in the output;
* ``constant_pad_nd`` with no negative pad is the output filled with the value and the input copied into
  its interior;
* ``masked_fill`` whose mask broadcasts to the input's shape is the input copied into the output, which is
  then filled in place where the mask holds (what the functional op does in a fresh tensor).

None applies where the output shares a storage with an input (the tape's memory reuse can arrange that):
those keep the general path. Each returns None where it does not apply.

The calls read views of the tape's pins (flattened, narrowed) made once, not at every replay (a ``narrow``
costs as much as the copy it serves). A pin can move: the tape re-points the pins of an input the program
reallocated to a block of its own (``_homes.py``), and a view made before would still read the program's new
memory. So each call checks the storages of the pins it viewed (a fraction of a microsecond) and makes its
views again where one moved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._ops import _storage_id, storage_key

__all__ = ["masked_fill_by_copy", "pad_by_fill", "roll_by_copies", "rows_gather"]

_INDEX_DTYPES = (torch.int64, torch.int32)


def _broadcasts_to(shape: torch.Size, target: torch.Size) -> bool:
    """``shape`` broadcasts to ``target`` without widening it (``torch.broadcast_shapes`` imports sympy, which
    costs a child process a second)."""
    return len(shape) <= len(target) and all(d in (1, t) for d, t in zip(reversed(shape), reversed(target)))


def _following(pins: tuple[torch.Tensor, ...], make: Callable[[], tuple[torch.Tensor, ...]]
               ) -> Callable[[], tuple[torch.Tensor, ...]]:
    """The views ``make`` builds of ``pins``, made again whenever a pin has been moved to another storage."""
    state = [tuple(map(_storage_id, pins)), make()]

    def views() -> tuple[torch.Tensor, ...]:
        now = tuple(map(_storage_id, pins))
        if now != state[0]:
            state[0], state[1] = now, make()
        return state[1]

    return views


def _apart(*tensors: torch.Tensor) -> bool:
    keys = [storage_key(t) for t in tensors]
    return None not in keys and len(set(keys)) == len(keys)


def rows_gather(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                boxed: tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]) -> Callable[[], None] | None:
    """``out[...] = src[idx]`` for ``aten.index.Tensor(src, [idx])``, the boxed ``boxed`` call where
    ``index_select`` refuses the indices; None unless the op is one integer index over the first dimension."""
    if kwargs or len(args) != 2 or not isinstance(args[1], (list, tuple)) or len(args[1]) != 1:
        return None
    src, (idx,) = args
    if not (isinstance(src, torch.Tensor) and isinstance(idx, torch.Tensor) and isinstance(out, torch.Tensor)):
        return None
    if (src.dim() == 0 or out.numel() == 0 or idx.dtype not in _INDEX_DTYPES or out.dtype != src.dtype
            or not (src.device == idx.device == out.device) or not (idx.is_contiguous() and out.is_contiguous())
            or out.shape != idx.shape + src.shape[1:] or not _apart(src, idx, out)):
        return None
    rows = (-1, *src.shape[1:])
    views = _following((idx, out), lambda: (idx.view(-1), out.view(rows)))
    select = torch.index_select
    call, call_args, call_kwargs = boxed

    def gather() -> None:
        flat_idx, flat_out = views()
        try:
            select(src, 0, flat_idx, out=flat_out)
            return
        except (IndexError, RuntimeError):
            pass  # left to the boxed call, outside this handler: its error carries no context of this one
        try:
            call(*call_args, **call_kwargs)
        except BaseException as exc:
            # raised from the replay's own line, as the boxed call bound directly is
            exc.__traceback__ = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
            raise

    return gather


def roll_by_copies(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Callable[[], None] | None:
    """``out`` = ``torch.roll(x, shift, dim)`` for ``aten.roll.default`` along one dimension, as two copies;
    None for any other roll."""
    if kwargs or len(args) != 3:
        return None
    x, shifts, dims = args
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    if not (isinstance(x, torch.Tensor) and isinstance(out, torch.Tensor)) or len(shifts) != 1 or len(dims) != 1:
        return None
    if x.dim() == 0 or out.shape != x.shape or out.dtype != x.dtype or out.device != x.device or not _apart(x, out):
        return None
    dim = dims[0] % x.dim()
    n = x.shape[dim]
    if n == 0:
        return None
    s = shifts[0] % n
    if s == 0:
        whole = out.copy_
        return lambda: whole(x)
    views = _following((x, out), lambda: (out.narrow(dim, s, n - s), x.narrow(dim, 0, n - s),
                                          out.narrow(dim, 0, s), x.narrow(dim, n - s, s)))

    def roll() -> None:
        head_to, head_from, tail_to, tail_from = views()
        head_to.copy_(head_from)
        tail_to.copy_(tail_from)

    return roll


def pad_by_fill(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Callable[[], None] | None:
    """``out`` = ``constant_pad_nd(x, pad, value)`` as a fill and a copy; None where a pad is negative (a crop)."""
    if kwargs or len(args) not in (2, 3):
        return None
    x, pad = args[0], tuple(args[1])
    value = args[2] if len(args) == 3 else 0
    if not (isinstance(x, torch.Tensor) and isinstance(out, torch.Tensor)) or not isinstance(value, (int, float)):
        return None
    if (len(pad) % 2 or len(pad) // 2 > x.dim() or any(p < 0 for p in pad) or out.dtype != x.dtype
            or out.device != x.device or not _apart(x, out)):
        return None
    shape = list(x.shape)
    for k in range(len(pad) // 2):
        shape[x.dim() - 1 - k] += pad[2 * k] + pad[2 * k + 1]
    if list(out.shape) != shape:
        return None

    def inside() -> tuple[torch.Tensor]:
        interior = out
        for k in range(len(pad) // 2):
            dim = x.dim() - 1 - k
            interior = interior.narrow(dim, pad[2 * k], x.shape[dim])
        return (interior,)

    views = _following((out,), inside)
    fill = out.fill_

    def padded() -> None:
        (interior,) = views()
        fill(value)
        interior.copy_(x)

    return padded


def masked_fill_by_copy(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Callable[[], None] | None:
    """``out`` = ``masked_fill(x, mask, value)`` (``aten.masked_fill.Scalar``) as a copy and an in-place fill; None where the mask widens the
    result past the input's shape or anything shares the output's storage."""
    if kwargs or len(args) != 3:
        return None
    x, mask, value = args
    if not (isinstance(x, torch.Tensor) and isinstance(mask, torch.Tensor) and isinstance(out, torch.Tensor)):
        return None
    if isinstance(value, torch.Tensor):  # a device scalar: capture refuses it (the kernel reads it on the host)
        return None
    tensors = [x, mask, out]
    if (out.shape != x.shape or out.dtype != x.dtype or not _broadcasts_to(mask.shape, x.shape)
            or any(t.device != out.device for t in tensors) or not _apart(*tensors)):
        return None
    copy, fill = out.copy_, out.masked_fill_

    def filled() -> None:
        copy(x)
        fill(mask, value)

    return filled

"""How a task's result crosses from its child process to the caller: a pickle, with frozen slotted dataclasses
carried as their field values.

A run's result is tens of thousands of small frozen dataclasses (live tokens, mismatches, step records).
Pickle rebuilds each through ``dataclasses._dataclass_setstate``, which asks ``fields()`` of every object: most
of the time the caller spent taking results, on the core the children need. Here the field names are looked
up once per class, and an object is rebuilt by setting its slots from them: the same object, field for field,
``__post_init__`` not run (as pickle never runs it). Anything else pickles as it always does, tensors copied
(multiprocessing's own pickler would send shared-memory handles that die with the child).
"""

from __future__ import annotations

import copyreg
import dataclasses
import io
import pickle
import types
from typing import Any

from ...fields import field_names

_DATACLASS_GETSTATE = getattr(dataclasses, "_dataclass_getstate", None)
"""what ``@dataclass(frozen=True, slots=True)`` pickles with; a class that brings its own keeps it"""

_FAST: dict[type, tuple[tuple[str, ...], tuple[Any, ...]] | None] = {}
"""per class: its field names and their slot descriptors' ``__set__`` (which write past a frozen
``__setattr__``), in field order; None for a class that pickles pickle's way"""


def _fast(cls: type) -> tuple[tuple[str, ...], tuple[Any, ...]] | None:
    """The fields of a frozen slotted dataclass whose pickling is dataclasses' own, else None."""
    try:
        return _FAST[cls]
    except KeyError:
        pass
    found = None
    if (_DATACLASS_GETSTATE is not None and getattr(cls, "__getstate__", None) is _DATACLASS_GETSTATE
            and cls.__reduce_ex__ is object.__reduce_ex__ and cls.__reduce__ is object.__reduce__
            and (names := field_names(cls)) is not None):
        slots = [getattr(cls, n, None) for n in names]
        # a field that is not a slot of its own (a subclass without slots): pickle's way, whatever it is
        if all(type(d) is types.MemberDescriptorType for d in slots):
            found = names, tuple(d.__set__ for d in slots)
    _FAST[cls] = found
    return found


def _set_fields(obj: Any, values: tuple[Any, ...]) -> None:
    fast = _fast(type(obj))
    if fast is None or len(fast[1]) != len(values):
        raise pickle.UnpicklingError(f"{type(obj).__qualname__}: {len(values)} field values for a class that "
                                     f"takes {'none this way' if fast is None else len(fast[1])}")
    for set_, value in zip(fast[1], values):
        set_(obj, value)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        fast = _fast(type(obj))
        if fast is None:
            return NotImplemented
        # ``copyreg.__newobj__`` pickles as the NEWOBJ opcode, the object made in C and memoized before its
        # fields are pickled (a field that leads back to it pickles as a reference, as with pickle's own state)
        return copyreg.__newobj__, (type(obj),), tuple([getattr(obj, n) for n in fast[0]]), None, None, _set_fields


def dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def loads(data: bytes) -> Any:
    return pickle.loads(data)

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

_DATACLASS_GETSTATE = getattr(dataclasses, "_dataclass_getstate", None)
"""what ``@dataclass(frozen=True, slots=True)`` pickles with; a class that brings its own keeps it"""

_NAMES: dict[type, tuple[str, ...] | None] = {}
_SETTERS: dict[type, tuple[Any, ...]] = {}
"""per class: its fields' slot descriptors' ``__set__``, in field order (they write past a frozen ``__setattr__``)"""


def _names(cls: type) -> tuple[str, ...] | None:
    """The field names of a frozen slotted dataclass whose pickling is dataclasses' own, else None."""
    try:
        return _NAMES[cls]
    except KeyError:
        pass
    names = None
    if (_DATACLASS_GETSTATE is not None and getattr(cls, "__getstate__", None) is _DATACLASS_GETSTATE
            and cls.__reduce_ex__ is object.__reduce_ex__ and cls.__reduce__ is object.__reduce__
            and dataclasses.is_dataclass(cls)):
        names = tuple(f.name for f in dataclasses.fields(cls))
        slots = [getattr(cls, n, None) for n in names]
        if all(type(d) is types.MemberDescriptorType for d in slots):
            _SETTERS[cls] = tuple(d.__set__ for d in slots)
        else:
            names = None  # a field that is not a slot of its own: pickle's way, whatever it is
    _NAMES[cls] = names
    return names


def _set_fields(obj: Any, values: tuple[Any, ...]) -> None:
    cls = type(obj)
    setters = _SETTERS.get(cls)
    if setters is None:
        _names(cls)
        setters = _SETTERS.get(cls)
    if setters is None or len(setters) != len(values):
        raise pickle.UnpicklingError(f"{cls.__qualname__}: {len(values)} field values for a class that takes "
                                     f"{'none this way' if setters is None else len(setters)}")
    for set_, value in zip(setters, values):
        set_(obj, value)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        cls = type(obj)
        names = _NAMES[cls] if cls in _NAMES else _names(cls)
        if names is None:
            return NotImplemented
        # ``copyreg.__newobj__`` pickles as the NEWOBJ opcode, the object made in C and memoized before its
        # fields are pickled (a field that leads back to it pickles as a reference, as with pickle's own state)
        return copyreg.__newobj__, (cls,), tuple([getattr(obj, n) for n in names]), None, None, _set_fields


def dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def loads(data: bytes) -> Any:
    return pickle.loads(data)

"""What ``torch.cuda`` answers about capture while the harness captures, as a device would answer it.

The capture query.  ``torch.cuda.is_current_stream_capturing()`` is a Python function that
looks up ``_cuda_isCurrentStreamCapturing`` in ``torch.cuda.graphs`` at every call, whichever
name the caller reached it by (``torch.cuda``, ``torch.cuda.graphs``, a name bound with ``from
torch.cuda import ...``).  That global, and the ``torch._C`` entry point it comes from, are
replaced once, when this module is imported, by ``capture_query``: True while a capture runs on
this thread (not during its warm-up, not inside an island), False during a replay, and otherwise
the real answer.  On a CPU-only torch the real entry point is a dummy class that raises when
called, so every design that asks (SGLang's code does, on every forward) would fail on every
eager step; there the answer is False, as a device gives outside capture.  The replacement stays
installed: eager steps between captures ask too.

The guard.  Serving code and torch itself (``SyncBatchNorm``) ask ``torch.cuda.is_available()
and torch.cuda.is_current_stream_capturing()``.  Without CUDA the first half is False and the
capture is never seen, so a design that takes a shortcut while capturing would pass on the tape
where a GPU diverges.  Answering ``is_available()`` True during capture would break every program
that then asks another CUDA question (a device count, a ``cuda`` tensor).  So during a capture on
a machine without CUDA, ``is_available()`` answers True only to a call whose result guards the
capture query in the same expression (read from the caller's bytecode: a jump on False followed
by a call of the query); every other call gets the real False.  When such a False reaches code
that also asks the capture query (a nested ``if``), the guard cannot see the capture, and the
recorder writes a note naming the line (``Recorder.notes``, shown in the graph's audit) rather
than staying silent.  Guards the harness cannot observe at all (a tensor's ``is_cuda``, or
``is_available()`` read once at import) are not noted.
"""

from __future__ import annotations

import bisect
import dis
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import CodeType, FrameType
from typing import Any

import torch
import torch.cuda.graphs as _graphs_module

from ._refusals import HOOKS, _tls, frame_location

__all__ = ["AVAILABILITY", "capture_query", "replaying_island"]

_REAL_QUERY: Callable[[], bool] = _graphs_module._cuda_isCurrentStreamCapturing
# torch.cuda.graphs installs a dummy class where torch was built without CUDA: calling it raises
_HAS_REAL_QUERY = not isinstance(_REAL_QUERY, type)


def capture_query() -> bool:
    """Whether the current stream is capturing, as the graph engines model it."""
    rec = getattr(_tls, "recorder", None)
    if rec is not None:
        return rec.capturing and not rec._paused
    if getattr(_tls, "replaying", 0):
        return False
    return _REAL_QUERY() if _HAS_REAL_QUERY else False


capture_query.__doc__ = getattr(_REAL_QUERY, "__doc__", None) or capture_query.__doc__
_graphs_module._cuda_isCurrentStreamCapturing = capture_query
torch._C._cuda_isCurrentStreamCapturing = capture_query  # type: ignore[attr-defined]

_QUERY_NAMES = frozenset({"is_current_stream_capturing", "_cuda_isCurrentStreamCapturing"})


@contextmanager
def replaying_island() -> Iterator[None]:
    """While a replay runs an island's Python, the capture query answers False, as on a device."""
    _tls.replaying = getattr(_tls, "replaying", 0) + 1
    try:
        yield
    finally:
        _tls.replaying -= 1


# ---------------------------------------------------------------- the is_available() guard


def _is_query(obj: object) -> bool:
    return obj is capture_query or obj is _REAL_QUERY or obj is torch.cuda.graphs.is_current_stream_capturing


_INSTRUCTIONS: dict[CodeType, tuple[dis.Instruction, ...]] = {}
_GUARDS: dict[tuple[CodeType, int], bool] = {}
_SKIPPED_OPS = frozenset({"CACHE", "EXTENDED_ARG", "COPY", "TO_BOOL", "NOT_TAKEN", "POP_TOP"})
_LOAD_OPS = frozenset({"LOAD_GLOBAL", "LOAD_ATTR", "LOAD_METHOD", "LOAD_NAME", "LOAD_DEREF", "LOAD_FAST",
                       "LOAD_FAST_BORROW", "LOAD_FAST_CHECK", "PUSH_NULL"})
_CALL_OPS = frozenset({"PRECALL", "CALL"})


def _instructions(code: CodeType) -> tuple[dis.Instruction, ...]:
    found = _INSTRUCTIONS.get(code)
    if found is None:
        found = _INSTRUCTIONS[code] = tuple(dis.get_instructions(code))
    return found


def _guards_query(frame: FrameType) -> bool:
    """Whether the call running at ``frame.f_lasti`` is the left side of ``<call> and <capture query>()``."""
    key = (frame.f_code, frame.f_lasti)
    found = _GUARDS.get(key)
    if found is None:
        found = _GUARDS[key] = _reads_as_guard(frame)
    return found


def _reads_as_guard(frame: FrameType) -> bool:
    instructions = _instructions(frame.f_code)
    # f_lasti may point into the call's inline cache entries (CPython 3.11): the call is the last
    # instruction starting at or before it
    at = bisect.bisect_right([ins.offset for ins in instructions], frame.f_lasti) - 1
    if at < 0 or instructions[at].opname not in _CALL_OPS:
        return False
    rest = [ins for ins in instructions[at + 1:] if ins.opname not in _SKIPPED_OPS]
    if not rest or "IF_FALSE" not in rest[0].opname:
        return False
    loaded: list[dis.Instruction] = []
    for ins in rest[1:]:
        if ins.opname in _LOAD_OPS:
            loaded.append(ins)
            continue
        if ins.opname not in _CALL_OPS or not loaded:
            return False
        last = loaded[-1] if loaded[-1].opname != "PUSH_NULL" else (loaded[-2] if len(loaded) > 1 else loaded[-1])
        return last.argval in _QUERY_NAMES or _is_query(_resolve(frame, last))
    return False


def _resolve(frame: FrameType, ins: dis.Instruction) -> object:
    name = ins.argval
    if not isinstance(name, str):
        return None
    if ins.opname.startswith("LOAD_FAST") or ins.opname == "LOAD_DEREF":
        return frame.f_locals.get(name)
    if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
        builtins = frame.f_builtins
        return frame.f_globals.get(name, builtins.get(name) if isinstance(builtins, dict) else None)
    return None


def _asks_query(frame: FrameType) -> bool:
    """Whether the code running in ``frame`` asks the capture query anywhere."""
    code = frame.f_code
    names = (*code.co_names, *code.co_varnames, *code.co_freevars)
    if any(n in _QUERY_NAMES for n in names):
        return True
    return any(_is_query(frame.f_globals.get(n)) for n in code.co_names)


def _availability(original: Callable[[], bool]) -> Callable[[], bool]:
    def is_available() -> bool:
        answer = original()
        if answer:
            return answer
        rec = getattr(_tls, "recorder", None)
        if rec is None or not rec.capturing or rec._paused:
            return answer
        frame = sys._getframe(1)
        if _guards_query(frame):
            return True
        if _asks_query(frame):
            rec.note(f"{frame_location(frame)}: torch.cuda.is_available() answered False during capture on this "
                     "machine without CUDA, so a capture-query guard behind it cannot see the capture (the graph "
                     "holds the path taken when not capturing, where a GPU takes the capture path)")
        return answer

    is_available.__doc__ = original.__doc__
    is_available.__qualname__ = getattr(original, "__qualname__", "is_available")
    return is_available


AVAILABILITY: tuple[Any, str] = HOOKS.add(torch.cuda, "is_available", _availability)
"""The ``is_available`` hook, held while any recorder runs."""

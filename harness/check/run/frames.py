"""Where an exception that ended a run was raised, in the code a user can act on.

``KeyError: 4`` alone does not say which line of a design raised it. A run's traceback passes through the
harness's own machinery (the driver, the scheduler, the graph engine, the serving stack) before it reaches
the code under test; those frames are the same in every run and say nothing about the bug. Kept are:

- when the traceback passes through code outside the harness (a third-party design, backend or runner):
  those frames, the harness frame that called into them (where the harness handed over: which hook), and
  the innermost frame, where the exception was raised, even when that is the harness's (a design that
  passes the pool a bad index fails inside the pool);
- otherwise (a built-in subject failed): the frames of the built-in designs, backends and runners
  (``serving/designs.py``, ``backends/``, ``runners/``) and the innermost frame.

Frames of the standard library and of torch never count as the user's (``nn.Module.__call__`` adds two
frames to every module call); the innermost frame is kept wherever it is.

A frame in the harness's own files is keyed by function, its module's file and the qualified name
(``AttentionBackend.forward``), with no line (``line`` 0): results records then stay the same when the
harness's code moves, and code need not be ordered to keep line numbers still. A user's frame keeps its line.
"""

from __future__ import annotations

import importlib.util
import re
import sysconfig
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

FRAMES_KEPT = 16
"""the innermost frames kept of a deep traceback (a design recursing without end raises after ~1000)"""

_HARNESS = Path(__file__).resolve().parents[2]
_SUBJECT_HOMES = (_HARNESS / "backends", _HARNESS / "runners", _HARNESS / "serving" / "designs.py")
"""where the built-in designs, backends and runners live: code under test inside the harness package"""


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorFrame:
    """One frame of the traceback: the file, the line number in it, the function."""

    file: str
    line: int
    """0 for a frame of the harness's own code, which its function names alone"""
    function: str
    """the qualified name (``Class.method``) in the harness's code; the code object's name elsewhere"""


def subject_frames(tb: TracebackType | None) -> tuple[ErrorFrame, ...]:
    """The frames of ``tb`` a user needs (the module's rules), outermost first."""
    summary = traceback.extract_tb(tb)
    if not summary:
        return ()
    qualnames = [frame.f_code.co_qualname for frame, _ in traceback.walk_tb(tb)]
    places = [_place(f.filename) for f in summary]
    innermost = len(summary) - 1
    if "user" in places:
        caller = places.index("user") - 1  # the harness frame that called the user's code
        keep = {i for i, p in enumerate(places) if p == "user"} | {caller, innermost}
    else:
        keep = {i for i, p in enumerate(places) if p == "built-in subject"} | {innermost}
    frames = [_frame(f, places[i], qualnames[i]) for i, f in enumerate(summary) if i in keep]
    return tuple(frames[-FRAMES_KEPT:])


_DUMPED = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+|\?\?\?) in (?P<function>.*)$')


def dumped_frames(dump: str) -> tuple[ErrorFrame, ...]:
    """The frames a user needs (the module's rules) of a thread's stack as ``faulthandler`` dumps it (most
    recent call first, ``File "x.py", line 3 in f`` each), outermost first: where a run that timed out was."""
    found = [m for line in dump.splitlines() if (m := _DUMPED.match(line)) is not None][::-1]
    places = [_place(m["file"]) for m in found]
    # a dump holds the whole stack, the caller's too (pytest, xdist, the CLI, from before the run's process
    # forked): the run starts at the harness's outermost frame, and only what lies inside it is the run's
    start = next((i for i, p in enumerate(places) if p in ("harness", "built-in subject")), 0)
    found, places = found[start:], places[start:]
    if not found:
        return ()
    innermost = len(found) - 1
    if "user" in places:
        keep = {i for i, p in enumerate(places) if p == "user"} | {max(0, places.index("user") - 1), innermost}
    else:
        keep = {i for i, p in enumerate(places) if p == "built-in subject"} | {innermost}
    # faulthandler names a function, not its class: a harness frame keeps that name, without its line
    frames = [ErrorFrame(file=m["file"], line=0 if places[i] in ("harness", "built-in subject") else
                         int(m["line"]) if m["line"].isdigit() else 0, function=m["function"])
              for i, m in enumerate(found) if i in keep]
    return tuple(frames[-FRAMES_KEPT:])


def _frame(f: traceback.FrameSummary, place: str, qualname: str) -> ErrorFrame:
    if place in ("harness", "built-in subject"):
        return ErrorFrame(file=f.filename, line=0, function=qualname)
    return ErrorFrame(file=f.filename, line=f.lineno or 0, function=f.name)


def _place(filename: str) -> str:
    """"user" (code outside the harness and the libraries), "built-in subject", "harness" or "library\""""
    if filename.startswith("<frozen "):
        return "library"  # the standard library's frozen modules (``<frozen runpy>``)
    path = _resolved(filename)
    if path is None:
        return "user"  # ``<string>``: code a design compiled itself
    if _is_within(path, _HARNESS):
        return "built-in subject" if any(_is_within(path, home) for home in _SUBJECT_HOMES) else "harness"
    return "library" if _in_library(path) else "user"


def _resolved(filename: str) -> Path | None:
    if filename.startswith("<") and filename.endswith(">"):
        return None
    try:
        return Path(filename).resolve()
    except OSError:
        return None


def _is_within(path: Path, home: Path) -> bool:
    return path == home or home in path.parents


def _library_dirs() -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """(the standard library's and torch's folders, the folders third-party packages install into)"""
    paths = sysconfig.get_paths()
    libraries = {Path(paths[k]).resolve() for k in ("stdlib", "platstdlib") if k in paths}
    torch = importlib.util.find_spec("torch")  # found, not imported
    if torch is not None and torch.origin:
        libraries.add(Path(torch.origin).resolve().parent)
    installed = {Path(paths[k]).resolve() for k in ("purelib", "platlib") if k in paths}
    return tuple(libraries), tuple(installed)


_LIBRARIES, _INSTALLED = _library_dirs()


def _in_library(path: Path) -> bool:
    if any(_is_within(path, d) for d in _LIBRARIES if d.name == "torch"):
        return True
    # site-packages can sit inside the standard library's folder (a venv, a system Python): what is installed
    # there, a third-party design's package among it, is not the standard library
    if any(_is_within(path, d) for d in _INSTALLED):
        return False
    return any(_is_within(path, d) for d in _LIBRARIES)

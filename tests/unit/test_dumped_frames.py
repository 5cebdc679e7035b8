"""Where a run that timed out was: the frames of its main thread's faulthandler dump that belong to the run.

The dump holds the whole stack of the run's process, the caller's frames too (pytest or xdist or the CLI,
from before the fork): those differ between a serial and an xdist session and say nothing about the run."""

from __future__ import annotations

from pathlib import Path

import pluggy

import harness
from harness.check.run.frames import dumped_frames

HARNESS = Path(harness.__file__).resolve().parent
PLUGGY = Path(pluggy.__file__).resolve().parent


def _dump(frames: list[tuple[Path | str, int, str]]) -> str:
    """faulthandler's format: the current thread's frames, most recent call first."""
    lines = ["Current thread 0x00007f (most recent call first):"]
    lines += [f'  File "{file}", line {line} in {function}' for file, line, function in reversed(frames)]
    return "\n".join(lines) + "\n"


def _stack(caller: list[tuple[Path | str, int, str]]) -> str:
    return _dump([*caller,
                  (HARNESS / "check" / "run" / "workers.py", 190, "_child"),
                  (HARNESS / "check" / "run" / "drive.py", 60, "_execute"),
                  ("/home/me/designs.py", 19, "hangs")])


def test_the_callers_frames_before_the_run_are_left_out_so_serial_and_xdist_runs_agree():
    serial = _stack([(PLUGGY / "_manager.py", 595, "<lambda>"), (PLUGGY / "_callers.py", 103, "_multicall")])
    xdist = _stack([(PLUGGY / "_callers.py", 103, "_multicall"), ("/venv/site-packages/xdist/remote.py", 206, "run")])
    assert dumped_frames(serial) == dumped_frames(xdist)
    frames = dumped_frames(serial)
    assert [f.function for f in frames] == ["_execute", "hangs"]  # the harness frame that called in, the design
    assert frames[-1].line == 19 and frames[0].line == 0  # a harness frame keeps no line


def test_a_dump_with_no_harness_frame_keeps_what_it_has():
    frames = dumped_frames(_dump([("/home/me/designs.py", 19, "hangs")]))
    assert [(f.function, f.line) for f in frames] == [("hangs", 19)]
    assert dumped_frames("") == ()

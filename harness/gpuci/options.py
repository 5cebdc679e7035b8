"""Argument checks the GPU tools share (``python -m harness.gpuci``, ``scripts/pack_flashinfer.py``).

A GPU CI job is set up once and then runs unattended on a machine nobody watches: a limit that can never
trigger (``nan``, ``-1``), a step name that matches no step or an output folder that cannot be written would
otherwise surface an hour later as a traceback or as a limit silently ignored. Each check is an argparse
``type`` or returns the problem as one line, so every mistake is refused before anything runs, with the
usage line and exit status 2 as the main command line refuses its own.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from ..imports import unknown_name

__all__ = ["output_file_problem", "output_folder_problem", "seconds", "step_seconds"]


def seconds(text: str) -> float:
    """A positive, finite number of seconds (``nan``, ``inf`` and negative limits never end or never start)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive, finite number of seconds, got {text!r}")
    return value


def step_seconds(steps: Iterable[str]) -> Callable[[str], tuple[str, float]]:
    """An argparse ``type`` for ``STEP=SECONDS`` that knows the steps: a limit on a step that does not exist
    would never apply."""
    known = tuple(steps)

    def check(text: str) -> tuple[str, float]:
        name, sep, value = text.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected STEP=SECONDS, got {text!r}")
        if name not in known:
            raise argparse.ArgumentTypeError(unknown_name("step", name, known))
        try:
            return name, seconds(value)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"{name}: {exc}") from None

    check.__name__ = "STEP=SECONDS"
    return check


def _blocking_ancestor(path: Path) -> Path | None:
    """The nearest existing ancestor of ``path`` that is not a folder (a file in the way), if any."""
    for parent in path.absolute().parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def output_folder_problem(path: Path, *, option: str = "--out") -> str | None:
    """Why ``path`` cannot hold the run's files (made if missing); None when a file was written there."""
    return _folder_problem(path, f"{option} {path}")


def _folder_problem(path: Path, label: str) -> str | None:
    if path.exists() and not path.is_dir():
        return f"{label}: {path} is not a folder"
    if (blocker := _blocking_ancestor(path)) is not None:
        return f"{label}: {blocker} is a file, not a folder"
    try:
        path.mkdir(parents=True, exist_ok=True)
        # a full disk or a read-only mount shows only when something is written and flushed
        with tempfile.TemporaryFile(dir=path) as probe:
            probe.write(b"\0" * 4096)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        return f"{label}: cannot write in {path} ({exc.strerror or exc})"
    return None


def output_file_problem(path: Path, *, option: str = "--out") -> str | None:
    """Why a file cannot be written at ``path``; None when its folder takes a file."""
    if path.is_dir():
        return f"{option} {path}: is a folder; name the file to write"
    if path.exists() and not path.is_file():
        return f"{option} {path}: is not a regular file"
    return _folder_problem(path.absolute().parent, f"{option} {path}")

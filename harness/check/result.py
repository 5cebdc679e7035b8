"""What one run produced: its per-step snapshots, the error that ended it, what its graph runner saw."""

from __future__ import annotations

from dataclasses import dataclass

from ..runners.observations import GraphObservations
from ..runspec import RunSpec
from .snapshot import KVSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class RunError:
    type: str
    message: str
    step: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    spec: RunSpec
    snapshots: tuple[KVSnapshot, ...]
    error: RunError | None = None
    observations: GraphObservations | None = None
    """None for eager runs, which capture nothing"""

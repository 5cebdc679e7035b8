"""What one run produced: its per-step snapshots and timeline, the error that ended it, what its graph
runner saw."""

from __future__ import annotations

from dataclasses import dataclass

from ...runners.observations import ForwardRecord, GraphObservations
from ...runspec import RunSpec
from ...serving.invariants import InvariantViolation
from ...serving.timeline import LiveToken, TokenKey
from .frames import ErrorFrame
from ..diff.snapshot import KVSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    """One step of a run's timeline as plain data: what the scheduler batched, how the runner ran it, what
    was freed after it. The report draws the timeline and the pool's slot map from these."""

    index: int
    kind: str
    """forward mode of the step's batch: "extend", "decode" or "draft\""""
    batch_size: int
    """real requests in the batch"""
    tokens: tuple[tuple[str, int], ...]
    """(rid, tokens written this step) per request, in batch order"""
    forwards: tuple[ForwardRecord, ...]
    """how each forward of the step ran (one, or one per draft step)"""
    written: tuple[LiveToken, ...]
    """the slots of the tokens written this step (``in_window`` as of the end of the step)"""
    evicted: tuple[TokenKey, ...] = ()
    """tokens that left the window after the step: their SWA slots freed"""
    finished: tuple[str, ...] = ()
    """requests freed after the step, their last token written"""
    aborted: tuple[str, ...] = ()
    """requests aborted before the step's batch was built"""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunError:
    type: str
    message: str
    step: int | None
    frames: tuple[ErrorFrame, ...] = ()
    """where it was raised, in the code under test, outermost first (``frames.subject_frames``); none for a
    run that died, timed out or broke an invariant"""


@dataclass(frozen=True, slots=True, kw_only=True)
class InvariantBreach:
    """The first step after which the pool invariants did not hold, and every one that broke then."""

    step: int
    violations: tuple[InvariantViolation, ...]

    def as_error(self) -> RunError:
        """The breach in the shape every renderer of errors shows: which invariant, pool, slot and step."""
        shown = "; ".join(map(str, self.violations[:3]))
        more = f" (and {len(self.violations) - 3} more)" if len(self.violations) > 3 else ""
        return RunError(type="InvariantViolation", message=f"{shown}{more}", step=self.step)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    spec: RunSpec
    snapshots: tuple[KVSnapshot, ...]
    error: RunError | None = None
    observations: GraphObservations | None = None
    """None for eager runs, which capture nothing"""
    steps: tuple[StepRecord, ...] = ()
    """the timeline of the steps that ran (the failing step of an error run included, as far as it got)"""
    breach: InvariantBreach | None = None
    """the pool invariants broke after this step; the run stopped there"""

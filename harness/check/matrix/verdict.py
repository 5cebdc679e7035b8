"""A verdict per run: ``match``, ``diverge`` or ``error`` (docs/design.md section 8). Data, and one plain line
(``summary``) for a test's assertion message; the report layer words it for people."""

from __future__ import annotations

from dataclasses import dataclass

from ...runners.observations import GraphObservations
from ...runspec import Outcome
from ..diff.diff import DiffResult, KVMismatch, MismatchCount, diff_runs
from ..run.oracle import tolerance
from ..run.result import RunError, RunResult, StepRecord

DETAIL_LIMIT = 200
"""mismatches a verdict keeps in full (in step order); ``counts`` covers all of them"""

__all__ = ["DETAIL_LIMIT", "MismatchCount", "Verdict", "judge"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    outcome: Outcome
    diff: DiffResult | None
    """None only when the reference itself could not run"""
    error: RunError | None
    observations: GraphObservations | None = None
    steps: tuple[StepRecord, ...] = ()
    """the subject run's timeline"""
    counts: tuple[MismatchCount, ...] = ()
    """mismatches per (step, pool, layer) over the whole run, beyond the ``DETAIL_LIMIT`` the diff keeps"""

    @property
    def first(self) -> KVMismatch | None:
        return self.diff.mismatches[0] if self.diff and self.diff.mismatches else None

    def summary(self) -> str:
        """The verdict in one line: the outcome, then the error or the first mismatch and how many there are."""
        if self.error is not None:
            at = f" at step {self.error.step}" if self.error.step is not None else ""
            return f"{self.outcome}{at}: {self.error.type}: {_one_line(self.error.message)}"
        first = self.first
        if first is None:
            return str(self.outcome)
        total = self.diff.total if self.diff is not None else 0
        return (f"{self.outcome}: first at step {first.step}: {first.classification} ({_one_line(first.detail)}); "
                f"{total} mismatch{'es' if total != 1 else ''}")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def judge(subject: RunResult, reference: RunResult) -> Verdict:
    """Compare a finished subject run with its reference run."""
    if reference.error is None and reference.breach is not None and subject.breach is not None:
        # the same invariant broken in the reference too: the code that broke it runs in both (a serving stack
        # or eviction policy of one's own), and the subject's breach is its verdict, not a failed reference
        return Verdict(outcome=Outcome.INVARIANT, diff=None, error=subject.breach.as_error(),
                       observations=subject.observations, steps=subject.steps)
    if reference.error is not None or reference.breach is not None:
        err = reference.error or reference.breach.as_error()
        return Verdict(
            outcome=Outcome.ERROR,
            diff=None,
            error=RunError(type=err.type, message=f"reference run failed: {err.message}", step=err.step,
                           frames=err.frames),
            observations=subject.observations,
            steps=subject.steps,
        )
    spec = subject.spec
    exact = spec.device == "cpu" and spec.backend == reference.spec.backend
    atol, rtol = (0.0, 0.0) if exact else tolerance(spec.model.dtype, spec.pool.kv_dtype)
    # The diff counts every mismatch per (step, pool, layer) and builds records for the first DETAIL_LIMIT
    # only: building them all to count them cost three times the diff at 10% of a 512 MiB cache bad.
    diff = diff_runs(
        subject.snapshots, reference.snapshots, exact=exact, atol=atol, rtol=rtol, limit=DETAIL_LIMIT,
    )
    common = {"diff": diff, "observations": subject.observations, "steps": subject.steps, "counts": diff.counts}
    if subject.error is not None:
        return Verdict(outcome=Outcome.ERROR, error=subject.error, **common)
    if subject.breach is not None:
        return Verdict(outcome=Outcome.INVARIANT, error=subject.breach.as_error(), **common)
    outcome = Outcome.DIVERGE if diff.total else Outcome.MATCH
    return Verdict(outcome=outcome, error=None, **common)


"""A verdict per run: ``match``, ``diverge`` or ``error`` (DESIGN.md section 6). Data only; the report
layer words it."""

from __future__ import annotations

from dataclasses import dataclass

from ..runners.observations import GraphObservations
from ..runspec import Outcome
from .diff import DiffResult, KVMismatch, diff_runs
from .oracle import tolerance
from .result import RunError, RunResult


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    outcome: Outcome
    diff: DiffResult | None
    """None only when the reference itself could not run"""
    error: RunError | None
    observations: GraphObservations | None = None

    @property
    def first(self) -> KVMismatch | None:
        return self.diff.mismatches[0] if self.diff and self.diff.mismatches else None


def judge(subject: RunResult, reference: RunResult) -> Verdict:
    """Compare a finished subject run with its reference run."""
    if reference.error is not None:
        err = reference.error
        return Verdict(
            outcome=Outcome.ERROR,
            diff=None,
            error=RunError(type=err.type, message=f"reference run failed: {err.message}", step=err.step),
            observations=subject.observations,
        )
    spec = subject.spec
    exact = spec.device == "cpu" and spec.backend == reference.spec.backend
    atol, rtol = (0.0, 0.0) if exact else tolerance(spec.model.dtype, spec.pool.kv_dtype)
    diff = diff_runs(
        subject.snapshots, reference.snapshots, layer_is_swa=spec.model.layer_is_swa, exact=exact, atol=atol, rtol=rtol
    )
    if subject.error is not None:
        return Verdict(outcome=Outcome.ERROR, diff=diff, error=subject.error, observations=subject.observations)
    outcome = Outcome.DIVERGE if diff.total else Outcome.MATCH
    return Verdict(outcome=outcome, diff=diff, error=None, observations=subject.observations)

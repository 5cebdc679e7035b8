"""A verdict per run: ``match``, ``diverge`` or ``error`` (DESIGN.md section 6)."""

from __future__ import annotations

from dataclasses import dataclass

from .diff import DiffResult, KVMismatch, diff_runs
from .oracle import tolerance
from .run import RunError, RunResult

OUTCOMES = ("match", "diverge", "error")


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    outcome: str
    """one of OUTCOMES"""
    diff: DiffResult | None
    """None only when the reference itself could not run"""
    error: RunError | None
    notes: tuple[str, ...] = ()

    @property
    def first(self) -> KVMismatch | None:
        return self.diff.mismatches[0] if self.diff and self.diff.mismatches else None

    def summary(self) -> str:
        if self.outcome == "error" and self.error is not None:
            at = f" at step {self.error.step}" if self.error.step is not None else ""
            return f"error{at}: {self.error.type}: {self.error.message}"
        if self.outcome == "diverge" and self.first is not None and self.diff is not None:
            f = self.first
            return (
                f"diverge: first at {f.where()}: {f.classification} ({f.detail}); "
                f"{self.diff.total} mismatches over {self.diff.mismatched_slots} slots"
            )
        return self.outcome


def judge(subject: RunResult, reference: RunResult) -> Verdict:
    """Compare a finished subject run with its reference run."""
    if reference.error is not None:
        err = reference.error
        return Verdict(
            outcome="error",
            diff=None,
            error=RunError(type=err.type, message=f"reference run failed: {err.message}", step=err.step),
            notes=subject.notes,
        )
    spec = subject.spec
    exact = spec.device == "cpu" and spec.backend == reference.spec.backend
    atol, rtol = (0.0, 0.0) if exact else tolerance(spec.model.dtype, spec.pool.kv_dtype)
    diff = diff_runs(
        subject.snapshots, reference.snapshots, layer_is_swa=spec.model.layer_is_swa, exact=exact, atol=atol, rtol=rtol
    )
    if subject.error is not None:
        return Verdict(outcome="error", diff=diff, error=subject.error, notes=subject.notes)
    return Verdict(outcome="diverge" if diff.total else "match", diff=diff, error=None, notes=subject.notes)

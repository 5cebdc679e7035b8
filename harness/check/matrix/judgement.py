"""How one run is judged, apart from which runs a matrix makes: what it should give, and ``judge_one``.

A ``Judgement`` is the expected verdict of one run and why; the matrix (``case.cases``) derives one per
cell from its scenario, and a caller with a single ``RunSpec`` (a fuzzer, a test) states one, or takes the
one the design's declaration implies (``declared_judgement``), and calls ``judge_one``: the run and its
reference, compared, and whether the expectation held.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...runspec import Outcome, RunSpec
from ...serving.designs import declared
from ..run.drive import execute
from .expect import INFORMATION, NO_EXPECTATION, holds
from ..run.result import RunResult
from .verdict import Verdict, judge


@dataclass(frozen=True, slots=True, kw_only=True)
class Judgement:
    """What one run should give, and why."""

    expected: str
    """an ``Outcome``, ``NO_EXPECTATION`` (whatever the run gives is unexpected) or ``INFORMATION`` (whatever
    it gives is as expected)"""
    why: str
    """the mechanism behind it, shown beside the verdict"""
    option: str | None = None
    """the ``--expect`` it came from (``like:DESIGN`` or an outcome) for a design the scenario does not list;
    None when the scenario states it"""
    by_default: bool = False
    """the default expectation of an added design (no ``--expect`` given): a rerun states none"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Judged:
    """One run judged against its reference, and whether that was what its judgement expected."""

    spec: RunSpec
    judgement: Judgement
    verdict: Verdict

    @property
    def held(self) -> bool:
        return holds(self.judgement.expected, self.verdict.outcome)

    def summary(self) -> str:
        """One line: the run, what was expected and what it gave."""
        s = self.spec
        faults = f" with {', '.join(sorted(s.faults))}" if s.faults else ""
        how = "as expected" if self.held else "unexpected"
        return (f"{s.design}/{s.mode} on {s.backend}{faults}: {how}: expected {self.judgement.expected}, got "
                f"{self.verdict.summary()}")


def declared_judgement(design: str) -> Judgement | None:
    """What a design's declaration says any clean run of it gives: a sound design matches the reference;
    a known-wrong one (or one that declares nothing) is left for the caller to state. Clean: the declaration
    says nothing of a run with faults switched on, which is its scenario's to judge."""
    record = declared(design)
    if record is None or not record.sound:
        return None
    return Judgement(expected=Outcome.MATCH, why=f"{record.name} is declared sound: {record.rule}")


def judge_one(spec: RunSpec, judgement: Judgement, *, reference: RunResult | None = None) -> Judged:
    """Run ``spec`` and its reference (or take ``reference``, already run) and judge it against ``judgement``.
    Never raises for the run's failure: that is an ``error`` verdict."""
    if reference is None:
        reference = execute(spec.reference())
    # the reference design's eager run of a clean spec is the reference run itself (runs are deterministic)
    subject = reference if spec == reference.spec else execute(spec)
    return Judged(spec=spec, judgement=judgement, verdict=judge(subject, reference))


__all__ = ["INFORMATION", "NO_EXPECTATION", "Judged", "Judgement", "declared_judgement", "judge_one"]

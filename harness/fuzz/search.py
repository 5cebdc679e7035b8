"""The search: Hypothesis draws runs of one target until its time budget is spent, judges each against the
eager reference, and shrinks every distinct failure to the smallest run that still fails the same way.

The property holds when the subject run gives ``match``: every live KV slot and hidden state equal to the
reference's at every step, and the pool invariants intact after every step (a breach is an ``invariant``
verdict, an exception an ``error`` one). A run that breaks it raises an exception whose type is its failure's
signature (``finding.signature``), which is how Hypothesis tells two failures apart: each is shrunk on its
own. Found failures are saved in Hypothesis's example database (one folder per target), so the next search
of the same target replays them before anything new.

Hypothesis has no time budget of its own: generation is stopped by an interrupt once the budget is spent
without a failure; once one is found, Hypothesis searches on a little (at most ten seconds) for others and
shrinks them, and shrinking is stopped the same way after ``shrink_s``, the smallest case so far kept.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..runspec import Outcome, RunSpec
from .finding import Finding, signature
from .target import FuzzTarget

DATABASE_DEFAULT = Path(".cache/fuzz")
"""the example database, one folder per target, under the project (ignored by git)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    tried: int
    """runs judged, shrink steps included"""
    failures: int
    """distinct failures (signatures) found so far"""
    shrink_steps: int
    """smaller failing runs found after each failure's first"""
    elapsed_s: float
    shrinking: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class FuzzReport:
    target: FuzzTarget
    seed: int
    budget_s: float
    tried: int
    shrink_steps: int
    elapsed_s: float
    findings: tuple[Finding, ...]
    first_failure: int | None
    """the example (counted from 1) that failed first; None when none did"""
    stopped: str
    """why the search ended: its budget, Hypothesis's own end, or the shrink limit"""


CAMPAIGN_NODEID = "harness/fuzz/campaign.py::test_property"
"""the campaign's test as pytest names it from the project's root, which HypoFuzz mixes into its database key"""

SLOW_AND_FILTERED = ("too_slow", "filter_too_much", "data_too_large", "large_base_example")
"""the health checks a property over whole runs fails by its nature: each example is a run of tenths of a second,
and the dry run refuses some drawn timelines (HypoFuzz refuses a test that suppresses any other)"""


class _Interrupt(KeyboardInterrupt):
    """Ends Hypothesis's run where it stands. A KeyboardInterrupt, because that is what Hypothesis lets through
    without recording the example it interrupted as a failure."""


class PropertyFailed(AssertionError):
    """A run that did not match its reference; a subclass per signature (``_failure``)."""


_FAILURES: dict[str, type[PropertyFailed]] = {}


def _failure(sig: str) -> type[PropertyFailed]:
    if sig not in _FAILURES:
        name = "Failed_" + re.sub(r"\W+", "_", sig)[:60]
        _FAILURES[sig] = type(name, (PropertyFailed,), {"__module__": __name__})
    return _FAILURES[sig]


@dataclass(slots=True)
class SearchState:
    """A search's clock and tally, whatever its property: each example is judged by ``judge`` (None: it held;
    else its failure's signature, what it gave and the message to fail with), counted, shown to ``progress``, and
    the property told to fail or stop (``_Interrupt``: the budget spent before a failure, or the shrinking's
    after one)."""

    judge: Callable[[Any], tuple[str, object, str] | None]
    budget_s: float
    shrink_s: float
    progress: Callable[[Progress], None] | None
    shrink_examples: int | None = None
    start: float = field(default_factory=time.perf_counter)
    tried: int = 0
    shrink_steps: int = 0
    first_failure_at: float | None = None
    first_failure: int | None = None
    found: dict[str, list] = field(default_factory=dict)
    """signature -> [smallest example so far, what it gave, failing examples seen]"""

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def check(self, example: Any) -> None:
        failure = self.judge(example)
        self.tried += 1
        if failure is not None:
            sig, gave, _ = failure
            seen = self.found.get(sig)
            self.found[sig] = [example, gave, 1 if seen is None else seen[2] + 1]
            self.shrink_steps += seen is not None
            if self.first_failure_at is None:
                self.first_failure_at, self.first_failure = self.elapsed(), self.tried
        if self.progress is not None:
            self.progress(Progress(tried=self.tried, failures=len(self.found), shrink_steps=self.shrink_steps,
                                   elapsed_s=self.elapsed(), shrinking=self.first_failure_at is not None))
        if failure is not None:
            raise _failure(failure[0])(failure[2])
        if self.first_failure_at is None and self.elapsed() > self.budget_s:
            raise _Interrupt("budget")
        if self.first_failure_at is not None and (self.elapsed() - self.first_failure_at > self.shrink_s or (
                self.shrink_examples is not None and self.tried - self.first_failure >= self.shrink_examples)):
            raise _Interrupt("shrink")

    def run(self, search: Callable[[], None]) -> tuple[str, list[tuple[str, list]]]:
        """Run the Hypothesis test ``search`` (whose property calls ``check``): why it stopped, and the
        ``found`` entries to report. After every failure was shrunk, what Hypothesis reports is what it shrank:
        a signature met only on the way (a shrink step that failed another way) keeps its first, unshrunk case
        and is left out; a search cut short reports every signature it met."""
        try:
            search()
        except _Interrupt as interrupt:
            stopped = "the budget" if str(interrupt) == "budget" else "the shrink limit (smallest case so far kept)"
            return stopped, list(self.found.items())
        except (PropertyFailed, BaseExceptionGroup) as failure:
            shrunk = {sig for e in _leaves(failure) for sig, cls in _FAILURES.items() if type(e) is cls}
            return "every failure shrunk", [(sig, entry) for sig, entry in self.found.items() if sig in shrunk]
        return "Hypothesis ended its search", list(self.found.items())


def search_settings(*, max_examples: int | None, multiple: bool) -> dict[str, Any]:
    """Hypothesis settings every search runs under (on top of ``property_test``'s or a property's own)."""
    from hypothesis import Phase, Verbosity

    return dict(max_examples=max_examples or 1_000_000, report_multiple_bugs=multiple, verbosity=Verbosity.quiet,
                print_blob=False, phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink))


def _judge_against_reference(target: FuzzTarget) -> Callable[[RunSpec], tuple[str, object, str] | None]:
    from ..check.matrix.judgement import Judgement, judge_one

    def judge(spec: RunSpec) -> tuple[str, object, str] | None:
        verdict = judge_one(spec, Judgement(expected=Outcome.MATCH, why="the fuzzed property")).verdict
        if verdict.outcome == Outcome.MATCH:
            return None
        return signature(verdict), verdict, f"{target.label}: {verdict.summary()}"

    return judge


def fuzz(
    target: FuzzTarget,
    *,
    budget_s: float,
    seed: int = 0,
    database: Path | None = DATABASE_DEFAULT,
    shrink_s: float | None = None,
    multiple: bool = True,
    max_examples: int | None = None,
    shrink_examples: int | None = None,
    progress: Callable[[Progress], None] | None = None,
) -> FuzzReport:
    """Search ``target`` for ``budget_s`` seconds from ``seed``; every distinct failure found, shrunk.

    ``database`` None keeps the examples in memory only (a test's choice: nothing it finds outlives it);
    ``shrink_s`` bounds the shrinking after the first failure (default: the budget again); ``multiple`` False
    stops at the first failure and shrinks that one only (a test's choice: faster); ``max_examples`` ends the
    search after that many valid examples, whatever the budget left, and ``shrink_examples`` the shrinking
    after that many examples past the first failure (a test's choice: the same examples and the same shrunk
    case on any machine, however loaded)."""
    from hypothesis.database import DirectoryBasedExampleDatabase, InMemoryExampleDatabase

    from ..check.matrix.matrix import limit_threads

    if problems := target.problems():
        raise ValueError("; ".join(problems))
    limit_threads()  # tiny tensors: torch's intra-op threads only contend with each other
    state = SearchState(judge=_judge_against_reference(target), budget_s=budget_s,
                        shrink_s=budget_s if shrink_s is None else shrink_s, progress=progress,
                        shrink_examples=shrink_examples)
    db = InMemoryExampleDatabase() if database is None else DirectoryBasedExampleDatabase(
        str(database_folder(target, database)))

    search = property_test(target, state.check, database=db, seed=seed,
                           **search_settings(max_examples=max_examples, multiple=multiple))
    stopped, found = state.run(search)
    findings = tuple(Finding(target=target, signature=sig, spec=spec, verdict=verdict, examples=count)
                     for sig, (spec, verdict, count) in found)
    return FuzzReport(target=target, seed=seed, budget_s=budget_s, tried=state.tried,
                      shrink_steps=state.shrink_steps, elapsed_s=state.elapsed(), findings=findings,
                      first_failure=state.first_failure, stopped=stopped)


@dataclass(frozen=True, slots=True, kw_only=True)
class PropertyReport:
    """What a search of a target's own property (``search_property``) ended with; ``findings`` are the
    property's own finding objects."""

    seed: int
    budget_s: float
    tried: int
    shrink_steps: int
    elapsed_s: float
    findings: tuple[Any, ...]
    first_failure: int | None
    stopped: str


def search_property(strategy: Any, judge: Callable[[Any], tuple[str, object, str] | None], *,
                    finding: Callable[[str, Any, object, int], Any], folder: str, budget_s: float, seed: int = 0,
                    database: Path | None = DATABASE_DEFAULT, shrink_s: float | None = None, multiple: bool = True,
                    max_examples: int | None = None, shrink_examples: int | None = None,
                    progress: Callable[[Progress], None] | None = None) -> PropertyReport:
    """Search a target's own property: every example ``strategy`` draws is judged by ``judge`` (``SearchState``'s
    contract) for ``budget_s`` seconds from ``seed``, each distinct failure shrunk and made a finding by
    ``finding(signature, example, what it gave, examples)``; the examples are kept under ``database / folder``.
    The options are ``fuzz``'s."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis.database import DirectoryBasedExampleDatabase, InMemoryExampleDatabase

    state = SearchState(judge=judge, budget_s=budget_s, shrink_s=budget_s if shrink_s is None else shrink_s,
                        progress=progress, shrink_examples=shrink_examples)
    db = InMemoryExampleDatabase() if database is None else DirectoryBasedExampleDatabase(str(database / folder))

    def target_property(example: Any) -> None:
        state.check(example)

    search = settings(database=db, deadline=None, suppress_health_check=[HealthCheck[h] for h in SLOW_AND_FILTERED],
                      **search_settings(max_examples=max_examples, multiple=multiple))(
        hypothesis_seed(seed)(given(strategy)(target_property)))
    stopped, found = state.run(search)
    return PropertyReport(seed=seed, budget_s=budget_s, tried=state.tried, shrink_steps=state.shrink_steps,
                          elapsed_s=state.elapsed(), first_failure=state.first_failure, stopped=stopped,
                          findings=tuple(finding(sig, example, gave, n) for sig, (example, gave, n) in found))


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for e in error.exceptions for leaf in _leaves(e)]
    return [error]


def property_test(target: FuzzTarget, check: Callable[[RunSpec], None], *, database, seed: int | None = None,
                  **options) -> Callable[[], None]:
    """The Hypothesis test of ``target``'s property: ``check`` on every generated run. The search and a HypoFuzz
    campaign (``campaign.py``) build theirs here, so both have the same database key (Hypothesis derives it
    from this function's source and ``CAMPAIGN_NODEID``) and what one finds in a target's folder the other
    replays."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed

    from .strategies import run_specs

    def fuzz_property(spec: RunSpec) -> None:
        check(spec)

    # HypoFuzz adds the pytest node id of the test it fuzzes to the key (it sets this attribute, which Hypothesis's
    # own pytest plugin sets only for a parametrized test); every property carries the campaign's, so the search,
    # a campaign under plain pytest and one under HypoFuzz all read and write the same key
    fuzz_property._hypothesis_internal_add_digest = CAMPAIGN_NODEID.encode()  # type: ignore[attr-defined]
    test = given(run_specs(target))(fuzz_property)
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    # settings outermost: @seed applied over them would switch the database off (it assumes a replay of one
    # reported failure), and a seeded search that keeps its findings is what we want
    return settings(database=database, deadline=None, suppress_health_check=[HealthCheck[h] for h in SLOW_AND_FILTERED],
                    **options)(test)


def database_folder(target: FuzzTarget, root: Path = DATABASE_DEFAULT) -> Path:
    """Where ``target``'s examples are kept."""
    return root / _folder(target)


def _folder(target: FuzzTarget) -> str:
    over = [target.serving] if target.serving != "miniature" else []
    parts = [target.design, str(target.mode), target.backend, *over, *sorted(target.faults)]
    return re.sub(r"[^\w.-]+", "_", "-".join(parts))


def progress_printer(label: str, tty: bool):
    """A ``progress`` callback: one line on stderr, redrawn on a terminal, every five seconds elsewhere."""
    import sys

    shown = [-10.0]

    def progress(p: Progress) -> None:
        if not tty and p.elapsed_s - shown[0] < 5:
            return
        shown[0] = p.elapsed_s
        phase = "shrinking" if p.shrinking else "searching"
        line = (f"fuzz {label}: {phase}: {p.tried} examples tried, {p.failures} distinct "
                f"failure{'s' if p.failures != 1 else ''}, {p.shrink_steps} shrink steps, {p.elapsed_s:.0f}s")
        sys.stderr.write(("\r\033[K" + line) if tty else line + "\n")
        sys.stderr.flush()

    return progress


def print_findings(label: str, report: Any, *, tty: bool, write: Callable[[Any], Path | None] | None,
                   already: Callable[[Any], str]) -> int:
    """What a search ends with, whatever its property: the tally, then each finding and where it was written
    (``write`` None: not written; it returns None for a signature already on disk, ``already`` says where).
    Returns the exit status: 1 when something was found."""
    import sys

    if tty:
        sys.stderr.write("\r\033[K")
    n = len(report.findings)
    print(f"fuzz {label}: {report.tried} examples in {report.elapsed_s:.1f}s, stopped by {report.stopped}; "
          f"{n} distinct failure{'s' if n != 1 else ''}, {report.shrink_steps} shrink steps"
          + (f", the first failure at example {report.first_failure}" if report.first_failure else ""))
    for finding in report.findings:
        print(finding.describe())
        if write is None:
            continue
        path = write(finding)
        print(f"  written: {path}" if path is not None else f"  already written (same signature): {already(finding)}")
    return 1 if report.findings else 0


__all__ = ["CAMPAIGN_NODEID", "DATABASE_DEFAULT", "FuzzReport", "Progress", "PropertyFailed", "PropertyReport",
           "SearchState", "database_folder", "fuzz", "print_findings", "progress_printer", "property_test",
           "search_property", "search_settings"]

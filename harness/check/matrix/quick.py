"""The quick selection: the cells of a scenario that ``make test`` (and ``harness run --quick``) runs.

A scenario's matrix repeats itself: most designs give the same verdict in every mode, and a scenario's other
backends read the same pools by other routes. The quick selection keeps what the full matrix can tell that
nothing else in the quick one already tells: on the scenario's first backend, with its faults on, each
design's every distinct expected verdict once, in the first mode of ``PREFERENCE`` that expects it. A graph mode
comes first because a graph run also runs the steps its graphs do not take eagerly (a full-graph run's
prefills, a piecewise run's decodes), so a design's sound eager path is exercised there too.

So a design that matches everywhere is run once, under full graphs; one that diverges only under graphs is run
in a graph mode and in eager mode. The rest (the same verdict again in another mode, the other backends, a
fault scenario's clean reruns) is the full suite's: ``make test-slow`` runs exactly that, and CI runs both.

A case its backend cannot run (a skip) stands for nothing: the next mode with that verdict is taken, and the
skip itself is kept (it costs nothing and says why). So is a case whose declarations are broken (an error).
"""

from __future__ import annotations

from collections.abc import Iterable

from ...runspec import Mode
from .case import Case

PREFERENCE = (Mode.FULL, Mode.PIECEWISE, Mode.EAGER)
"""the mode that stands for a verdict, first choice first"""


def _rank(mode: str) -> int:
    return PREFERENCE.index(Mode(mode)) if mode in tuple(Mode) else len(PREFERENCE)


def quick_names(cases: Iterable[Case]) -> frozenset[str]:
    """The names of the cases the quick selection keeps, of the cases of any number of scenarios."""
    keep: set[str] = set()
    stands: dict[tuple[object, ...], str] = {}
    for case in sorted(cases, key=lambda c: _rank(c.mode)):  # stable: the scenario's own order otherwise
        if case.backend != case.scenario.backends[0] and case.backend in case.scenario.backends:
            continue  # a listed other backend; a backend added on the command line is the one under test
        if case.scenario.faults and not case.with_faults:
            continue
        if case.unsupported is not None or case.declaration_error is not None:
            keep.add(case.name)
            continue
        group = (case.scenario.path, case.scenario.name, case.design, case.backend, case.engine, case.device,
                 case.runner, case.expected)
        if group not in stands:
            stands[group] = case.name
            keep.add(case.name)
    return frozenset(keep)


def quick(cases: Iterable[Case]) -> list[Case]:
    """The cases the quick selection keeps, in their own order."""
    listed = list(cases)
    names = quick_names(listed)
    return [c for c in listed if c.name in names]


__all__ = ["PREFERENCE", "quick", "quick_names"]

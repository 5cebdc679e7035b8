"""What a design added on the command line is expected to give: one verdict for every run, or ``like:DESIGN``.

Apart from ``case`` so that the command line judges ``--expect`` and ``--harness-expect`` without importing
the run machinery (torch): an option error comes back at once.
"""

from __future__ import annotations

from ...imports import is_import_path, unknown_name
from ...runspec import REFERENCE_DESIGN, Outcome
from ...serving.designs import DESIGNS

NO_EXPECTATION = "no expectation"
"""the expected verdict of a run nobody stated one for: whatever it gives is unexpected"""
LIKE = "like:"
"""``like:DESIGN``: an added design is expected to give, run by run, what the scenario expects of DESIGN"""
EXPECT_DEFAULT = f"{LIKE}{REFERENCE_DESIGN}"
"""what an added design is expected to give when nobody says: what the reference design gets, run by run, on
runs without faults; under a fault scenario's faults, ``INFORMATION`` (a fault that corrupts the reference
design's inputs may never reach a design that computes them itself), its faults-off rerun judged"""
INFORMATION = "information"
"""the expectation of an added design's run under a fault scenario's faults when nobody states one: no verdict
is known, so whatever it gives is as expected and says whether the fault reaches the design (``holds``)"""

_IMPORT_PATH = "an import path 'package.module:function'"


def holds(expected: str, outcome: str) -> bool:
    """Whether a run that gave ``outcome`` gave what was ``expected`` of it (an ``INFORMATION`` run always does)."""
    return expected == INFORMATION or outcome == expected


def expect_problem(expect: str) -> str | None:
    """Why ``expect`` is not an expectation of added designs (an outcome or ``like:DESIGN``); None when it is."""
    if expect in tuple(Outcome):
        return None
    design = expect[len(LIKE):] if expect.startswith(LIKE) else None
    if design is not None and (design in DESIGNS or is_import_path(design)):
        return None
    if design is not None:
        return f"like:{design}: {unknown_name('design', design, DESIGNS, also=_IMPORT_PATH)}"
    return (f"expected one of {', '.join(map(str, Outcome))}, or {LIKE}DESIGN (what the scenario expects of "
            f"DESIGN there), got {expect!r}")

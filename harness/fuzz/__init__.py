"""Property-based timeline fuzzing: Hypothesis draws valid runs of one design, mode, backend and fault set,
each is judged against the eager reference, and a failure is shrunk to a small readable case and written out
as a regression scenario (docs/fuzzing.md).

``fuzz(target, budget_s=..., seed=...)`` searches; ``write_regression`` turns a finding into a scenario file.
"""

from .finding import Finding, signature
from .regression import REGRESSIONS_DEFAULT, write_regression
from .search import DATABASE_DEFAULT, FuzzReport, Progress, fuzz
from .target import FuzzTarget

__all__ = ["DATABASE_DEFAULT", "REGRESSIONS_DEFAULT", "Finding", "FuzzReport", "FuzzTarget", "Progress", "fuzz",
           "signature", "write_regression"]

"""Property-based timeline fuzzing: Hypothesis draws valid runs of one design, mode, backend and fault set,
each is judged against the eager reference, and a failure is shrunk to a small readable case and written out
as a regression scenario (docs/fuzzing.md).

``fuzz(target, budget_s=..., seed=...)`` searches; ``write_regression`` turns a finding into a scenario file.
The names are loaded at first use: the command line's parser and a target's registration read
``fuzz.properties`` without importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"Finding": "finding", "signature": "finding", "REGRESSIONS_DEFAULT": "regression",
            "write_regression": "regression", "DATABASE_DEFAULT": "search", "FuzzReport": "search",
            "Progress": "search", "fuzz": "search", "FuzzTarget": "target"}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)


__all__ = ["DATABASE_DEFAULT", "REGRESSIONS_DEFAULT", "Finding", "FuzzReport", "FuzzTarget", "Progress", "fuzz",
           "signature", "write_regression"]

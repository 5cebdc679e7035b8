"""Parameter sweeps split between the quick suite and the full one (tests/README.md, "By cost").

``each_choice`` keeps in ``make test`` a covering subset of a cross product: every value of every factor in at
least one kept combination (the first combinations that bring a value not yet covered); every other
combination carries the slow mark, so ``make test-slow`` runs the whole product. ``seeds`` does the same for a
range of random seeds: every ``stride``-th seed quick, the rest slow.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import pytest


def each_choice(*factors: Sequence[Any]) -> list[Any]:
    """``pytest.param``s of the product of ``factors`` (each a sequence of values, a value a tuple where one
    factor fills several arguments), flattened in argument order; those not in the covering subset are slow."""
    covered: list[set[int]] = [set() for _ in factors]
    out = []
    for combo in itertools.product(*(range(len(f)) for f in factors)):
        new = any(i not in covered[k] for k, i in enumerate(combo))
        for k, i in enumerate(combo):
            covered[k].add(i)
        values: list[Any] = []
        for f, i in zip(factors, combo):
            values.extend(f[i] if isinstance(f[i], tuple) else (f[i],))
        out.append(pytest.param(*values, marks=() if new else (pytest.mark.slow,)))
    return out


def seeds(values: Iterable[int], *, stride: int) -> list[Any]:
    """``pytest.param`` per seed; every ``stride``-th one (the first included) quick, the rest slow."""
    return [pytest.param(s, marks=() if k % stride == 0 else (pytest.mark.slow,)) for k, s in enumerate(values)]

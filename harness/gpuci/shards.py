"""The shards' plan: what each machine of a CI matrix would run, before any of them runs it.

``python -m harness.gpuci --dry-run --splits N`` (``make gpu-plan SPLITS=N``) collects each pytest step's items
once, as the step selects them (its paths, ``-m``, ``-k``), and splits them with pytest-split's own algorithm
over the recorded durations, the function the plugin calls in every shard: the table shows each shard's
item count, estimated seconds and first and last item, so an unbalanced or empty shard shows before a
matrix of GPU machines is booked.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

__all__ = ["Shard", "collect", "split"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Shard:
    group: int
    """1 to the number of splits"""
    items: tuple[str, ...]
    """node ids, in collection order"""
    estimated_s: float


def split(node_ids: Sequence[str], durations: dict[str, float], *, splits: int, algorithm: str) -> list[Shard]:
    """The shards pytest-split makes of these items (an item without a recorded duration counts the average)."""
    from pytest_split.algorithms import Algorithms

    items = [SimpleNamespace(nodeid=n) for n in node_ids]  # the algorithm reads only the node id
    groups = Algorithms[algorithm].value(splits, items, durations)
    return [Shard(group=i, items=tuple(it.nodeid for it in g.selected), estimated_s=g.duration)
            for i, g in enumerate(groups, 1)]


def collect(python: str, selection: Sequence[str]) -> list[str]:
    """The node ids pytest collects for a step's selection, in order."""
    done = subprocess.run([python, "-m", "pytest", *selection, "--collect-only", "-q", "-p", "no:randomly"],
                          capture_output=True, text=True, timeout=600)
    if done.returncode not in (0, 5):  # 5: nothing selected
        raise RuntimeError(f"collecting {' '.join(selection)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return [line.strip() for line in done.stdout.splitlines() if "::" in line and not line.startswith(" ")]


def read_durations(path: Path) -> dict[str, float]:
    """pytest-split's durations file; empty where there is none yet."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


def lines(step: str, shards: Sequence[Shard]) -> list[str]:
    """The dry run's table of one step's shards."""
    out = [f"   {step}:"]
    for s in shards:
        span = f"{s.items[0]} .. {s.items[-1]}" if s.items else "(empty)"
        out.append(f"     shard {s.group}: {len(s.items)} items, ~{s.estimated_s:.0f} s: {span}")
    return out

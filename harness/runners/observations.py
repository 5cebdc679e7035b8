"""What a graph runner saw during a run, as data: counts and the input audit's findings.

The runner records; the report layer words it. Nothing here holds a tensor, so a run's observations
travel to pytest-xdist's controller and into JSON unchanged.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class FindingKind(enum.StrEnum):
    UNREGISTERED = "unregistered"
    """the graph reads a tensor that no registered static buffer, weight or pool accounts for"""
    STALE = "stale"
    """at replay an attribute holds another tensor than the one the graph captured, and nothing refreshes
    the captured one: the graph reads old data"""
    MOVED = "moved"
    """the tensor the graph captured now has another storage, offset, size or stride (``t.data = ...``,
    ``set_``, ``resize_``): the program reads new memory, the graph the old"""


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditFinding:
    kind: FindingKind
    graph: str
    """the captured graph's label, the dispatcher's name for it (``decode/bs4``)"""
    path: str | None
    """the attribute path that held the tensor (``pool.swa_loc``), None when no root reaches it"""
    dtype: str
    shape: tuple[int, ...]
    replays: int = 0
    """replays at which a stale or rebound input was seen (0 for unregistered inputs, found at capture)"""
    captured: str = ""
    """the tensor the graph captured, described"""
    now: str = ""
    """what the attribute held at the first stale replay"""


class ForwardPath(enum.StrEnum):
    """How one forward reached the model."""

    EAGER = "eager"
    """the runner has no graph for this kind of batch (an eager run, or an extend batch under decode graphs)"""
    FALLBACK = "fallback"
    """the runner has graphs for this kind of batch, but no bucket holds it: run eagerly"""
    REPLAY = "replay"
    """a captured graph replayed, padded when ``rows`` is below ``bucket``"""


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardRecord:
    """One forward of a step, as the runner ran it (a draft step runs several)."""

    path: ForwardPath
    rows: int
    """real rows: requests for a decode graph, tokens for a prefill graph or an eager forward"""
    bucket: int | None = None
    """the replayed graph's bucket, in the same unit as ``rows``; None when not replayed"""
    captured: bool = False
    """the graph was captured for this forward (on-demand capture) rather than at startup"""
    graph: str | None = None
    """the graph the forward used, as the dispatcher and ``AuditFinding.graph`` name it (``decode/bs4``: which
    findings bear on this forward), ``eager`` for a forward no graph took; None in records written before"""


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphObservations:
    captures: int = 0
    replays: int = 0
    padded_replays: int = 0
    eager_fallbacks: int = 0
    """batches no bucket fitted, run eagerly"""
    findings: tuple[AuditFinding, ...] = ()
    rerun_ops: tuple[str, ...] = ()
    """custom ops the graph engine replays by calling them again, Python body included, because their work is
    invisible to the dispatcher (an FFI kernel launch); the tape only"""
    notes: tuple[str, ...] = ()
    """what the graph engine could not model and says instead of staying silent (a capture-query guard that
    cannot see the capture on a machine without CUDA), once each"""
    forwards: tuple[tuple[str, int], ...] = ()
    """(graph name, forwards that used it) in first-use order, ``eager`` for the forwards no graph took"""

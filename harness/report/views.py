"""View models of a run's results: plain data, no tensors, built once and rendered many ways.

The terminal failure block, the run table, the verdict matrix, the JSON records and CSV (and the HTML
pages) are renderers of these. A ``CaseView`` round-trips through its JSON record, which is how results
cross from pytest-xdist workers to the controller without loss.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

RECORD_VERSION = 1
"""schema version of a JSON record; bumped when a field changes meaning or goes away"""


@dataclass(frozen=True, slots=True, kw_only=True)
class MismatchView:
    step: int
    pool: str
    """"full", "swa" or "hidden\""""
    layer: int | None
    slot: int | None
    owner: str
    """``rid@pos`` of the token that owns the slot"""
    what: str
    classification: str
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorView:
    type: str
    message: str
    step: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class FindingView:
    kind: str
    """"unregistered", "stale" or "rebound" (benign)"""
    graph: str
    path: str | None
    dtype: str
    shape: tuple[int, ...]
    replays: int
    captured: str
    now: str


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphView:
    captures: int
    replays: int
    padded_replays: int
    eager_fallbacks: int
    findings: tuple[FindingView, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseView:
    name: str
    """the pytest item name, ``scenario[design-mode-backend]``"""
    scenario: str
    path: str
    description: str
    tags: tuple[str, ...]
    design: str
    mode: str
    backend: str
    engine: str
    device: str
    faults: tuple[str, ...]
    expected: str
    verdict: str
    """an outcome, or "skipped" when the backend cannot run the case"""
    why: str
    skip_reason: str | None
    mismatches: int
    mismatched_slots: int
    classes: tuple[tuple[str, int], ...]
    dummy_writes: int
    steps_compared: int
    first: MismatchView | None
    details: tuple[MismatchView, ...]
    """the first mismatches in step order (the first one included), as many as the diff kept"""
    error: ErrorView | None
    graph: GraphView | None
    reproduce_pytest: str
    """a shell command line, quoted"""
    reproduce_cli: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.skip_reason is not None or self.verdict == self.expected

    @property
    def unexpected_pass(self) -> bool:
        return self.verdict == "match" and self.expected != "match"

    def to_record(self) -> dict[str, Any]:
        """The JSON record (documented in README's "results.json" section)."""
        record = dataclasses.asdict(self)
        record["version"] = RECORD_VERSION
        record["ok"] = self.ok
        record["first_divergent_step"] = self.first.step if self.first else None
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> CaseView:
        data = {f.name: record[f.name] for f in dataclasses.fields(cls)}
        data["tags"] = tuple(data["tags"])
        data["faults"] = tuple(data["faults"])
        data["classes"] = tuple((str(k), int(n)) for k, n in data["classes"])
        data["first"] = _mismatch(data["first"])
        data["details"] = tuple(_mismatch(m) for m in data["details"])
        data["error"] = ErrorView(**data["error"]) if data["error"] else None
        if data["graph"]:
            g = dict(data["graph"])
            g["findings"] = tuple(FindingView(**{**f, "shape": tuple(f["shape"])}) for f in g["findings"])
            data["graph"] = GraphView(**g)
        return cls(**data)


def _mismatch(record: dict[str, Any] | None) -> MismatchView | None:
    return MismatchView(**record) if record else None

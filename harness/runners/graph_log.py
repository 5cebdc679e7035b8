"""What graph runners observe: inputs the audit could not account for, and stale inputs at replay."""

from __future__ import annotations

from collections import Counter

from ..graphs import CapturedGraph, StaleInput


class GraphLog:
    def __init__(self) -> None:
        self._lines: list[str] = []
        self._stale: Counter[tuple[str, str]] = Counter()
        self.captures = 0
        self.replays = 0
        self.eager_fallbacks = 0

    def captured(self, graph: CapturedGraph) -> None:
        self.captures += 1
        for item in graph.audit.unregistered:
            path = item.path or "<no attribute path>"
            self._lines.append(
                f"{graph.label}: unregistered graph input {path} {list(item.shape)} {item.dtype}"
            )

    def replayed(self, graph: CapturedGraph, stale: tuple[StaleInput, ...]) -> None:
        self.replays += 1
        for item in stale:
            self._stale[(graph.label, f"{item.path} (captured {item.captured}, now {item.now})")] += 1

    def lines(self) -> list[str]:
        stale = [f"{label}: stale input {what} at {n} replay(s)" for (label, what), n in self._stale.items()]
        counts = f"graphs: {self.captures} captured, {self.replays} replays, {self.eager_fallbacks} eager fallbacks"
        return [counts, *self._lines, *stale]

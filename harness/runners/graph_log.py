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
        self.padded_replays = 0
        self.eager_fallbacks = 0

    def captured(self, graph: CapturedGraph) -> None:
        self.captures += 1
        for item in graph.audit.unregistered:
            path = item.path or "<no attribute path>"
            self._lines.append(
                f"{graph.label}: unregistered graph input {path} {list(item.shape)} {item.dtype}"
            )

    def replayed(self, graph: CapturedGraph, stale: tuple[StaleInput, ...], *, padded: bool) -> None:
        self.replays += 1
        self.padded_replays += padded
        registered = {i.path: i.registered for i in graph.audit.inputs if i.path}
        for item in stale:
            if registered.get(item.path):
                what = (f"rebound attribute {item.path} (registered: the graph still reads the captured buffer, "
                        f"correct only if it is refreshed in place; captured {item.captured}, now {item.now})")
            else:
                what = (f"stale input {item.path} (unregistered: the graph still reads the tensor captured from it, "
                        f"which nothing refreshes; captured {item.captured}, now {item.now})")
            self._stale[(graph.label, what)] += 1

    def lines(self) -> list[str]:
        stale = [f"{label}: {what} at {n} replay(s)" for (label, what), n in self._stale.items()]
        counts = (f"graphs: {self.captures} captured, {self.replays} replays ({self.padded_replays} padded), "
                  f"{self.eager_fallbacks} eager fallbacks")
        return [counts, *self._lines, *stale]

"""What graph runners observe: inputs the audit could not account for, and stale inputs at replay."""

from __future__ import annotations

from collections import Counter

from ..graphs import CapturedGraph, StaleInput


class GraphLog:
    def __init__(self) -> None:
        self._lines: list[str] = []
        self._stale: Counter[tuple[str, str, bool]] = Counter()
        self._first_seen: dict[tuple[str, str, bool], StaleInput] = {}
        self.captures = 0
        self.replays = 0
        self.padded_replays = 0
        self.eager_fallbacks = 0

    def captured(self, graph: CapturedGraph) -> None:
        self.captures += 1
        for item in graph.audit.unregistered:
            path = item.path or "<no attribute path>"
            self._lines.append(f"{graph.label}: unregistered graph input {path} {item.dtype}{list(item.shape)}")

    def replayed(self, graph: CapturedGraph, stale: tuple[StaleInput, ...], *, padded: bool) -> None:
        self.replays += 1
        self.padded_replays += padded
        registered = {i.path: i.registered for i in graph.audit.inputs if i.path}
        for item in stale:
            key = (graph.label, item.path, bool(registered.get(item.path)))
            self._stale[key] += 1
            self._first_seen.setdefault(key, item)

    def lines(self) -> list[str]:
        out = [f"{self.captures} graphs captured, {self.replays} replays ({self.padded_replays} padded), "
               f"{self.eager_fallbacks} eager fallbacks", *self._lines]
        # Unregistered first: those are the graph reading data that nothing refreshes.
        for (label, path, is_registered), n in sorted(self._stale.items(), key=lambda kv: kv[0][2]):
            first = self._first_seen[(label, path, is_registered)]
            if is_registered:
                out.append(f"{label}: {path} rebound at {n} replay(s); the graph reads the registered buffer "
                           f"captured from it, correct only while that buffer is refreshed in place")
            else:
                out.append(f"{label}: stale input {path} at {n} replay(s): the graph still reads the tensor "
                           f"captured from it ({first.captured}), nothing refreshes it; it now holds {first.now}")
        return out

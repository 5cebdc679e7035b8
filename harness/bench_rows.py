"""The benchmark's rows, as data, in one home: what ``python -m harness.bench`` measures (``bench.py``: graph
replay against eager, on the CPU and on a GPU; ``diffbench.py``: the KV diff) and ``report/bench.py``
renders into the terminal and BENCHMARKS.md."""

from __future__ import annotations

from dataclasses import dataclass

REPLAY_GOALS = {"decode": 0.6, "prefill": 0.8}
"""per graph kind, the share of the eager forward it replaces that a graph replay should cost at most
(``BenchRow.ok``): a decode graph holds the whole forward, a prefill graph leaves attention an eager island"""

CAPTURE_GOAL_MS = 15.0
"""one graph's capture, its two warm-ups included, should take at most this long (``BenchRow.capture_ok``)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchRow:
    preset: str
    kind: str
    """"decode" (full decode graph) or "prefill" (piecewise prefill graph)"""
    bucket: int
    """captured bucket: batch size for decode, token count for prefill"""
    real: int
    """real rows (decode) or tokens (prefill) in the batch; below ``bucket`` when padded"""
    engine: str
    device: str
    eager_ms: float
    """median of the eager forwards"""
    replay_ms: float
    """median of the graph forwards"""
    ratio: float
    """median of replay/eager over interleaved pairs"""
    ratio_p10: float
    ratio_p90: float
    capture_ms: float
    """median time to capture this bucket's graph, warm-up included"""

    @property
    def goal(self) -> float:
        """The replay goal of the row's kind (a kind without one is held to the decode graph's)."""
        return REPLAY_GOALS.get(self.kind, REPLAY_GOALS["decode"])

    @property
    def ok(self) -> bool:
        """Replay meets its kind's goal: at most ``goal`` x the eager forward it replaces."""
        return self.ratio <= self.goal

    @property
    def capture_ok(self) -> bool:
        return self.capture_ms <= CAPTURE_GOAL_MS


GPU_GOAL_SPEEDUP = 2.0
"""a CUDA-graph decode replay should be at least this much faster than the eager step, up to ``GPU_GOAL_MAX_BS``"""
GPU_GOAL_MAX_BS = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuBenchRow:
    backend: str
    dtype: str
    bucket: int
    eager_ms: float
    replay_ms: float

    @property
    def speedup(self) -> float:
        """Eager time over replay time."""
        return self.eager_ms / self.replay_ms if self.replay_ms > 0 else float("inf")

    @property
    def goal(self) -> str:
        """Whether the row meets the replay goal (buckets past ``GPU_GOAL_MAX_BS`` have none)."""
        if self.bucket > GPU_GOAL_MAX_BS:
            return "n/a"
        return "met" if self.speedup >= GPU_GOAL_SPEEDUP else "missed"


@dataclass(frozen=True, slots=True, kw_only=True)
class DiffBenchRow:
    case: str
    """"copy", "clone", "identical", "P% of slots mismatched" or "N mismatched slots\""""
    cache_bytes: int
    """one snapshot: both pools, every layer, K and V"""
    steps: int
    """snapshots per run diffed (copy and clone handle one)"""
    live_slots: int
    """(pool, slot) pairs compared per step: full-pool live tokens plus SWA in-window tokens"""
    mismatched_slots: int
    """differing (pool, slot) pairs planted; 0 for copy, clone and identical"""
    found_slots: int
    """``DiffResult.mismatched_slots`` (equals the request when the diff is right)"""
    mismatches: int
    """``DiffResult.total``: bad (layer, slot) rows over all steps"""
    classes: tuple[tuple[str, int], ...]
    seconds: float
    """best of the rounds"""
    vs_copy: float
    """throughput relative to ``copy``: (steps x copy seconds) / seconds"""
    vs_clone: float
    """throughput relative to ``clone``"""
    peak_bytes: int | None
    """largest resident-set growth during one call, None where it cannot be measured"""
    judge_seconds: float | None = None
    """best time of ``verdict.judge`` on the same runs; None for copy and clone"""

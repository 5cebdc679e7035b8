"""The dense oracle's certification of a run a target drives itself (its own scheduler loop, its own graph
runner), for a property that judges such runs: the target calls an observer after each step's forwards, which
snapshots the stack as the harness's own runs are snapshotted, and the snapshots are certified at the end.

A target package sits below the checking and never imports it; its properties get this from here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..check.diff.snapshot import SnapshotRecorder
from ..check.run.oracle import Certification, certify, dense_oracle
from ..runspec import RunSpec
from ..serving.model import SyntheticModel
from ..serving.timeline import LiveToken


def step_certifier(spec: RunSpec) -> tuple[Callable[[Any, list[LiveToken], list[Any], Any], None],
                                           Callable[[], Certification]]:
    """``(observe, certification)``: ``observe(step, live, hidden, stack)`` after each step's forwards and before
    its frees (the step as the harness's scheduler made it, its live tokens, the forwards' hidden states, the
    stack whose ``kv_buffers()`` hold what it wrote); ``certification()`` checks every observed step's live slots
    and hidden states against the dense oracle of ``spec``'s model and timeline."""
    recorder, snapshots = SnapshotRecorder(), []

    def observe(step: Any, live: list[LiveToken], hidden: list[Any], stack: Any) -> None:
        snapshots.append(recorder.take(stack.kv_buffers(), step, live, hidden))

    def certification() -> Certification:
        model = SyntheticModel(spec.model, spec.device)
        return certify(snapshots, dense_oracle(model, spec.timeline), model=model, kv_dtype=spec.pool.kv_dtype,
                       kv_scales=model.kv_scales())

    return observe, certification


__all__ = ["step_certifier"]

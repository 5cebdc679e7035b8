"""What a property over runs a target drives itself (its own scheduler loop, its own graph runner) needs of the
checking and the graph machinery, which a target package sits below and never imports: the dense oracle's
certification of such a run (the target calls an observer after each step's forwards, which snapshots the stack
as the harness's own runs are snapshotted; the snapshots are certified at the end), and a graph engine to
capture and replay on.
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


def graph_engine(name: str = "tape") -> Any:
    """The graph engine ``name`` (``graphs.registry``): what a target's runner captures and replays on."""
    from ..graphs.registry import get_engine

    return get_engine(name)


__all__ = ["graph_engine", "step_certifier"]

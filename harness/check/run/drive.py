"""The run driver: a built run's timeline stepped through its runner, every step snapshotted and recorded.

Each step's writes are logged as that step's (``begin_step``) and its snapshot keeps what it changed.

An exception ends the run and becomes part of its result (the verdict ``error``), never a raise: a design
that calls ``sys.exit()`` is a finding about the design.
"""

from __future__ import annotations

from collections import Counter
from contextlib import ExitStack

from ...imports import load_named
from ...runners.observations import ForwardRecord
from ...runspec import RunSpec
from ...serving.faults import patches_of
from ...serving.scheduler import ScheduledStep, StepEnd
from ...serving.timeline import LiveToken, TokenKey
from .assemble import RunParts, assemble
from .frames import subject_frames
from .result import InvariantBreach, RunError, RunResult, StepRecord
from ..diff.snapshot import KVSnapshot, SnapshotRecorder


def execute(spec: RunSpec) -> RunResult:
    """Run the timeline; an exception ends the run and is returned, never raised. The faults that patch code
    the harness does not own (``Fault.patch``) are entered around the run, here, in the run's process."""
    with ExitStack() as patched:
        try:
            for name in patches_of(spec.faults):
                patched.enter_context(load_named(name, {}, kind="fault patch", check=_callable)())
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - a patch that cannot apply fails its run, like the subject
            return RunResult(spec=spec, snapshots=(), error=RunError(type=type(exc).__name__, message=str(exc),
                                                                     step=None))
        return _execute(spec)


def _callable(obj: object) -> str | None:
    return None if callable(obj) else "is not callable"


def _execute(spec: RunSpec) -> RunResult:
    snapshots: list[KVSnapshot] = []
    steps: list[StepRecord] = []
    step_index: int | None = None
    parts: RunParts | None = None
    running: tuple[ScheduledStep, int] | None = None
    recorder = SnapshotRecorder()
    try:
        parts = assemble(spec)
        while (step := parts.scheduler.next_step()) is not None:
            step_index = step.index
            # a scheduler that frees when it builds a batch (SGLang's) has freed before the forward reads: the
            # pools are checked there too
            if parts.scheduler.evicts_at_batch_build and (
                    violations := parts.stack.invariant_violations(parts.scheduler.live_tokens())):
                return RunResult(spec=spec, snapshots=tuple(snapshots), observations=parts.runner.observations(),
                                 steps=tuple(steps), breach=InvariantBreach(step=step.index,
                                                                            violations=tuple(violations)))
            running = (step, len(parts.runner.forward_log()))
            parts.stack.begin_step(step.index)
            hidden = parts.run_batch(step.batch)
            live = parts.scheduler.live_tokens()
            snapshots.append(recorder.take(parts.stack.kv_buffers(), step, live, hidden))
            end = parts.scheduler.finish_step()
            steps.append(_step_record(step, live, _forwards(parts, running[1]), end))
            running = None
            # checked once the step's frees are done: the state the next step starts from
            if violations := parts.stack.invariant_violations(parts.scheduler.live_tokens()):
                return RunResult(spec=spec, snapshots=tuple(snapshots), observations=parts.runner.observations(),
                                 steps=tuple(steps), breach=InvariantBreach(step=step.index,
                                                                            violations=tuple(violations)))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - any failure of the subject (sys.exit too) is a verdict
        if parts is not None and running is not None:
            steps.extend(_failed_step_record(parts, *running))
        return RunResult(
            spec=spec,
            snapshots=tuple(snapshots),
            error=RunError(type=type(exc).__name__, message=str(exc), step=step_index,
                           frames=subject_frames(exc.__traceback__)),
            observations=parts.runner.observations() if parts is not None else None,
            steps=tuple(steps),
        )
    return RunResult(spec=spec, snapshots=tuple(snapshots), observations=parts.runner.observations(),
                     steps=tuple(steps))


def _forwards(parts: RunParts, mark: int) -> tuple[ForwardRecord, ...]:
    """How the step's forwards ran: the runner's log from ``mark`` on."""
    return tuple(parts.runner.forward_log()[mark:])


def _step_record(step: ScheduledStep, live: list[LiveToken], forwards: tuple[ForwardRecord, ...],
                 end: StepEnd | None) -> StepRecord:
    owners = [key for forward in step.forwards for key in forward]
    tokens = Counter(key.rid for key in owners)  # insertion order: batch order
    written = set(owners)
    return StepRecord(
        index=step.index, kind=step.kind, batch_size=step.batch.batch_size, tokens=tuple(tokens.items()),
        forwards=forwards, written=tuple(t for t in live if TokenKey(t.rid, t.pos) in written),
        evicted=end.evicted if end else (), finished=end.finished if end else (), aborted=step.aborted,
    )


def _failed_step_record(parts: RunParts, step: ScheduledStep, mark: int) -> list[StepRecord]:
    """The step that raised: what was batched and the forwards that ran before the exception (none when the
    scheduler's state is too broken to say)."""
    try:
        return [_step_record(step, parts.scheduler.live_tokens(), _forwards(parts, mark), None)]
    except Exception:  # noqa: BLE001 - the timeline of a failed run is best effort; the error is the verdict
        return []

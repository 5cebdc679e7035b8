"""Run tasks in child processes that may die or hang without taking the caller down.

A design under test is third-party code: it may call ``sys.exit``, ``os.abort``, crash the interpreter in
a kernel, or loop forever. Each task runs in a forked child with a deadline, as FlashInfer's test suite
quarantines crash-class cases; a child that dies or runs past its deadline becomes a ``WorkerDied`` saying
why, and the other tasks go on. Children are forked, so they start in milliseconds and inherit whatever the
parent had computed (a scenario's reference run). Fork is not usable once CUDA is initialised: callers run
CUDA work in-process.

Generic on purpose: nothing here knows what a task is.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_CTX = multiprocessing.get_context("fork")


@dataclass(frozen=True, slots=True)
class WorkerDied:
    """A task that produced no result: its process died, or ran past its deadline and was killed."""

    reason: str
    """``worker died (signal 6)``, ``worker exited with status 3``, ``timed out after 5 s``"""
    timed_out: bool = False


def _child(conn: Connection, fn: Callable[[Any], Any], arg: Any) -> None:
    try:
        payload: tuple[str, Any] = ("ok", fn(arg))
    except BaseException as exc:  # noqa: BLE001 - whatever escapes the task is reported, never lost
        payload = ("raised", f"{type(exc).__name__}: {exc}")
    try:
        # the plain pickler copies tensors; multiprocessing's would send shared-memory handles that die
        # with this process
        data = pickle.dumps(payload)
    except Exception as exc:  # noqa: BLE001 - an unpicklable result is still an answer
        data = pickle.dumps(("raised", f"the result could not be sent back: {type(exc).__name__}: {exc}"))
    conn.send_bytes(data)
    conn.close()
    # no atexit handlers and no flushing of buffers inherited from the parent: they would print twice
    os._exit(0)


class _Running:
    __slots__ = ("index", "proc", "conn", "deadline", "timeout_s")

    def __init__(self, index: int, proc: Any, conn: Connection, timeout_s: float) -> None:
        self.index, self.proc, self.conn, self.timeout_s = index, proc, conn, timeout_s
        self.deadline = time.monotonic() + timeout_s


def _start(index: int, fn: Callable[[Any], Any], arg: Any, timeout_s: float) -> _Running:
    parent_conn, child_conn = _CTX.Pipe(duplex=False)
    sys.stdout.flush()
    sys.stderr.flush()
    proc = _CTX.Process(target=_child, args=(child_conn, fn, arg), daemon=True)
    proc.start()
    child_conn.close()
    return _Running(index, proc, parent_conn, timeout_s)


def _death(proc: Any) -> WorkerDied:
    proc.join()
    code = proc.exitcode
    if code is not None and code < 0:
        return WorkerDied(f"worker died (signal {-code})")
    return WorkerDied(f"worker exited with status {code} without a result")


def _finish(run: _Running) -> Any:
    try:
        kind, value = pickle.loads(run.conn.recv_bytes())
    except (EOFError, OSError):
        return _death(run.proc)
    finally:
        run.conn.close()
    run.proc.join()
    return value if kind == "ok" else WorkerDied(f"the task raised {value}")


def _kill(run: _Running) -> WorkerDied:
    run.proc.kill()
    run.proc.join()
    run.conn.close()
    return WorkerDied(f"timed out after {run.timeout_s:g} s", timed_out=True)


def run_isolated(
    fn: Callable[[T], R],
    args: Sequence[T],
    *,
    jobs: int,
    timeout_s: Callable[[T], float],
    done: Callable[[int, R | WorkerDied], None] | None = None,
    before_start: Callable[[T], None] | None = None,
) -> list[R | WorkerDied]:
    """``fn(arg)`` for every arg, at most ``jobs`` children at a time, results in argument order.

    ``before_start(arg)`` runs in the parent just before a child forks (to compute what children should
    inherit); ``done(index, result)`` as each finishes. Ctrl-C kills the children and propagates.
    """
    results: list[R | WorkerDied | None] = [None] * len(args)
    pending = deque(range(len(args)))
    running: list[_Running] = []

    def record(run: _Running, result: R | WorkerDied) -> None:
        results[run.index] = result
        if done is not None:
            done(run.index, result)

    try:
        while pending or running:
            while pending and len(running) < max(1, jobs):
                index = pending.popleft()
                if before_start is not None:
                    before_start(args[index])
                running.append(_start(index, fn, args[index], timeout_s(args[index])))
            now = time.monotonic()
            ready = wait([r.conn for r in running], timeout=max(0.0, min(r.deadline for r in running) - now))
            still: list[_Running] = []
            for run in running:
                if run.conn in ready:
                    record(run, _finish(run))
                elif time.monotonic() >= run.deadline:
                    record(run, _kill(run))
                else:
                    still.append(run)
            running = still
    except BaseException:
        for run in running:
            run.proc.kill()
            run.proc.join()
        raise
    return results  # type: ignore[return-value]


def run_one_isolated(fn: Callable[[T], R], arg: T, *, timeout_s: float) -> R | WorkerDied:
    return run_isolated(fn, [arg], jobs=1, timeout_s=lambda _: timeout_s)[0]


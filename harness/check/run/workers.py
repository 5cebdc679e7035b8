"""Run tasks in child processes that may die or hang without taking the caller down.

A design under test is third-party code: it may call ``sys.exit``, ``os.abort``, crash the interpreter in
a kernel, loop forever, start processes of its own or print to the terminal. Each task runs in a forked
child with a deadline, as FlashInfer's test suite quarantines crash-class cases; a child that dies or runs
past its deadline becomes a ``WorkerDied`` saying why, and the other tasks go on. Children are forked, so
they start in milliseconds and inherit whatever the parent had computed (a scenario's reference run). Fork
is not usable once CUDA is initialised: callers run CUDA work in-process.

A task's processes end with it. Each child leads a process group of its own, which the parent kills whole
when the task ends (a result, a crash, the deadline, an interrupt), so a process the task started cannot
outlive it and hold the caller's stdout open (``harness run | tee`` would wait for it). On Linux each child
also asks the kernel to kill it when the parent dies (``PR_SET_PDEATHSIG``), so even a parent killed with
SIGKILL leaves no hanging child behind. The child is a guard: the task runs in a process it forks, so a task
that kills its parent (``os.kill(os.getppid(), SIGKILL)``) kills only the guard, a crash like any other, and
never the caller (a pytest-xdist worker, with the other cases of its file). What a child writes to its stdout and stderr (file descriptors 1
and 2, so C code and subprocesses too) is captured, as pytest captures a test's output, and handed back
to the caller with the task's result; ``output_block`` shows it with every control character escaped.

Tasks can also run in groups (``run_grouped``): one child runs a group's tasks one after the other, each
under its own deadline, its output and result handed back as it finishes. A fork costs tens of
milliseconds of page copying, as much as a small task itself, so a caller groups tasks it trusts to leave
the process as they found it (the library's own designs and backends) and keeps third-party code one task
to a child. A group's child that dies or runs late costs only the task it was running: that task becomes
a ``WorkerDied`` and a fresh child takes the rest of the group.

Generic on purpose: nothing here knows what a task is.
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import hashlib
import io
import multiprocessing
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, TypeVar

from . import wire
from .malloc import keep_freed_memory

T = TypeVar("T")
R = TypeVar("R")

_CTX = multiprocessing.get_context("fork")
_PR_SET_PDEATHSIG = 1
DIST_INPUT = "harness_dist"
"""the key of the pytest-xdist controller's ``--dist`` in each worker's input: whether a worker gets a scenario
file whole, and so may run the file's cases in one child (``plugin.pytest_configure_node``, ``collect._Batches``)"""
_GUARD_EXIT_S = 5.0
"""seconds a guard gets to die as its task's process died (it needs milliseconds)"""
SESSION_DIR_INPUT = "harness_session_dir"
"""the key, in each pytest-xdist worker's input, of the folder where workers mark what they run (``RunningMarks``)"""
OUTPUT_LIMIT = 64 * 1024
"""bytes of a task's output kept; a design printing in a loop must not fill the caller's memory"""


@dataclass(frozen=True, slots=True)
class WorkerDied:
    """A task that produced no result: its process died, or ran past its deadline and was killed."""

    reason: str
    """``worker died (signal 6)``, ``worker exited with status 3``, ``timed out after 5 s``"""
    timed_out: bool = False
    stack: str = ""
    """for a task that timed out: its main thread's stack as ``faulthandler`` dumped it just before the kill
    (``frames.dumped_frames`` reads it); empty when it could not be had"""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where Ctrl-C raises ``KeyboardInterrupt``, so that both end a run alike."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(signum)


@contextmanager
def terminate_like_ctrl_c() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise ``Terminated`` (a ``KeyboardInterrupt``) in the main thread.

    A signal someone chose to ignore (``nohup``) or to handle stays as it was.
    """
    previous = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        try:
            if signal.getsignal(signum) is signal.SIG_DFL:
                previous[signum] = signal.signal(signum, _raise_terminated)
        except ValueError:  # not the main thread: signals are the main thread's business
            break
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


_HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def _interrupts_held() -> Iterator[dict[int, Callable[[int, Any], Any]]]:
    """Ctrl-C (and SIGTERM, SIGHUP) wait while a child is forked and recorded, then act.

    An interrupt that landed between the fork and the record left the child outside what the interrupt
    cleans up: it, and any process its task started, outlived the run. Yields the handlers held back (the
    child puts them back). Only Python-level handlers are held; a signal at its default or ignored stays so.
    """
    previous = {signum: signal.getsignal(signum) for signum in _HELD}
    held = {signum: handler for signum, handler in previous.items() if callable(handler)}
    arrived: list[int] = []
    holding = True

    def hold(signum: int, frame: Any) -> None:
        if holding:
            arrived.append(signum)
        else:  # restoring was itself interrupted: never swallow a signal
            held[signum](signum, frame)

    try:
        try:
            for signum in held:
                signal.signal(signum, hold)
        except ValueError:  # not the main thread, where Python runs every handler: nothing can be held
            pass
        yield held
    finally:
        holding = False
        for signum, handler in held.items():
            try:
                signal.signal(signum, handler)
            except ValueError:
                break
        if arrived:
            held[arrived[0]](arrived[0], None)


def _die_with_parent(parent: int) -> None:
    """Linux only: the kernel kills this process when the parent does (a task must never outlive it)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the request above took effect
        os._exit(1)


def _capture_output(write_fd: int) -> None:
    """Point fds 1 and 2, and Python's streams, at the parent's pipe: nothing reaches the terminal raw."""
    os.dup2(write_fd, 1)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    # line-buffered so that interleaved prints and C-level writes keep their order; sys.stdout may be
    # pytest's capture object, which writes to a file of its own, not to fd 1
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), errors="backslashreplace", line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), errors="backslashreplace", line_buffering=True)
    if faulthandler.is_enabled():
        # pytest's faulthandler writes a crash's traceback to a copy of the terminal's stderr: point it here,
        # so that a run that aborts shows its traceback, escaped, with its result
        faulthandler.enable(file=sys.stderr)


@contextmanager
def collector_between_tasks() -> Iterator[None]:
    """Run a task without the cyclic collector, then collect once and freeze what survives.

    A task's graphs hold tens of thousands of container objects that live as long as the task does; the
    collector's passes over them during the task cost more than a tenth of a run and free nothing, since the
    harness's own objects die by reference counting (no reference cycles: tapes, input watches, islands and
    the prefix cache keep their owners weakly). What cyclic garbage a task makes (a plug-in's, a radix tree's
    nodes) is freed by the one collection after it, before the next task starts; what survives the task
    (cached references) leaves the generations like the inherited objects, so the next collection scans only
    the next task's survivors.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
            gc.collect()
            gc.freeze()


def _child(conn: Connection, out: tuple[int, int], parent: int, fn: Callable[[Any], Any], args: Sequence[Any],
           held: dict[int, Callable[[int, Any], Any]]) -> None:
    os.setpgid(0, 0)
    for signum, handler in held.items():  # the parent's, held back while this child started
        signal.signal(signum, handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a handler inherited from the parent would survive a kill
    _die_with_parent(parent)
    # everything inherited from the parent (modules, scenarios, cached references) lives as long as the child:
    # out of the collector's generations, the child's collections scan only what its tasks allocate, and do
    # not write to (and so copy) the inherited pages
    gc.freeze()
    keep_freed_memory()  # a forward's temporaries stay this child's pages, not new ones at every step
    os.close(out[0])
    _guard(conn, out[1])
    _capture_output(out[1])
    # where a task that runs past its deadline is stuck: the parent asks for the main thread's stack (``_kill``)
    faulthandler.register(_STACK_SIGNAL, file=sys.stderr, all_threads=False)
    for k, arg in enumerate(args):
        # each task after the first waits for the parent to take the previous one's output and result, so
        # that nothing the next task prints reaches the pipe before the parent has handed that output back
        if k and not _go_on(conn):
            break
        try:
            with collector_between_tasks():
                payload: tuple[str, Any] = ("ok", fn(arg))
        except BaseException as exc:  # noqa: BLE001 - whatever escapes the task is reported, never lost
            payload = ("raised", f"{type(exc).__name__}: {exc}")
        try:
            data = wire.dumps(payload)
        except Exception as exc:  # noqa: BLE001 - an unpicklable result is still an answer
            data = wire.dumps(("raised", f"the result could not be sent back: {type(exc).__name__}: {exc}"))
        for stream in (sys.stdout, sys.stderr):
            try:
                # the task's own output (the parent flushed its buffers before forking), in the pipe before
                # its result, so the parent hands each task's output back with that task's result
                stream.flush()
            except Exception:  # noqa: BLE001 - a task that closed its stdout still has a result
                pass
        conn.send_bytes(data)
    conn.close()
    # no atexit handlers: they belong to the parent
    os._exit(0)


def _guard(conn: Connection, out: int) -> None:
    """Run the tasks one process further down, this one only waiting for it and dying as it did.

    A task's ``os.getppid()`` is then this guard, not the caller: a task that kills its parent (as a design
    may, by accident or on purpose) kills the guard, which the caller sees die as any crashing task, and the
    caller (the CLI, a pytest-xdist worker) goes on with the other tasks. The task's process is in this
    process group, so the caller's kill of the group ends it with the guard.
    """
    guard = os.getpid()
    pid = os.fork()
    if pid == 0:
        _die_with_parent(guard)
        return  # the task's process: runs the tasks
    conn.close()  # only the task's process talks to the caller
    os.close(out)
    for signum in (signal.SIGINT, signal.SIGHUP, _STACK_SIGNAL):  # the task's process answers; the guard waits
        signal.signal(signum, signal.SIG_IGN)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        # died of a signal: so does the guard, so that the caller says which (``worker died (signal 6)``)
        signum = os.WTERMSIG(status)
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _go_on(conn: Connection) -> bool:
    try:
        conn.recv_bytes()
    except (EOFError, OSError):  # the parent is gone or gave up on this group
        return False
    return True


class _Running:
    """A child and the tasks of its group it has not answered yet (``indices[0]`` is running now)."""

    __slots__ = ("indices", "timeouts", "proc", "conn", "out", "output", "dropped", "deadline", "timeout_s")

    def __init__(self, indices: list[int], timeouts: list[float], proc: Any, conn: Connection, out: int) -> None:
        self.indices, self.timeouts, self.proc, self.conn, self.out = indices, timeouts, proc, conn, out
        self.output = bytearray()
        self.dropped = 0
        """bytes of output past ``OUTPUT_LIMIT``, counted, not kept"""
        self.timeout_s = timeouts[0]
        self.deadline = time.monotonic() + self.timeout_s

    @property
    def index(self) -> int:
        return self.indices[0]

    def next_task(self) -> None:
        """The running task answered: the next one of the group starts now, with an empty output buffer."""
        self.indices.pop(0)
        self.timeouts.pop(0)
        self.output = bytearray()
        self.dropped = 0
        if self.indices:
            self.timeout_s = self.timeouts[0]
            self.deadline = time.monotonic() + self.timeout_s
            try:
                self.conn.send_bytes(b"go")
            except OSError:
                pass  # the child died meanwhile: its pipe's end of file says so next

    def read_output(self, *, drain: bool = False) -> None:
        """Read what the child wrote; ``drain``: everything already in the pipe (a process the task
        started may hold it open, so end of file never comes)."""
        if self.out < 0:
            return
        if drain:
            os.set_blocking(self.out, False)
        while True:
            try:
                chunk = os.read(self.out, 65536)
            except BlockingIOError:
                return
            if not chunk:
                os.close(self.out)
                self.out = -1
                return
            room = OUTPUT_LIMIT - len(self.output)
            self.output += chunk[:room]
            self.dropped += max(0, len(chunk) - room)
            if not drain:
                return

    def captured(self) -> str:
        text = self.output.decode("utf-8", "backslashreplace")
        if self.dropped:
            text += f"\n[{self.dropped} more bytes of output not kept]"
        return text

    def end(self) -> None:
        """Kill what is left of the task's process group, reap the child, close its pipes."""
        _kill_group(self.proc.pid)
        self.proc.join()
        self.read_output(drain=True)
        if self.out >= 0:
            os.close(self.out)
            self.out = -1
        self.conn.close()


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone: every process of the task has ended


def _start(indices: list[int], fn: Callable[[Any], Any], args: list[Any], timeouts: list[float],
           held: dict[int, Callable[[int, Any], Any]]) -> _Running:
    parent_conn, child_conn = _CTX.Pipe(duplex=len(args) > 1)  # a group's child waits for the parent's go
    out = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    proc = _CTX.Process(target=_child, args=(child_conn, out, os.getpid(), fn, args, held), daemon=True)
    proc.start()
    try:
        # set here as well as in the child, so the group exists whichever runs first (killpg needs it)
        os.setpgid(proc.pid, proc.pid)
    except OSError:
        pass  # the child set it already, or is gone
    child_conn.close()
    os.close(out[1])
    return _Running(indices, timeouts, proc, parent_conn, out[0])


def _death(proc: Any) -> WorkerDied:
    code = proc.exitcode
    if code is not None and code < 0:
        return WorkerDied(f"worker died (signal {-code})")
    return WorkerDied(f"worker exited with status {code} without a result")


def _answer(run: _Running) -> tuple[Any, bool]:
    """The running task's result, and whether the child is gone (it died, or its group is done)."""
    try:
        kind, value = wire.loads(run.conn.recv_bytes())
    except (EOFError, OSError):
        # the task's process is gone; its guard dies the same way a moment later: wait for it, so that the
        # group's kill does not become the death the caller reports
        run.proc.join(timeout=_GUARD_EXIT_S)
        run.end()
        return _death(run.proc), True
    result = value if kind == "ok" else WorkerDied(f"the task raised {value}")
    last = len(run.indices) == 1
    if last:
        # the task's process exits as soon as it has answered, and its guard as soon as it has reaped it: let
        # them, rather than kill the group at once, so that their CPU time is counted as this process's
        # children's (``time make test`` then tells the truth) and nothing dies mid-exit
        run.proc.join(timeout=_GUARD_EXIT_S)
        run.end()
    else:
        run.read_output(drain=True)  # what the task printed came before its result
    return result, last


def _kill(run: _Running) -> WorkerDied:
    stack = _dumped_stack(run)
    run.end()
    return WorkerDied(f"timed out after {run.timeout_s:g} s", timed_out=True, stack=stack)


_STACK_SIGNAL = signal.SIGUSR1
"""asks a task's process for its main thread's stack (``faulthandler.register`` in ``_child``)"""
_STACK_HEADER = b"(most recent call first):"
_STACK_WAIT_S = 1.0


def _dumped_stack(run: _Running) -> str:
    """The task's main thread's stack, asked for and cut out of its output (it is not the task's own)."""
    start = len(run.output)
    try:
        os.killpg(run.proc.pid, _STACK_SIGNAL)
    except (ProcessLookupError, PermissionError):
        return ""
    deadline = time.monotonic() + _STACK_WAIT_S
    settled = None
    while run.out >= 0 and time.monotonic() < deadline:
        if wait([run.out], timeout=0.05):
            run.read_output()
            settled = None
        elif _STACK_HEADER in run.output[start:]:  # written, and nothing more for a moment: the dump is whole
            settled = settled or time.monotonic()
            if time.monotonic() - settled >= 0.1:
                break
    at = run.output.find(_STACK_HEADER, start)
    if at < 0:
        return ""
    begin = run.output.rfind(b"\n", start, at) + 1
    text = run.output[begin:].decode("utf-8", "backslashreplace")
    del run.output[begin:]
    return text


def output_block(title: str, text: str) -> str:
    """A task's captured output under a title, each line escaped and marked as the task's (``| ``), so
    that nothing it printed can pass for the caller's own lines (a forged ``PASSED``, a terminal title)."""
    lines = text.rstrip("\n").split("\n")
    return "\n".join([f"{_escaped(title)}: captured output, escaped:", *(f"  | {_escaped(line)}" for line in lines)])


def _escaped(line: str) -> str:
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in line)


def _print_output(index: int, text: str) -> None:
    # no caller asked for it: the caller's stderr, escaped (pytest captures that and shows it with the test)
    print(output_block(f"task {index}", text), file=sys.stderr)


def run_isolated(
    fn: Callable[[T], R],
    args: Sequence[T],
    *,
    jobs: int,
    timeout_s: Callable[[T], float],
    done: Callable[[int, R | WorkerDied], None] | None = None,
    before_start: Callable[[T], None] | None = None,
    output: Callable[[int, str], None] | None = None,
) -> list[R | WorkerDied]:
    """``fn(arg)`` for every arg, each in a child of its own, at most ``jobs`` children at a time, results in
    argument order.

    ``before_start(arg)`` runs in the parent just before a child forks (to compute what children should
    inherit); ``done(index, result)`` as each finishes, after ``output(index, text)`` when the task wrote
    anything (without ``output``, the text goes to this process's stderr, escaped). Ctrl-C (and, inside
    ``terminate_like_ctrl_c``, SIGTERM) kills every running task's processes and propagates.
    """
    return run_grouped(fn, args, [[i] for i in range(len(args))], jobs=jobs, timeout_s=timeout_s, done=done,
                       before_start=before_start, output=output)


def run_grouped(
    fn: Callable[[T], R],
    args: Sequence[T],
    groups: Sequence[Sequence[int]],
    *,
    jobs: int,
    timeout_s: Callable[[T], float],
    done: Callable[[int, R | WorkerDied], None] | None = None,
    before_start: Callable[[T], None] | None = None,
    output: Callable[[int, str], None] | None = None,
) -> list[R | WorkerDied]:
    """``run_isolated``, with the args of each group (indices into ``args``, every index in one group) run
    one after the other by one child, each under its own deadline.

    A task that kills its child or runs past its deadline is a ``WorkerDied``; a new child runs the rest of
    its group. ``before_start`` runs for each task of a group before the group's child forks.
    """
    results: list[R | WorkerDied | None] = [None] * len(args)
    pending = deque(list(group) for group in groups if group)
    running: list[_Running] = []
    show = output or _print_output

    def record(run: _Running, result: R | WorkerDied) -> None:
        results[run.index] = result
        if run.output or run.dropped:
            show(run.index, run.captured())
        if done is not None:
            done(run.index, result)

    try:
        while pending or running:
            while pending and len(running) < max(1, jobs):
                indices = pending.popleft()
                if before_start is not None:
                    for index in indices:
                        before_start(args[index])
                with _interrupts_held() as held:
                    running.append(_start(indices, fn, [args[i] for i in indices],
                                          [timeout_s(args[i]) for i in indices], held))
            now = time.monotonic()
            outputs = {r.out: r for r in running if r.out >= 0}
            # a guard's exit too: a task that killed its guard may leave the task's process holding the pipes
            sentinels = {r.proc.sentinel: r for r in running}
            ready = wait([r.conn for r in running] + list(outputs) + list(sentinels),
                         timeout=max(0.0, min(r.deadline for r in running) - now))
            for fd in ready:
                if isinstance(fd, int) and fd in outputs:
                    outputs[fd].read_output()
            still: list[_Running] = []
            for run in running:
                if run.conn in ready:
                    result, gone = _answer(run)
                elif run.proc.sentinel in ready:  # the guard died (its task killed it) and left no answer
                    run.end()
                    result, gone = _death(run.proc), True
                elif time.monotonic() >= run.deadline:
                    result, gone = _kill(run), True
                else:
                    still.append(run)
                    continue
                record(run, result)
                rest = run.indices[1:]
                if not gone:
                    run.next_task()
                    still.append(run)
                elif rest:  # the child died with tasks of its group unrun: a fresh child takes them
                    pending.appendleft(rest)
            running = still
    except BaseException:
        for run in running:
            run.end()
        raise
    return results  # type: ignore[return-value]


def run_one_isolated(fn: Callable[[T], R], arg: T, *, timeout_s: float) -> R | WorkerDied:
    return run_isolated(fn, [arg], jobs=1, timeout_s=lambda _: timeout_s)[0]


class RunningMarks:
    """A folder the processes of one session share, where each marks the task it runs while it runs it.

    A process that dies with its task (a task run in-process, or one that kills its process's whole line)
    leaves its mark behind: whoever is given that task next (pytest-xdist hands a crashed worker's item to
    the worker that replaces it) finds the mark and reports the crash as the task's result instead of
    running it again, which would kill that process too, and its successor, in turn.
    """

    def __init__(self, folder: Path, owner: str) -> None:
        self.folder = Path(folder)
        self.owner = owner
        """who is running, in the words a successor reports (``pytest-xdist worker gw1 (pid 123)``)"""

    def _path(self, key: str) -> Path:
        return self.folder / (hashlib.sha256(key.encode("utf-8", "backslashreplace")).hexdigest() + ".running")

    def crashed(self, key: str) -> str | None:
        """Who died running ``key``, or None when nobody did."""
        try:
            return self._path(key).read_text(encoding="utf-8") or "a process"
        except FileNotFoundError:
            return None

    def forget(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    @contextmanager
    def running(self, key: str) -> Iterator[None]:
        path = self._path(key)
        try:
            path.write_text(self.owner, encoding="utf-8")
        except OSError:  # no mark (a full disk): the task still runs, as it did before marks existed
            yield
            return
        try:
            yield
        finally:
            path.unlink(missing_ok=True)


def watch_parent(*, interval_s: float = 0.5) -> None:
    """End this process when its parent dies, however it dies (SIGKILL included): a pytest-xdist worker whose
    controller is gone has nobody to report to. A daemon thread polls the parent's pid (portable; the
    kernel's ``PR_SET_PDEATHSIG`` follows the parent's thread, which may end first). The tasks' processes
    this one started die with it (``_die_with_parent``)."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="harness-parent-watch", daemon=True).start()


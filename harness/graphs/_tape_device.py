"""The device the tape plays during a run: ``torch.cuda``'s streams, pools, syncs and queries.

Engine code around a capture asks more of ``torch.cuda`` than the graph class: it makes a side
stream and captures on it (``torch.cuda.Stream``, ``stream(...)``, ``current_stream()``), joins
streams (``wait_stream``), synchronizes before capture, shares a pool (``graph_pool_handle()``), and
picks kernels and sizes from device queries (``get_device_capability``, ``mem_get_info``,
``device_count``).  On a machine without CUDA each of these either fails or says there is no
device, so during a tape run (``TapeEngine.run()``) they are answered here, for the calling
thread's run only (``region.py``):

* streams are ordered already (CPU ops run in program order), so joining them is a no-op; a run
  keeps its own default stream and the current stream, and a capture on the default stream is
  refused, as CUDA refuses it;
* ``synchronize()``, a capturing stream's ``synchronize()`` / ``query()`` and an event's are host syncs:
  refused during capture (``CaptureError``), no-ops otherwise; recording and waiting on an event are
  allowed (CPU ops have run by the time anything waits);
* ``torch.cuda.graph(...)`` is the block ``torch.cuda.graph`` is: a synchronize, the capture
  stream made current (its own side stream unless ``stream=`` is given), ``capture_begin`` with the
  pool and ``capture_error_mode``, and at the end ``capture_end`` (or, when the block raised, the
  capture abandoned so that the block's error is the one that surfaces);
* the device queries answer from a ``TapeDevice``: by default one device of compute capability 9.0
  with 80 GiB, all of it free.

Tensors stay where they are (``Stream.device`` is the CPU): the tape plays a device's graph
semantics, not its memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from ._refusals import CaptureError, _tls, refuse_nested, refuse_on_other_threads, user_location
from .region import ORIGINALS, active_run, standin

__all__ = ["NAMES", "TapeDevice", "TapeDeviceState", "TapePool", "refuse_default_stream"]

_SYNC_DURING_CAPTURE = ("a host synchronization with the device while a stream captures; CUDA fails it "
                        "(cudaErrorStreamCaptureUnsupported) and invalidates the capture")


@dataclass(frozen=True, slots=True)
class TapeDevice:
    """What the device queries answer during a tape run."""

    name: str = "tape"
    capability: tuple[int, int] = (9, 0)
    total_memory: int = 80 * 2**30
    count: int = 1


@dataclass(eq=False)
class TapeDeviceState:
    """One run's device: its model, its default stream and the stream current on the run's thread."""

    device: TapeDevice
    default: Stream = field(init=False)
    current: Stream = field(init=False)
    capture_stream: Stream | None = None
    """the side stream ``torch.cuda.graph`` captures on when not given one (one per run, as torch keeps one)"""

    def __post_init__(self) -> None:
        self.default = self.current = Stream._make(default=True)


def _state() -> TapeDeviceState | None:
    run = active_run()
    return run.device if run is not None and isinstance(run.device, TapeDeviceState) else None


def _capturing() -> bool:
    rec = getattr(_tls, "recorder", None)
    return rec is not None and rec.capturing and not rec._paused


def _refuse_sync(name: str) -> None:
    if _capturing():
        raise CaptureError(name, user_location(), _SYNC_DURING_CAPTURE)
    refuse_on_other_threads(name, ())


_STREAM_IDS = itertools.count(1)


@standin("Stream")
class Stream:
    """``torch.cuda.Stream`` on the tape."""

    _harness_original: Any

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if _state() is None:
            return cls._harness_original(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, device: Any = None, priority: int = 0, **_options: Any) -> None:
        self.priority = priority
        self.cuda_stream = next(_STREAM_IDS)
        self._default = False

    @classmethod
    def _make(cls, *, default: bool) -> Stream:
        stream = object.__new__(cls)
        stream.priority, stream.cuda_stream, stream._default = 0, 0 if default else next(_STREAM_IDS), default
        return stream

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def wait_stream(self, stream: Any) -> None:
        pass  # CPU ops already run in program order

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        event = Event() if event is None else event
        event.record(self)
        return event

    def synchronize(self) -> None:
        _refuse_sync("Stream.synchronize")

    def query(self) -> bool:
        _refuse_sync("Stream.query")
        return True

    def __enter__(self) -> Stream:
        state = _state()
        if state is None:
            raise RuntimeError("a tape stream is used outside the run that made it")
        self._previous = state.current
        state.current = self
        return self

    def __exit__(self, *exc: object) -> None:
        state = _state()
        if state is not None:
            state.current = self._previous

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream (tape) cuda_stream={self.cuda_stream}{' default' if self._default else ''}>"


@standin("Event")
class Event:
    """``torch.cuda.Event`` on the tape: CPU ops run in program order, so every recorded event has completed.

    ``record`` and ``wait`` are allowed during capture (CUDA captures them as graph nodes); ``synchronize``
    and ``query`` are host syncs, refused during capture as on a device.  The tape keeps no device clock, so
    ``elapsed_time`` raises instead of answering.
    """

    _harness_original: Any

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if _state() is None:
            return cls._harness_original(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 **_options: Any) -> None:
        self.enable_timing = enable_timing
        self.recorded = False

    def record(self, stream: Any = None) -> None:
        self.recorded = True

    def wait(self, stream: Any = None) -> None:
        pass  # what the event marks has already run

    def query(self) -> bool:
        _refuse_sync("Event.query")
        return True

    def synchronize(self) -> None:
        _refuse_sync("Event.synchronize")

    def elapsed_time(self, end_event: Any) -> float:
        raise RuntimeError("Event.elapsed_time: the tape plays graph semantics on the CPU and keeps no device time")

    def __repr__(self) -> str:
        return f"<torch.cuda.Event (tape){' recorded' if self.recorded else ''}>"


@standin("current_stream")
def current_stream(device: Any = None) -> Any:
    state = _state()
    return ORIGINALS["current_stream"](device) if state is None else state.current


@standin("default_stream")
def default_stream(device: Any = None) -> Any:
    state = _state()
    return ORIGINALS["default_stream"](device) if state is None else state.default


@standin("set_stream")
def set_stream(stream: Any) -> None:
    state = _state()
    if state is None:
        return ORIGINALS["set_stream"](stream)
    if stream is not None:
        state.current = stream
    return None


@standin("stream")
@contextmanager
def stream(stream: Any) -> Iterator[None]:
    state = _state()
    if state is None:
        with ORIGINALS["stream"](stream):
            yield
        return
    if stream is None:  # torch.cuda.stream(None) is a no-op
        yield
        return
    previous, state.current = state.current, stream
    try:
        yield
    finally:
        state.current = previous


@standin("synchronize")
def synchronize(device: Any = None) -> None:
    if _state() is None:
        return ORIGINALS["synchronize"](device)
    _refuse_sync("torch.cuda.synchronize")
    return None


class TapePool:
    """A graph memory pool on the tape: the buffers its graphs' private storages hold, free between replays.

    A graph's private storages are dead once its replay ends, so a later graph captured into the same
    pool (``pool=graph.pool()``, or one ``graph_pool_handle()`` for several captures) takes their memory
    first, as graphs sharing a CUDA pool reuse the blocks earlier captures freed.  Graphs sharing a pool
    must then be replayed one at a time, as on a device.
    """

    __slots__ = ("free", "graphs")

    def __init__(self) -> None:
        self.free: dict[torch.device, list[tuple[int, int, Any]]] = {}  # per device: (nbytes, tie, buffer), by size
        self.graphs = 0

    def __repr__(self) -> str:
        return f"<tape graph pool, {self.graphs} graph(s)>"


@standin("graph_pool_handle")
def graph_pool_handle() -> Any:
    if _state() is None:
        return ORIGINALS["graph_pool_handle"]()
    return TapePool()


@standin("graph")
class graph:  # noqa: N801 - torch's name
    """``torch.cuda.graph`` on the tape: the block around one capture."""

    _harness_original: Any

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if _state() is None:
            return cls._harness_original(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, cuda_graph: Any, pool: object = None, stream: Any = None, capture_error_mode: str = "global",
                 **_options: Any) -> None:
        state = _state()
        assert state is not None
        if stream is None:
            if state.capture_stream is None:
                state.capture_stream = Stream()
            stream = state.capture_stream
        self.cuda_graph = cuda_graph
        self.pool = () if pool is None else (pool,)
        self.capture_stream = stream
        self.capture_error_mode = capture_error_mode

    def __enter__(self) -> None:
        refuse_nested("torch.cuda.graph")  # before the synchronize, so the refusal says what happened
        synchronize()
        state = _state()
        assert state is not None
        self._previous = state.current
        state.current = self.capture_stream
        try:
            self.cuda_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            state.current = self._previous
            raise

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        try:
            if error is None:
                self.cuda_graph.capture_end()
            else:
                self.cuda_graph._abort()
        finally:
            state = _state()
            if state is not None:
                state.current = self._previous


def refuse_default_stream() -> None:
    """CUDA captures only on a side stream (``torch.cuda.graph`` makes one); the run's default stream is refused."""
    state = _state()
    if state is not None and state.current is state.default:
        raise CaptureError("CUDAGraph.capture_begin", user_location(),
                           "CUDA graphs must be captured on a non-default stream: torch.cuda.graph(...) captures "
                           "on a side stream, or make one current with torch.cuda.stream(torch.cuda.Stream())")


@standin("get_device_capability")
def get_device_capability(device: Any = None) -> tuple[int, int]:
    state = _state()
    return ORIGINALS["get_device_capability"](device) if state is None else state.device.capability


@standin("get_device_name")
def get_device_name(device: Any = None) -> str:
    state = _state()
    return ORIGINALS["get_device_name"](device) if state is None else state.device.name


@standin("mem_get_info")
def mem_get_info(device: Any = None) -> tuple[int, int]:
    state = _state()
    if state is None:
        return ORIGINALS["mem_get_info"](device)
    return state.device.total_memory, state.device.total_memory


@standin("device_count")
def device_count() -> int:
    state = _state()
    return ORIGINALS["device_count"]() if state is None else state.device.count


@standin("current_device")
def current_device() -> int:
    state = _state()
    return ORIGINALS["current_device"]() if state is None else 0


NAMES = ("CUDAGraph", "graph", "graph_pool_handle", "Stream", "Event", "current_stream", "default_stream",
         "set_stream", "stream", "synchronize", "get_device_capability", "get_device_name", "mem_get_info",
         "device_count", "current_device")
"""The ``torch.cuda`` names a tape run patches."""

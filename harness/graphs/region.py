"""Capture regions: engine code that opens ``torch.cuda.graph`` itself, captured by a graph engine.

A serving engine's graph runner does not hand anyone a callable: it opens the capture block around
the model's forward itself (``with torch.cuda.graph(graph, pool=..., stream=...):``), keeps the
``torch.cuda.CUDAGraph`` objects and replays them later.  A *run* (``engine.run()``) serves such code
by the names it reaches:

* on the ``tape`` engine every graph name of ``torch.cuda`` the code asks is a stand-in: the graph
  class and the ``torch.cuda.graph`` block (this module), streams, pools, ``synchronize()`` and the
  device queries (``_tape_device.py``); ``is_current_stream_capturing()`` answers as always
  (``_cuda_queries.py``);
* on the ``cuda`` engine everything is the real ``torch.cuda``, the graph class included: the
  stand-in wraps a real ``CUDAGraph`` and adds what the harness reads of a capture.

The names are patched while a run is active on any thread (``_refusals.Patches``, counted per
holder) and answered by the run of the calling thread; a thread without a run gets the real
objects.  Outside every run nothing is patched.

Each region, the code between ``capture_begin`` and ``capture_end``, is captured as the engine
captures a callable (the same recorder, the same refusals, the same tape or segments), and becomes
a ``CapturedGraph`` in ``run.regions``, labelled with the source line that opened it.  What it read
is known only once it ends (``CapturedGraph.reads``), so its inputs and audit roots are registered
after it (``CapturedGraph.register``).  Warm-up is the caller's business, as in the engines whose
code opens regions (they warm up themselves); the callable form ``engine.capture(fn, ...)`` is the
engine's warm-up followed by one region over ``fn()``.  As on a device: a second region opened while
one is open is refused (``CaptureError``), a graph replays only after its capture ended, ``reset()``
frees it, and graphs captured with one pool (``pool=graph.pool()`` or one ``graph_pool_handle()``)
share its memory.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch

from ._refusals import HOOKS, _tls, user_location
from .engine import CapturedGraph, GraphRun, StaleInput

__all__ = ["RegionGraph", "active_run", "open_run", "original", "standin"]

# The objects the stand-ins replace, as torch defines them (a CPU-only build has dummies for some).
ORIGINALS: dict[str, Any] = {}


class RegionCapture(Protocol):
    """One open capture of an engine, between ``begin`` and ``end`` (``tape.TapeCapture``, ``cuda.CudaCapture``)."""

    label: str
    pool: object

    def begin(self) -> None: ...

    def end(self) -> CapturedGraph: ...

    def abort(self) -> None: ...


class RegionEngine(Protocol):
    name: str

    def open_region(self, *, label: str, pool: object = None, capture_error_mode: str = "global") -> RegionCapture: ...


def active_run() -> GraphRun | None:
    """The run active on this thread."""
    return getattr(_tls, "graph_run", None)


def original(owner: Any, name: str) -> Any:
    """``owner.name`` as torch defines it, even while a run has it patched."""
    found = getattr(owner, name)
    return getattr(found, "_harness_original", found)


def standin(name: str) -> Any:
    """Register ``obj`` as the stand-in for ``torch.cuda.<name>`` (a decorator); it can reach the original."""

    def register(obj: Any) -> Any:
        ORIGINALS[name] = getattr(torch.cuda, name, None)
        obj._harness_original = ORIGINALS[name]
        HOOKS.add(torch.cuda, name, lambda _original, _obj=obj: _obj)
        return obj

    return register


@contextmanager
def open_run(engine: RegionEngine, names: tuple[str, ...], device: Any = None) -> Iterator[GraphRun]:
    """Activate a run on this thread with ``torch.cuda.<name>`` patched for each of ``names``."""
    if active_run() is not None:
        raise RuntimeError("graph runs do not nest: a run is already active on this thread")
    run = GraphRun(engine=engine, device=device)
    _tls.graph_run = run
    try:
        with HOOKS.held(tuple((torch.cuda, name) for name in names)):
            try:
                yield run
            except BaseException:
                for graph in list(run._open):
                    graph._abort()
                raise
            if run._open:
                left = run._open[0]
                for graph in list(run._open):
                    graph._abort()
                raise RuntimeError(f"the run ended with a capture still open (capture_begin at {left._label}); "
                                   "end it with capture_end() inside the run")
    finally:
        _tls.graph_run = None


def _run_for(what: str) -> GraphRun:
    run = active_run()
    if run is None:
        raise RuntimeError(f"{what} needs the graph run that created this graph to be active on this thread")
    return run


@standin("CUDAGraph")
class RegionGraph:
    """``torch.cuda.CUDAGraph`` during a run: each capture is one region of the run's engine.

    Beyond torch's methods, the harness reads ``captured`` (the engine's graph, once capture ended)
    and ``stale`` (what the input audit found before the latest replay).
    """

    _harness_original: Any

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if active_run() is None:  # the name is patched for another thread's run
            return cls._harness_original(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, keep_graph: bool = False) -> None:
        self._run = _run_for("torch.cuda.CUDAGraph()")
        self._capture: RegionCapture | None = None
        self._label = ""
        self._pool: object = None
        self.captured: CapturedGraph | None = None
        self.stale: tuple[StaleInput, ...] = ()

    def capture_begin(self, pool: object = None, capture_error_mode: str = "global", **_options: Any) -> None:
        if self._capture is not None or self.captured is not None:
            raise RuntimeError("This CUDAGraph instance already owns a captured graph. To capture a new graph, "
                               "create a new instance (or reset() this one).")
        run = self._run
        if active_run() is not run:
            raise RuntimeError("CUDAGraph.capture_begin() needs the graph run that created this graph to be active "
                               "on this thread")
        label = user_location()
        capture = run.engine.open_region(label=label, pool=pool, capture_error_mode=capture_error_mode)
        capture.begin()  # a second region on this thread is refused here, before anything is open
        self._capture, self._label = capture, label
        run._open.append(self)

    def capture_end(self) -> None:
        capture = self._capture
        if capture is None:
            raise RuntimeError("CUDAGraph.capture_end() without a capture_begin()")
        if sys.exc_info()[1] is not None:
            # torch.cuda.graph's __exit__ ends the capture while the block's error propagates: let that error through
            self._abort()
            return
        self._forget()
        graph = capture.end()
        self.captured, self._pool = graph, capture.pool
        self._run.regions.append(graph)

    def replay(self) -> None:
        if self.captured is None:
            still = " (its capture is still open: call capture_end() first)" if self._capture is not None else ""
            raise RuntimeError(f"Called CUDAGraph::replay without a preceding successful capture{still}.")
        self.stale = self.captured.replay()

    def reset(self) -> None:
        if self._capture is not None:
            self._abort()
        if self.captured is not None:
            self.captured.reset()
        self.captured, self._pool, self.stale = None, None, ()

    def pool(self) -> object:
        if self._pool is None:
            raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture.")
        return self._pool

    def _abort(self) -> None:
        capture = self._capture
        self._forget()
        if capture is not None:
            capture.abort()

    def _forget(self) -> None:
        self._capture = None
        if self in self._run._open:
            self._run._open.remove(self)

    def __repr__(self) -> str:
        state = "open" if self._capture is not None else "captured" if self.captured is not None else "empty"
        return f"<CUDAGraph ({self._run.engine.name} engine, {state})>"

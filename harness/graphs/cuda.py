"""The ``cuda`` engine: real ``torch.cuda.CUDAGraph`` capture and replay.

Capture follows what serving engines do:

1. Warm-up: the routine shared with the tape (``_warm_up.warm_up``), run on a
   side stream: ``WARMUP_RUNS`` real eager runs (lazy init, cuBLAS workspaces and
   allocator growth must not happen inside capture) under a checking
   ``Recorder``.  Refused ops raise the same ``CaptureError`` as the tape engine,
   before any capture is open; what the runs write stays, as in the tape.
2. Capture on the same side stream into one private memory pool per engine
   instance (``graph_pool_handle()`` once, shared by every graph the engine
   captures, as serving engines share one pool across batch-size buckets), under
   the recorder in audit-only mode (checks and input tracking, no tape, no
   snapshots: a snapshot would itself be captured), with the runner's
   ``capture_error_mode`` (``"global"`` by default, as ``torch.cuda.graph``).

With ``islands=True`` capture is split into segments: at an island the current
graph ends, the island's static outputs are allocated outside the graph, and the
next graph begins.  The island itself is not re-run at capture: inside capture the
segment before it has not computed anything, so its inputs hold garbage (an
island indexing with garbage can trip a device assert).  Its statics are instead
cloned from its last warm-up run, which saw real data.  Replay runs segment 0,
island 0 (copying its fresh results into its statics), segment 1, and so on.

Sharing one pool means graphs must be replayed in a consistent order relative to
reads of their outputs: replaying graph B may overwrite memory graph A's
intermediates used, exactly the trade-off serving engines accept.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, ExitStack
from typing import Any

import torch

from ._audit import StaleWatch, build_audit
from ._islands import island_runner, static_outputs
from ._ops import poison_storage
from ._record import IslandStep, Recorder, check_capture_error_mode
from ._refusals import CaptureError, refuse_nested
from ._warm_up import WarmIslands, island_identity, no_cycle_collection, warm_up
from .engine import InputAudit, StaleInput
from .region import GraphRun, open_run, original

__all__ = ["CudaCapture", "CudaEngine", "CudaGraph"]

# Indirection so CPU tests can drive the orchestration with a stand-in backend.
_cuda: Any = torch.cuda


class _Segments:
    """Capture state: the open graph, the closed ones, and the islands between them."""

    def __init__(self, pool: Any, warm: WarmIslands | None, capture_error_mode: str) -> None:
        self._pool = pool
        self._mode = capture_error_mode
        self._warm = warm.results if warm is not None else []
        self.graphs: list[Any] = []
        self.islands: list[IslandStep] = []
        self._open: Any = None

    def begin(self) -> None:
        graph = original(_cuda, "CUDAGraph")()  # during a run torch.cuda.CUDAGraph is the region's stand-in
        graph.capture_begin(pool=self._pool, capture_error_mode=self._mode)
        self._open = graph

    def end(self) -> None:
        graph, self._open = self._open, None
        with warnings.catch_warnings():
            # A segment holding only views (or nothing) between two islands is legitimately empty.
            warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
            graph.capture_end()
        self.graphs.append(graph)

    def abort(self) -> None:
        graph, self._open = self._open, None
        if graph is None:
            return
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                graph.capture_end()
        except Exception:  # an invalidated capture cannot end cleanly; the original error matters
            pass

    def island(self, rec: Recorder, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        k = len(self.islands)
        if k >= len(self._warm) or self._warm[k][0] is not island_identity(fn):
            name = getattr(fn, "__qualname__", repr(fn))
            raise RuntimeError(f"eager island {name} was not reached in the same order during warm-up and capture")
        _, tensors, single = self._warm[k]
        self.end()
        with rec.paused(), torch.no_grad():  # the clones are the engine's doing, not the program's
            statics = tuple(t.detach().clone() for t in tensors)
        rec.adopt_fresh(statics)
        self.islands.append(IslandStep(fn, args, dict(kwargs), statics, single))
        self.begin()
        return statics[0] if single else statics


class CudaGraph:
    """Captured CUDA graph segments with eager islands between them."""

    def __init__(
        self,
        *,
        label: str,
        rec: Recorder,
        graphs: tuple[Any, ...],
        islands: tuple[IslandStep, ...],
        outputs: tuple[torch.Tensor, ...],
        pool: object,
    ) -> None:
        self.label = label
        self.pool = pool
        runners: list[Callable[[], None] | None] = [island_runner(s) for s in islands]
        runners.append(None)
        self._graphs = graphs
        self._segments = tuple(zip(graphs, runners))
        self._outputs = outputs
        self._reads = tuple(rec.inputs.values())
        self._audit_notes = tuple(rec.notes)
        self.stale: tuple[StaleInput, ...] = ()
        self.audit, self._watch = InputAudit(inputs=()), StaleWatch([], [], [])

    @property
    def outputs(self) -> tuple[torch.Tensor, ...]:
        return self._outputs

    @property
    def reads(self) -> tuple[torch.Tensor, ...]:
        """Every tensor the graph reads that capture did not allocate, in first-read order."""
        return self._reads

    def register(self, *, roots: Mapping[str, object], static_inputs: Iterable[torch.Tensor]) -> InputAudit:
        """Name what the graph reads from ``roots``, mark ``static_inputs`` registered, and watch them at replay."""
        self.audit, self._watch = build_audit(self._reads, roots, tuple(static_inputs), notes=self._audit_notes)
        return self.audit

    def replay(self) -> tuple[StaleInput, ...]:
        if not self._segments:
            raise RuntimeError(f"graph {self.label!r} was reset: capture it again before replaying it")
        stale = self._watch.check()
        for graph, island in self._segments:
            graph.replay()
            if island is not None:
                island()
        self.stale = stale
        return stale

    def reset(self) -> None:
        for graph in self._graphs:
            graph.reset()
        self._graphs, self._segments = (), ()

    def __repr__(self) -> str:
        return f"CudaGraph(label={self.label!r}, segments={len(self._segments)})"


class CudaCapture:
    """One open capture on a device: real capture on the current stream, the checking recorder above it.

    Both the callable form and a region (``region.RegionGraph``) capture through it.
    """

    def __init__(self, *, label: str, pool: object = None, capture_error_mode: str = "global",
                 islands: WarmIslands | None = None) -> None:
        check_capture_error_mode(capture_error_mode)
        self.label = label
        self.pool = pool
        self._segments = _Segments(pool, islands, capture_error_mode)
        self._rec = Recorder(capturing=True, capture_error_mode=capture_error_mode,
                             island_impl=self._segments.island if islands is not None else None)
        self._scope = ExitStack()

    def begin(self) -> None:
        refuse_nested("CUDAGraph.capture_begin")  # before CUDA sees a second capture on a capturing stream
        self._scope.enter_context(no_cycle_collection())
        try:
            self._segments.begin()
            self._scope.enter_context(self._rec.active())
        except BaseException:
            self._segments.abort()
            self._scope.close()
            raise

    def end(self, outputs: tuple[torch.Tensor, ...] = (), *, roots: Mapping[str, object] | None = None,
            static_inputs: Iterable[torch.Tensor] = ()) -> CudaGraph:
        rec = self._rec
        try:
            self._scope.close()  # leaves the recorder; a capture another thread invalidated fails here
            self._segments.end()
        except BaseException:
            self._segments.abort()
            raise
        # Capture computed nothing; make that loud until the first replay.
        with torch.no_grad():
            for t in rec.live_fresh():
                poison_storage(t)
            for step in self._segments.islands:
                for t in step.statics:
                    poison_storage(t)
        graphs = tuple(self._segments.graphs)
        if self.pool is None and graphs:
            self.pool = graphs[0].pool()
        graph = CudaGraph(label=self.label, rec=rec, graphs=graphs, islands=tuple(self._segments.islands),
                          outputs=outputs, pool=self.pool)
        graph.register(roots=roots or {}, static_inputs=static_inputs)
        return graph

    def abort(self) -> None:
        try:
            self._scope.close()
        except CaptureError:  # an invalidated capture: the error that ended it matters
            pass
        finally:
            self._segments.abort()


class CudaEngine:
    name = "cuda"

    def __init__(self) -> None:
        self._pool: Any = None
        self._stream: Any = None

    def _ready(self) -> None:
        if not _cuda.is_available():
            raise RuntimeError("the cuda graph engine needs a CUDA device; use the tape engine instead")
        if self._pool is None:
            self._pool = _cuda.graph_pool_handle()
            self._stream = _cuda.Stream()

    def run(self) -> AbstractContextManager[GraphRun]:
        """Capture the regions a program opens with the real ``torch.cuda`` on this thread (``region.py``)."""
        if not _cuda.is_available():
            raise RuntimeError("the cuda graph engine needs a CUDA device; use the tape engine instead")
        return open_run(self, ("CUDAGraph",))

    def open_region(self, *, label: str, pool: object = None, capture_error_mode: str = "global") -> CudaCapture:
        """A capture a program opens itself (``torch.cuda.CUDAGraph.capture_begin``), on its current stream."""
        return CudaCapture(label=label, pool=pool, capture_error_mode=capture_error_mode)

    @no_cycle_collection()
    def capture(
        self,
        fn: Callable[[], object],
        *,
        label: str,
        roots: Mapping[str, object],
        static_inputs: Iterable[torch.Tensor],
        islands: bool = False,
        capture_error_mode: str = "global",
    ) -> CudaGraph:
        check_capture_error_mode(capture_error_mode)
        self._ready()
        static = tuple(static_inputs)
        stream = self._stream
        warm = WarmIslands() if islands else None

        stream.wait_stream(_cuda.current_stream())
        try:
            with _cuda.stream(stream):
                warm_up(fn, warm)  # its undo runs on the side stream too, after the warm-up work
        finally:
            _cuda.current_stream().wait_stream(stream)
            _cuda.synchronize()

        region = CudaCapture(label=label, pool=self._pool, capture_error_mode=capture_error_mode, islands=warm)
        with _cuda.stream(stream):
            region.begin()
            try:
                outputs = static_outputs(fn())
            except BaseException:
                region.abort()
                raise
            graph = region.end(outputs, roots=roots, static_inputs=static)
        _cuda.current_stream().wait_stream(stream)
        _cuda.synchronize()
        return graph

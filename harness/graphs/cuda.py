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
from typing import Any

import torch

from ._audit import StaleWatch, build_audit
from ._islands import island_runner, static_outputs
from ._ops import poison_storage, storage_key
from ._record import IslandStep, Recorder, check_capture_error_mode
from ._warm_up import WarmIslands, island_identity, no_cycle_collection, warm_up
from .engine import InputAudit, StaleInput

__all__ = ["CudaEngine", "CudaGraph"]

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
        graph = _cuda.CUDAGraph()
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
        audit: InputAudit,
        watch: StaleWatch,
        graphs: tuple[Any, ...],
        islands: tuple[IslandStep, ...],
        outputs: tuple[torch.Tensor, ...],
    ) -> None:
        self.label = label
        self.audit = audit
        self._watch = watch
        runners: list[Callable[[], None] | None] = [island_runner(s) for s in islands]
        runners.append(None)
        self._segments = tuple(zip(graphs, runners))
        self._outputs = outputs

    @property
    def outputs(self) -> tuple[torch.Tensor, ...]:
        return self._outputs

    def replay(self) -> tuple[StaleInput, ...]:
        stale = self._watch.check()
        for graph, island in self._segments:
            graph.replay()
            if island is not None:
                island()
        return stale

    def __repr__(self) -> str:
        return f"CudaGraph(label={self.label!r}, segments={len(self._segments)})"


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

        segments = _Segments(self._pool, warm, capture_error_mode)
        rec = Recorder(capturing=True, capture_error_mode=capture_error_mode,
                       island_impl=segments.island if islands else None)
        with _cuda.stream(stream):
            segments.begin()
            try:
                with rec.active():
                    result = fn()
                outputs = static_outputs(result)
                segments.end()
            except BaseException:
                segments.abort()
                raise
        _cuda.current_stream().wait_stream(stream)

        # Capture computed nothing; make that loud until the first replay.
        with torch.no_grad():
            for t in outputs:
                if storage_key(t) in rec.fresh:
                    poison_storage(t)
            for step in segments.islands:
                for t in step.statics:
                    poison_storage(t)
        _cuda.synchronize()

        audit, watch = build_audit(tuple(rec.inputs.values()), roots, static, notes=rec.notes)
        return CudaGraph(
            label=label,
            audit=audit,
            watch=watch,
            graphs=tuple(segments.graphs),
            islands=tuple(segments.islands),
            outputs=outputs,
        )

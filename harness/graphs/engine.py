"""The graph-engine interface shared by the ``tape`` and ``cuda`` engines.

A graph engine captures a Python callable that runs torch ops over static
tensors and replays it later, or, during a run, the capture regions a program
opens itself with ``torch.cuda.graph`` (``region.py``).  Engines are generic: they know nothing about
KV pools, attention or runners.  Everything a caller needs is here; the
engines themselves live in :mod:`harness.graphs.tape` and
:mod:`harness.graphs.cuda`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ._module_roots import module_roots
from ._refusals import CaptureError, _tls

if TYPE_CHECKING:
    import torch

__all__ = [
    "CaptureError",
    "CapturedGraph",
    "GraphEngine",
    "GraphInput",
    "GraphRun",
    "InputAudit",
    "StaleInput",
    "eager_island",
    "module_roots",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphInput:
    """A tensor the graph reads that was not allocated during capture."""

    path: str | None
    """attribute path that held it (a view: its base's path plus the slice); None when no root reaches it"""
    shape: tuple[int, ...]
    dtype: str
    registered: bool
    """shares storage with a tensor the caller passed as a static input"""


@dataclass(frozen=True, slots=True, kw_only=True)
class StaleInput:
    """A graph input that, at replay, is no longer what the program reads under its name.

    ``kind="rebound"``: the attribute at ``path`` now holds another object, while the graph
    keeps reading the tensor it captured.  ``kind="memory"``: the captured tensor itself now
    has another storage (or its storage was reallocated), storage offset or stride, while the
    graph keeps reading the memory and layout it captured (a size change inside the storage's
    capacity moves no memory and is not reported).
    """

    path: str
    """attribute path of the input (a view as its base's path plus the slice), or ``<input k: ...>``"""
    captured: str
    """what the graph reads: the captured tensor, or for ``memory`` its layout at capture"""
    now: str
    """what the program has now: the object at ``path``, or for ``memory`` the tensor's layout now"""
    kind: str = "rebound"
    """``"rebound"`` or ``"memory"``"""
    benign: bool = False
    """rebound only: the captured tensor was written in place since the previous replay, so the graph
    still reads refreshed data (a finding when False: nothing refreshes what the graph reads)"""
    changed: str = ""
    """memory only: what differs, e.g. ``storage 0x7f..40 -> 0x7f..80 (another storage); size [4] -> [2]``"""


@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudit:
    """Every tensor a graph reads that capture did not allocate, in first-read order."""

    inputs: tuple[GraphInput, ...]
    notes: tuple[str, ...] = ()
    """what the engine could not model of this capture and says instead of staying silent: a
    capture-query guard that cannot see the capture on a machine without CUDA (``file:line: code: why``)"""
    rerun_ops: tuple[str, ...] = ()
    """custom ops whose work the dispatcher cannot see (an FFI kernel launch), which replay calls again,
    Python body included, instead of replaying recorded kernels (``namespace::name``; the tape only)"""

    @property
    def unregistered(self) -> tuple[GraphInput, ...]:
        return tuple(i for i in self.inputs if not i.registered)


@runtime_checkable
class CapturedGraph(Protocol):
    label: str
    """the caller's name for it; a region's is the source line that opened it"""
    audit: InputAudit
    stale: tuple[StaleInput, ...]
    """what the latest replay found"""

    @property
    def reads(self) -> tuple[torch.Tensor, ...]:
        """Every tensor the graph reads that capture did not allocate, in first-read order."""
        ...

    def register(self, *, roots: Mapping[str, object], static_inputs: Iterable[torch.Tensor]) -> InputAudit:
        """Name what the graph reads from ``roots`` and mark ``static_inputs`` registered (a region's, after it ends)."""
        ...

    def replay(self) -> tuple[StaleInput, ...]: ...

    def reset(self) -> None:
        """Free the graph; replaying it afterwards is an error."""
        ...


@runtime_checkable
class GraphEngine(Protocol):
    name: str

    def run(self) -> AbstractContextManager[GraphRun]:
        """Serve ``torch.cuda``'s graph API on this thread to code that opens its own capture regions.

        Each ``torch.cuda.graph(...)`` block (or ``CUDAGraph.capture_begin``/``capture_end`` pair) the
        code runs is captured as ``capture`` captures a callable, without the warm-up, and lands in
        ``GraphRun.regions`` (``region.py``).
        """
        ...

    def capture(
        self,
        fn: Callable[[], object],
        *,
        label: str,
        roots: Mapping[str, object],
        static_inputs: Iterable[torch.Tensor],
        islands: bool = False,
        capture_error_mode: str = "global",
    ) -> CapturedGraph:
        """Warm ``fn`` up, capture it and audit what it reads.

        ``capture_error_mode`` is ``torch.cuda.graph``'s: ``"global"`` (PyTorch's default) refuses a host
        sync on any other thread while the capture runs, and the capture fails with it; ``"thread_local"``
        and ``"relaxed"`` let other threads be.
        """
        ...


@dataclass(eq=False)
class GraphRun:
    """What one run (``GraphEngine.run()``) captured: every region, in the order their captures ended."""

    engine: GraphEngine
    regions: list[CapturedGraph] = field(default_factory=list)
    device: Any = None
    """the device the tape plays (``_tape_device.TapeDeviceState``); None on the cuda engine"""
    _open: list[Any] = field(default_factory=list)  # the run's graphs whose capture is open (region.RegionGraph)



class _IslandHost(Protocol):
    def run_island(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any: ...


def eager_island(
    fn: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]], *args: Any, **kwargs: Any
) -> Any:
    """Call ``fn(*args, **kwargs)``.

    Outside any capture, or under a capture with ``islands=False``, this is a plain
    call (with ``islands=False`` the ops inside are captured like any other).  Under
    a capture with ``islands=True``, ``fn`` runs eagerly (not recorded) and is recorded
    as an island that re-runs as Python at every replay, between the captured pieces;
    its tensor outputs become static outputs (at replay the fresh results are copied
    into them).
    """
    host: _IslandHost | None = getattr(_tls, "island_host", None)
    if host is None:
        return fn(*args, **kwargs)
    return host.run_island(fn, args, kwargs)


def weakly_bound(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method``, called through a weak reference to its object, and named as the method.

    For an island whose object holds the graphs it is captured into (a runner's attention): bound strongly,
    the object, its graphs and their islands form a reference cycle that only the cyclic collector frees, and
    every tape with it. The object must outlive the graph's replays (a runner replays from its own methods).
    """
    ref = weakref.WeakMethod(method)  # type: ignore[arg-type]
    name = method.__qualname__  # the name only: the closure holds nothing of the object

    def island(*args: Any, **kwargs: Any) -> Any:
        bound = ref()
        if bound is None:
            raise RuntimeError(f"{name}: its object is gone; a graph cannot replay an island without it")
        return bound(*args, **kwargs)

    island.__name__, island.__qualname__, island.__doc__ = method.__name__, name, method.__doc__
    return island

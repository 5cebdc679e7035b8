"""The warm-up routine both engines run before capture.

``warm_up`` runs the program ``WARMUP_RUNS`` times eagerly before capture, as serving
engines' graph runners do (SGLang's and vLLM's run the function twice, so lazy
initialization, workspace growth and first-use caches happen outside the graph).  The
runs are real: what they write stays written, as it does on a device, so Python state
a run sets (a memo keyed on a tensor's ``data_ptr``, a flag saying a pre-allocated table
is filled) agrees with the tensors capture then finds, and a graph freezes that world.
They are plain eager runs, as on a device, where no stream is capturing yet: a host sync
a program does only on its first call (lazy initialization, the reason runners warm up)
is allowed, and what a run would do under capture is checked by the capture itself.  No
recorder sits under them, so they cost what an eager forward costs.  Their islands run
eagerly and the last run's island results are kept (the cuda engine seeds its segments'
static outputs from them).  A caller that captures in the middle of a
run (a bucket captured on demand) protects live state with its capture batch, whose
padding rows write only the dummy slot, as a real runner's do; nothing is undone.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ._islands import island_outputs
from ._refusals import _tls, refuse_nested

WARMUP_RUNS = 2
"""Eager runs before capture, for both engines."""


@contextmanager
def no_cycle_collection() -> Iterator[None]:
    """Pause the cyclic garbage collector (reference counting still frees everything it can).

    A capture allocates thousands of small tuples and tensors that all survive to its end, which
    makes the collector run over and over through every object of the process for nothing.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class WarmIslands:
    """Island host for warm-up (``engine.eager_island`` finds it): run eagerly, remember the last run's results."""

    def __init__(self) -> None:
        self.results: list[tuple[Any, tuple[torch.Tensor, ...], bool]] = []
        self._depth = 0

    def start_run(self) -> None:
        self.results = []

    def run_island(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._depth:  # an island inside an island is plain code, as under capture
            return fn(*args, **kwargs)
        self._depth += 1
        try:
            result = fn(*args, **kwargs)
        finally:
            self._depth -= 1
        tensors, single = island_outputs(fn, result)
        self.results.append((island_identity(fn), tensors, single))
        return result


def island_identity(fn: Callable[..., Any]) -> Any:
    # A lambda or closure defined inside fn is a new object every run; its code is not.
    return getattr(fn, "__code__", fn)


def warm_up(fn: Callable[[], object], islands: WarmIslands | None) -> None:
    """Run ``fn`` ``WARMUP_RUNS`` times for real: plain eager runs, islands eager, every write kept."""
    refuse_nested("GraphEngine.capture")  # the inner capture's warm-up would run under the outer recorder
    previous = getattr(_tls, "island_host", None)
    _tls.island_host = islands
    try:
        for _ in range(WARMUP_RUNS):
            if islands is not None:
                islands.start_run()
            fn()  # what it returns is checked at capture, as CUDA captures what it returns
    finally:
        _tls.island_host = previous

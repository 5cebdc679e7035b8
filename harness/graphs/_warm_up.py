"""The warm-up routine both engines run before capture.

``warm_up`` runs the program ``WARMUP_RUNS`` times eagerly before capture, as serving
engines' graph runners do (SGLang's and vLLM's run the function twice, so lazy
initialization, workspace growth and first-use caches happen outside the graph).  The
runs are real: what they write stays written, as it does on a device, so Python state
a run sets (a memo keyed on a tensor's ``data_ptr``, a flag saying a pre-allocated table
is filled) agrees with the tensors capture then finds, and a graph freezes that world.
Each run is checked like capture (a refused op raises ``CaptureError`` before any
capture opens) and runs its islands eagerly.  A caller that captures in the middle of a
run (a bucket captured on demand) protects live state with its capture batch, whose
padding rows write only the dummy slot, as a real runner's do; nothing is undone.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ._islands import island_outputs, static_outputs
from ._record import Recorder

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
    """Island handler for warm-up: run eagerly, remember the results of the last run."""

    def __init__(self) -> None:
        self.results: list[tuple[Any, tuple[torch.Tensor, ...], bool]] = []

    def start_run(self) -> None:
        self.results = []

    def __call__(self, rec: Recorder, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with rec.paused():
            result = fn(*args, **kwargs)
        tensors, single = island_outputs(fn, result)
        self.results.append((island_identity(fn), tensors, single))
        return result


def island_identity(fn: Callable[..., Any]) -> Any:
    # A lambda or closure defined inside fn is a new object every run; its code is not.
    return getattr(fn, "__code__", fn)


def warm_up(fn: Callable[[], object], islands: WarmIslands | None) -> None:
    """Run ``fn`` ``WARMUP_RUNS`` times for real: checked, islands eager, every write kept."""
    rec = Recorder(track=False, island_impl=islands)
    for _ in range(WARMUP_RUNS):
        if islands is not None:
            islands.start_run()
        with rec.active():
            static_outputs(fn())

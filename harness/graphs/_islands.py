"""What a captured callable and its eager islands hand back, and the Python an island re-runs at replay.

Both engines check a captured callable's return (``static_outputs``) and an island's
(``island_outputs``) the same way, and replay an island the same way (``island_runner``):
its Python again, its fresh results copied into the static tensors capture handed out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from ._cuda_queries import replaying_island


class IslandCall(Protocol):
    """What replay needs of a recorded island (``_record.IslandStep``)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    statics: tuple[torch.Tensor, ...]


def island_outputs(fn: Callable[..., Any], result: Any) -> tuple[tuple[torch.Tensor, ...], bool]:
    """Validate an island's return; (tensors, single)."""
    if isinstance(result, torch.Tensor):
        return (result,), True
    if isinstance(result, tuple) and all(isinstance(t, torch.Tensor) for t in result):
        return result, False
    name = getattr(fn, "__qualname__", repr(fn))
    raise TypeError(f"eager island {name} must return a tensor or a tuple of tensors, got {type(result).__name__}")


def island_runner(step: IslandCall, into: tuple[torch.Tensor, ...] | None = None) -> Callable[[], None]:
    """What replay runs for an island: its Python again, fresh results copied into the capture's statics.

    ``into`` are tensors over the statics' memory to copy into (the tape's pins); by default the statics.
    """
    fn, args, kwargs, statics = step.fn, step.args, step.kwargs, step.statics
    targets = into if into is not None else statics

    def run() -> None:
        with replaying_island():
            fresh, _ = island_outputs(fn, fn(*args, **kwargs))
        if len(fresh) != len(statics):
            raise RuntimeError(f"eager island {fn.__qualname__} returned {len(fresh)} tensors at replay, {len(statics)} at capture")
        with torch.no_grad():
            for static, new in zip(targets, fresh):
                if new.shape != static.shape:
                    raise RuntimeError(
                        f"eager island {fn.__qualname__} returned shape {tuple(new.shape)} at replay, {tuple(static.shape)} at capture"
                    )
                static.copy_(new)

    return run


def static_outputs(result: object) -> tuple[torch.Tensor, ...]:
    """Validate what a captured callable returned."""
    if result is None:
        return ()
    if isinstance(result, torch.Tensor):
        return (result,)
    if isinstance(result, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in result):
        return tuple(result)
    raise TypeError(f"a captured callable must return a tensor, a tuple of tensors or None, got {type(result).__name__}")

"""Graph engines: capture a callable over static tensors, replay it, audit its inputs.

``tape`` models CUDA-graph semantics on any device (see ``tape.py``); ``cuda``
drives real ``torch.cuda.CUDAGraph`` objects.  Both share the capture-error
checker and the input audit, so they refuse and report the same things.
"""

from .engine import (
    CapturedGraph,
    CaptureError,
    GraphEngine,
    GraphInput,
    InputAudit,
    StaleInput,
    eager_island,
)
from .registry import get_engine

__all__ = [
    "CaptureError",
    "CapturedGraph",
    "GraphEngine",
    "GraphInput",
    "InputAudit",
    "StaleInput",
    "eager_island",
    "get_engine",
]

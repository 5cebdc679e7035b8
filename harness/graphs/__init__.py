"""Graph engines: capture a callable over static tensors, replay it, audit its inputs.

``tape`` models CUDA-graph semantics on any device (see ``tape.py``); ``cuda``
drives real ``torch.cuda.CUDAGraph`` objects.  Both share the warm-up routine
(``_warm_up.py``), the recorder (``_record.py``), the handling of eager islands
and outputs (``_islands.py``), the one table of what CUDA refuses during
capture (``_refusals.py``) and the input audit (``_audit.py``), so they warm up,
refuse and report the same things.
"""

from .engine import (
    CapturedGraph,
    CaptureError,
    GraphEngine,
    GraphInput,
    InputAudit,
    StaleInput,
    eager_island,
    module_roots,
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
    "module_roots",
]

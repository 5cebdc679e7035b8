"""Graph engines: capture a callable over static tensors, replay it, audit its inputs.

``tape`` models CUDA-graph semantics on any device (see ``tape.py``); ``cuda``
drives real ``torch.cuda.CUDAGraph`` objects.  Both share the warm-up routine
(``_warm_up.py``), the recorder (``_record.py``, with what it reads of an op's
schema in ``_ops.py``), the handling of eager islands and outputs
(``_islands.py``), the one table of what CUDA refuses during capture, other
threads included (``_refusals.py``), what ``torch.cuda`` answers about capture
(``_cuda_queries.py``) and the input audit (``_audit.py``, with the module roots
of ``_module_roots.py``), so they warm up, refuse and report the same things.
The tape alone keeps the program's storages it binds where capture found them
(``_homes.py``).  A run (``engine.run()``, ``region.py``) captures the regions a
program opens itself with ``torch.cuda.graph``; on the tape the ``torch.cuda``
names such code asks are served by ``_tape_device.py``.
"""

from .engine import (
    CapturedGraph,
    CaptureError,
    GraphEngine,
    GraphInput,
    GraphRun,
    InputAudit,
    StaleInput,
    eager_island,
    module_roots,
    weakly_bound,
)
from .registry import get_engine

__all__ = [
    "CaptureError",
    "CapturedGraph",
    "GraphEngine",
    "GraphInput",
    "GraphRun",
    "InputAudit",
    "StaleInput",
    "eager_island",
    "get_engine",
    "module_roots",
    "weakly_bound",
]

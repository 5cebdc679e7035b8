"""Graph engines by name: the one module that knows both engines.

Each engine serves both forms of capture: ``capture(fn, ...)`` for a callable, and ``run()`` for code that
opens its own ``torch.cuda.graph`` regions (``region.py``).
"""

from __future__ import annotations

from .cuda import CudaEngine
from .engine import GraphEngine
from .tape import TapeEngine

ENGINES: dict[str, type[TapeEngine] | type[CudaEngine]] = {"tape": TapeEngine, "cuda": CudaEngine}


def get_engine(name: str) -> GraphEngine:
    """A fresh engine instance (a ``cuda`` instance owns one memory pool)."""
    try:
        return ENGINES[name]()
    except KeyError:
        raise ValueError(f"unknown graph engine {name!r}; known engines: {', '.join(ENGINES)}") from None

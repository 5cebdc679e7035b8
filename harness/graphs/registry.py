"""Graph engines by name: the one module that knows both engines."""

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

"""Shared helpers for the graph-engine tests."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterable, Mapping

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.graphs import get_engine


def capture(
    fn: Callable[[], object],
    *,
    roots: Mapping[str, object] | None = None,
    static: Iterable[torch.Tensor] = (),
    islands: bool = False,
    engine: str = "tape",
    **options,
):
    return get_engine(engine).capture(
        fn, label="test", roots=roots or {}, static_inputs=static, islands=islands, **options
    )


class OpLog(TorchDispatchMode):
    """Records the names of the aten ops dispatched while active."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # spare the tests a torch._dynamo import
        return False

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def no_modes_active() -> bool:
    from torch.overrides import _get_current_function_mode
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode() is None and _get_current_function_mode() is None


def _twice_out_of_sight(x: torch.Tensor) -> torch.Tensor:
    """``x * 2`` for a contiguous float32 ``x``, written through numpy: no dispatcher sees the kernel."""
    assert x.dtype == torch.float32 and x.is_contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    src = np.ctypeslib.as_array((ctypes.c_float * n).from_address(x.data_ptr()))
    dst = np.ctypeslib.as_array((ctypes.c_float * n).from_address(out.data_ptr()))
    np.multiply(src, 2.0, out=dst)
    return out


# An op whose work the dispatcher cannot see (as an FFI kernel's), so the tape records it as one opaque op,
# and with no ``.out`` overload, so replay must compute it and copy the result in.
_lib = torch.library.Library("harness_graphs_test", "DEF")
_lib.define("twice(Tensor x) -> Tensor")
_lib.impl("twice", _twice_out_of_sight, "CompositeExplicitAutograd")
twice = torch.ops.harness_graphs_test.twice.default


# Engines a claim is checked on: the tape on the CPU always, real CUDA graphs where a GPU is.
ENGINES = [
    pytest.param(("tape", "cpu"), id="tape"),
    pytest.param(("cuda", "cuda"), id="cuda", marks=[
        pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]),
]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()

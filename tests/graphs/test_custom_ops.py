"""``torch.library`` custom ops are recorded through their bodies, as CUDA captures their kernels.

A custom op with a Python body runs that Python once, at capture: a Python number it reads is
frozen, a host sync in it is refused like anywhere else in the program, and replay re-runs the
aten ops the body dispatched.  Only an op whose work the dispatcher cannot see (an FFI kernel
launch, as FlashInfer's are) is recorded as one opaque op, re-run at every replay, and the audit
names it (``rerun_ops``).
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from harness.graphs import CaptureError

from ._helpers import ENGINES, capture, sync

_SETTINGS = SimpleNamespace(scale=3.0)


@torch.library.custom_op("harness_graphs_custom::scaled", mutates_args=())
def scaled(x: torch.Tensor) -> torch.Tensor:
    return x * _SETTINGS.scale  # a Python number read in the body: CUDA bakes it in at capture


@torch.library.custom_op("harness_graphs_custom::scaled_add_", mutates_args=("out",))
def scaled_add_(out: torch.Tensor, x: torch.Tensor) -> None:
    out.add_(x * _SETTINGS.scale)


@torch.library.custom_op("harness_graphs_custom::synced", mutates_args=())
def synced(x: torch.Tensor) -> torch.Tensor:
    return x * x.sum().item()  # a host sync inside the body


_JITTED: list = []


@torch.library.custom_op("harness_graphs_custom::ffi_double", mutates_args=())
def ffi_double(x: torch.Tensor) -> torch.Tensor:
    """Twice ``x`` (contiguous float32), computed by a kernel no dispatcher sees."""
    if x.is_cuda:  # a kernel compiled and launched outside the dispatcher
        if not _JITTED:
            _JITTED.append(torch.cuda.jiterator._create_jit_fn("template <typename T> T twice(T x) { return x * 2; }"))
        return _JITTED[0](x)
    out = torch.empty_like(x)
    n = x.numel()
    src = np.ctypeslib.as_array((ctypes.c_float * n).from_address(x.data_ptr()))
    dst = np.ctypeslib.as_array((ctypes.c_float * n).from_address(out.data_ptr()))
    np.multiply(src, 2.0, out=dst)  # memory written behind the dispatcher's back, as a C kernel would
    return out


@pytest.fixture(params=ENGINES)
def engine(request):
    return request.param


@pytest.fixture(autouse=True)
def _reset_settings():
    _SETTINGS.scale = 3.0
    yield
    _SETTINGS.scale = 3.0


@pytest.mark.slow  # over two seconds on one core (tests/README.md)
def test_python_number_read_in_a_custom_op_body_is_frozen_at_capture(engine):
    name, device = engine
    s = SimpleNamespace(x=torch.ones(2, device=device))
    g = capture(lambda: scaled(s.x), engine=name, roots={"s": s}, static=[s.x])
    _SETTINGS.scale = 100.0  # the program changes its setting after capture
    s.x.fill_(2.0)
    g.replay()
    sync(device)
    assert g.outputs[0].tolist() == [6.0, 6.0]  # the kernel captured with scale 3, on the live input
    assert g.audit.rerun_ops == ()


def test_mutating_custom_op_replays_the_writes_its_body_dispatched(engine):
    name, device = engine
    s = SimpleNamespace(acc=torch.zeros(2, device=device), x=torch.ones(2, device=device))
    g = capture(lambda: scaled_add_(s.acc, s.x), engine=name, roots={"s": s}, static=[s.acc, s.x])
    _SETTINGS.scale = 100.0
    s.acc.zero_()
    g.replay()
    g.replay()
    sync(device)
    assert s.acc.tolist() == [6.0, 6.0]
    assert g.audit.rerun_ops == ()


def test_host_sync_inside_a_custom_op_body_is_refused_naming_the_body_line(engine):
    name, device = engine
    s = SimpleNamespace(x=torch.ones(2, device=device))
    with pytest.raises(CaptureError) as info:
        capture(lambda: synced(s.x), engine=name)
    assert info.value.op == "aten._local_scalar_dense.default"
    assert "test_custom_ops.py:" in info.value.location and "x.sum().item()" in info.value.location


def test_op_whose_kernel_the_dispatcher_cannot_see_replays_by_re_running_it_and_the_audit_says_so(engine):
    name, device = engine
    s = SimpleNamespace(x=torch.arange(4.0, device=device))
    g = capture(lambda: ffi_double(s.x) + 1, engine=name, roots={"s": s}, static=[s.x])
    s.x.fill_(5.0)
    g.replay()
    sync(device)
    assert g.outputs[0].tolist() == [11.0] * 4
    # a real graph replays the captured kernel; the tape can only call the op again
    assert g.audit.rerun_ops == (("harness_graphs_custom::ffi_double",) if name == "tape" else ())


def test_host_sync_under_inference_mode_is_refused_like_anywhere_else(engine):
    # with autograd excluded, ops the dispatcher decomposes (Tensor.item) reach the recorder undecomposed
    name, device = engine
    s = SimpleNamespace(x=torch.ones(2, device=device))

    def fn():
        with torch.inference_mode():
            return torch.mul(s.x, s.x.sum().item())

    with pytest.raises(CaptureError) as info:
        capture(fn, engine=name)
    assert info.value.op == "aten._local_scalar_dense.default"

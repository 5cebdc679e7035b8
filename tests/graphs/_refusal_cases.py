"""One small program per decision of the refusal table (``harness/graphs/_refusals.py``).

Shared by the CPU tests (the tape decides) and the GPU tests (a bare ``torch.cuda.graph``
capture, no harness involved, decides), which is how the table is checked against CUDA.
Each program takes the ``state`` of one device and calls the op under test on its own line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F


def state(device: str) -> SimpleNamespace:
    """Tensors the programs read, made before capture on ``device``."""
    return SimpleNamespace(
        device=device,
        x=torch.tensor([1.0, -2.0, 3.0, -4.0], device=device),
        i=torch.tensor([2, 0, 2, 1], device=device),
        rep=torch.tensor([1, 2, 0, 1], device=device),
        m=torch.eye(3, device=device) * 2,
        zero=torch.zeros((), device=device),  # a 0-dim device tensor
        host=torch.zeros(4),  # host memory, on any device
        gen=torch.Generator(device=device).manual_seed(0),
    )


@dataclass(frozen=True)
class Case:
    id: str
    key: str
    """the table key deciding it"""
    program: Callable[[SimpleNamespace], object]
    refused_on: frozenset[str]
    """device types on which CUDA's rules refuse it (the tape models a CUDA device on the CPU)"""
    op: str | None = None
    """the op the tape's CaptureError names, when refused on the CPU"""

    def refused(self, device: str) -> bool:
        return torch.device(device).type in self.refused_on


BOTH = frozenset({"cpu", "cuda"})
CUDA_ONLY = frozenset({"cuda"})
NEITHER: frozenset[str] = frozenset()


CASES = [
    # host syncs
    Case("item", "aten::_local_scalar_dense", lambda s: s.x.sum().item(), BOTH, "aten._local_scalar_dense.default"),
    Case("bool", "aten::_local_scalar_dense", lambda s: bool(s.x[0] > 0), BOTH, "aten._local_scalar_dense.default"),
    Case("equal", "aten::equal", lambda s: torch.equal(s.x, s.x), BOTH, "aten.equal.default"),
    Case("allclose", "aten::allclose", lambda s: torch.allclose(s.x, s.x), BOTH, "aten.allclose.default"),
    Case("linalg-inv", "aten::_linalg_check_errors", lambda s: torch.linalg.inv(s.m), BOTH,
         "aten._linalg_check_errors.default"),
    # data-dependent output sizes
    Case("nonzero", "aten::nonzero", lambda s: torch.nonzero(s.x), BOTH, "aten.nonzero.default"),
    Case("masked_select", "aten::masked_select", lambda s: torch.masked_select(s.x, s.x > 0), BOTH,
         "aten.masked_select.default"),
    Case("_unique", "aten::_unique", lambda s: torch._unique(s.i), BOTH, "aten._unique.default"),
    Case("unique", "aten::_unique2", lambda s: torch.unique(s.i), BOTH, "aten._unique2.default"),
    Case("unique-dim", "aten::unique_dim", lambda s: torch.unique(s.i.view(2, 2), dim=0), BOTH, "aten.unique_dim.default"),
    Case("unique_consecutive", "aten::unique_consecutive", lambda s: torch.unique_consecutive(s.i), BOTH,
         "aten.unique_consecutive.default"),
    Case("unique_dim_consecutive", "aten::unique_dim_consecutive",
         lambda s: torch.ops.aten.unique_dim_consecutive.default(s.i.view(2, 2), 0), BOTH,
         "aten.unique_dim_consecutive.default"),
    Case("bincount", "aten::bincount", lambda s: torch.bincount(s.i), BOTH, "aten.bincount.default"),
    Case("repeat_interleave", "aten::repeat_interleave", lambda s: s.i.repeat_interleave(s.rep), BOTH,
         "aten.repeat_interleave.Tensor"),
    Case("repeat_interleave-output_size", "aten::repeat_interleave",
         lambda s: s.i.repeat_interleave(s.rep, output_size=4), NEITHER),
    Case("bool-mask-index", "aten::index", lambda s: s.x[s.x > 0], BOTH, "aten.index.Tensor"),
    Case("integer-index", "aten::index", lambda s: s.x[s.i], NEITHER),
    Case("bool-mask-put-device-scalar", "aten::index_put_", lambda s: s.x.__setitem__(s.x > 0, s.zero), BOTH,
         "aten.index_put_.default"),
    Case("bool-mask-put-tensor", "aten::index_put_", lambda s: s.x.__setitem__(s.i > 1, s.x[:2] * 0), BOTH,
         "aten.index_put_.default"),
    Case("bool-mask-put-python-scalar", "aten::index_put_", lambda s: s.x.__setitem__(s.x > 0, 0.0), NEITHER),
    Case("index_put-out-of-place", "aten::index_put", lambda s: torch.index_put(s.x, (s.x > 0,), s.zero), BOTH,
         "aten.index_put.default"),
    Case("_index_put_impl_", "aten::_index_put_impl_",
         lambda s: torch.ops.aten._index_put_impl_.default(s.x, [s.x > 0], s.zero), BOTH,
         "aten._index_put_impl_.default"),
    # CUDA kernels that read a device value on the host
    Case("masked_fill-device-scalar", "aten::masked_fill", lambda s: s.x.masked_fill(s.x > 0, s.zero), BOTH,
         "aten.masked_fill.Tensor"),
    Case("masked_fill_-device-scalar", "aten::masked_fill_", lambda s: s.x.masked_fill_(s.x > 0, s.zero), BOTH,
         "aten.masked_fill_.Tensor"),
    Case("masked_fill-python-scalar", "aten::masked_fill", lambda s: s.x.masked_fill(s.x > 0, 0.0), NEITHER),
    Case("histc-without-range", "aten::histc", lambda s: torch.histc(s.x), BOTH, "aten.histc.default"),
    Case("histc-with-range", "aten::histc", lambda s: torch.histc(s.x, bins=4, min=-4, max=4), NEITHER),
    # device-to-host copies a torch.device names (the program's own device on a CPU run)
    Case("to-torch.device-cpu", "aten::_to_copy", lambda s: s.x.to(torch.device("cpu")), CUDA_ONLY),
    Case("copy-into-host", "aten::copy_", lambda s: s.host.copy_(s.x), CUDA_ONLY),
    # random numbers
    Case("random-own-generator", "random op with generator=", lambda s: torch.randn(4, generator=s.gen, device=s.device),
         BOTH, "aten.randn.generator"),
    Case("random-default-generator", "random op with generator=", lambda s: torch.randn(4, device=s.device), NEITHER),
    # Python-level host reads
    Case("tolist", "Tensor.tolist", lambda s: s.x.tolist(), BOTH, "Tensor.tolist"),
    Case("numpy", "Tensor.numpy", lambda s: s.x.numpy(), BOTH, "Tensor.numpy"),
    Case("np.asarray", "Tensor.__array__", lambda s: np.asarray(s.x), BOTH, "Tensor.__array__"),
    Case("repr", "Tensor.__repr__", lambda s: repr(s.x), BOTH, "Tensor.__repr__"),
    Case("str", "Tensor.__repr__", lambda s: str(s.x), BOTH, "Tensor.__repr__"),
    Case("f-string", "Tensor.__format__", lambda s: f"{s.x}", BOTH, "Tensor.__format__"),
    Case("cpu", "Tensor.cpu", lambda s: s.x.cpu(), BOTH, "Tensor.cpu"),
    Case("to-cpu-string", "Tensor.to", lambda s: s.x.to("cpu"), BOTH, "Tensor.to"),
    Case("to-dtype", "Tensor.to", lambda s: s.x.to(torch.float64), NEITHER),
    # host data reaching the device
    Case("torch.tensor", "torch.tensor", lambda s: torch.tensor([1.0, 2.0], device=s.device), BOTH, "torch.tensor"),
    Case("torch.as_tensor", "torch.as_tensor", lambda s: torch.as_tensor([1.0, 2.0], device=s.device), BOTH,
         "torch.as_tensor"),
    Case("torch.asarray", "torch.asarray", lambda s: torch.asarray([1.0, 2.0], device=s.device), BOTH, "torch.asarray"),
    Case("new_tensor", "Tensor.new_tensor", lambda s: s.x.new_tensor([1.0, 2.0]), BOTH, "Tensor.new_tensor"),
    Case("from_numpy", "torch.from_numpy", lambda s: torch.from_numpy(np.ones(4, np.float32)).to(s.device), BOTH,
         "torch.from_numpy"),
    Case("frombuffer", "torch.frombuffer",
         lambda s: torch.frombuffer(bytearray(16), dtype=torch.float32).to(s.device), BOTH, "torch.frombuffer"),
    Case("list-index", "Tensor.__getitem__", lambda s: s.x[[0, 2]], BOTH, "Tensor.__getitem__"),
    Case("slice-index", "Tensor.__getitem__", lambda s: s.x[1:3] * 1, NEITHER),
    Case("list-index-assign", "Tensor.__setitem__", lambda s: s.x.__setitem__([0, 2], 1.0), BOTH, "Tensor.__setitem__"),
    Case("numpy-value-assign", "Tensor.__setitem__", lambda s: s.x.__setitem__(np.array([0, 2]), 1.0), BOTH,
         "Tensor.__setitem__"),
    Case("tensor-index-assign", "Tensor.__setitem__", lambda s: s.x.__setitem__(s.i, 1.0), NEITHER),
    # captured by CUDA although the CPU kernel syncs
    Case("one_hot-num_classes", "torch.nn.functional.one_hot", lambda s: F.one_hot(s.i, num_classes=4), NEITHER),
    Case("one_hot-inferred-classes", "aten::_local_scalar_dense", lambda s: F.one_hot(s.i), BOTH,
         "aten._local_scalar_dense.default"),
]

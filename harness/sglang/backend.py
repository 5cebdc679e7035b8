"""The installed SGLang's ``TorchNativeAttnBackend`` as the harness's attention backend: the synthetic model's
layers run as SGLang ``RadixAttention`` over the real backend, which writes and reads the real pool.

Name it in a scenario as ``backends = ["harness.sglang.backend:InstalledTorchNativeAttn"]``, under
``[serving] stack = "sglang"`` (it is constructed with the run's stack, which must be the installed one). Per forward the
builder makes SGLang's ``ForwardBatch`` by hand (its seven required fields and the extend lengths) and calls
the real ``init_forward_metadata``, which translates ``out_cache_loc`` into the backend's
``swa_out_cache_loc``. Per layer the implementation maps the design under test onto that write seam (an SWA
layer's ``swa_out_cache_loc`` is the design's locations; the ``metadata`` design reads the backend's own)
and calls ``RadixAttention.forward`` inside SGLang's ``forward_context``: the real ``forward_extend`` /
``forward_decode`` write through ``SWAKVPool.set_kv_buffer(layer, KVWriteLoc(out_cache_loc, swa_loc))``
and read the layer's buffer through ``req_to_token``. The snapshots and the diff read the same buffers.

Its runs are judged against the harness's own ``torch_native`` backend on the same stack
(``reference_backend``): the real backend's read path is the thing under test, so it cannot be its own
reference. Eager only: SGLang runs torch_native without CUDA graphs, and its graph runners need CUDA.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import torch

from ..backends.base import (
    AttentionBackend,
    AttentionBatch,
    AttentionImpl,
    AttentionMetadataBuilder,
    GraphSupport,
    KVLayout,
)
from ..runspec import Device, KVWrite, Mode
from ..serving.batch import ForwardBatch, ForwardMode
from .stack import require_installed

_NO_GRAPHS = ("the installed TorchNativeAttnBackend runs eager only: SGLang disables CUDA graphs with torch_native, "
              "and its graph runners (DecodeCudaGraphRunner, PrefillCudaGraphRunner) need CUDA and a full ModelRunner")


@dataclass(slots=True, kw_only=True)
class InstalledForward:
    """One forward's state: SGLang's own batch and backend, and the SWA ids the backend computed for it."""

    batch: Any
    """the installed ``ForwardBatch``, built by hand"""
    backend: Any
    """the installed ``TorchNativeAttnBackend`` of the run"""
    out_cache_loc_swa: torch.Tensor | None
    """the backend's own ``swa_out_cache_loc`` after ``init_forward_metadata`` (the ``metadata`` design)"""


class InstalledTorchNativeBuilder(AttentionMetadataBuilder):
    """Builds SGLang's ``ForwardBatch`` per forward and runs the installed ``init_forward_metadata``."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        stack = require_installed(self.stack)
        self.api = stack.api
        # TorchNativeAttnBackend reads only these three attributes of its model runner
        runner = types.SimpleNamespace(device=str(self.device), req_to_token_pool=stack.req_to_token_pool.real,
                                       token_to_kv_pool=stack.kv_pool)
        self.backend = self.api.TorchNativeAttnBackend(runner)

    def build(self, batch: AttentionBatch) -> InstalledForward:
        api = self.api
        extend = batch.forward_mode.is_extend_like  # a target verify is extend-shaped (SGLang: TARGET_VERIFY)
        fb = api.ForwardBatch(
            forward_mode=api.ForwardMode.EXTEND if extend else api.ForwardMode.DECODE, batch_size=batch.bs,
            input_ids=torch.zeros(batch.num_tokens, dtype=torch.int64, device=self.device),
            req_pool_indices=batch.req_pool_indices, seq_lens=batch.seq_lens, out_cache_loc=batch.out_cache_loc,
            seq_lens_sum=batch.seq_lens_sum,
        )
        fb.seq_lens_cpu = torch.tensor(batch.seq_lens_cpu, dtype=torch.int64)
        if extend:
            assert batch.extend_seq_lens is not None
            fb.extend_seq_lens = batch.extend_seq_lens
            fb.extend_prefix_lens = batch.seq_lens - batch.extend_seq_lens
            fb.extend_seq_lens_cpu = list(batch.extend_seq_lens_cpu)
            fb.extend_prefix_lens_cpu = [n - e for n, e in zip(batch.seq_lens_cpu, batch.extend_seq_lens_cpu)]
            fb.extend_num_tokens = batch.num_tokens
        self.backend.init_forward_metadata(fb)
        return InstalledForward(batch=fb, backend=self.backend, out_cache_loc_swa=self.backend.swa_out_cache_loc)

    def init_graph_state(self, max_bs: int) -> None:
        raise RuntimeError(_NO_GRAPHS)

    def build_for_graph_capture(self, batch: AttentionBatch) -> InstalledForward:
        raise RuntimeError(_NO_GRAPHS)

    def refresh_for_graph_replay(self, batch: AttentionBatch) -> InstalledForward:
        raise RuntimeError(_NO_GRAPHS)

    def static_tensors(self) -> list[torch.Tensor]:
        return []


class InstalledTorchNativeImpl(AttentionImpl):
    """Each layer is an installed ``RadixAttention``; the design decides its SWA write ids."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        stack = require_installed(self.stack)
        spec = self.model_spec
        # SGLang's sliding_window_size is the window without the query's own key (-1: full attention)
        windows = [spec.layer_window(i) for i in range(spec.num_layers)]
        if 1 in windows:  # RadixAttention stores ``sliding_window_size or -1``: a window of 0 would read everything
            raise ValueError("a window of one key is SGLang's sliding_window_size 0, which RadixAttention takes for "
                             "full attention")
        self.layers = [
            stack.api.RadixAttention(spec.num_heads, spec.head_dim, scaling=spec.head_dim ** -0.5,
                                     num_kv_heads=spec.num_kv_heads, layer_id=i,
                                     sliding_window_size=-1 if w is None else w - 1)
            for i, w in enumerate(windows)
        ]
        self.api = stack.api

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                forward_batch: ForwardBatch, metadata: InstalledForward) -> torch.Tensor:
        """The installed layer's forward: the backend writes the new K/V (at the design's SWA ids) and attends."""
        if self.pool.is_swa_layer(layer_id):
            loc = self._get_layer_cache_loc(layer_id, forward_batch, metadata)
            metadata.backend.swa_out_cache_loc = loc.to(torch.int64)
        return self._run(q, k, v, layer_id, metadata)

    def attend(self, layer_id: int, q: torch.Tensor, forward_batch: ForwardBatch,
               metadata: InstalledForward) -> torch.Tensor:
        """The installed read path alone: ``RadixAttention.forward`` without K/V writes nothing."""
        return self._run(q, None, None, layer_id, metadata)

    def _run(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, layer_id: int,
             metadata: InstalledForward) -> torch.Tensor:
        with self.api.forward_context(self.api.ForwardContext(attn_backend=metadata.backend)):
            out = self.layers[layer_id].forward(q, k, v, metadata.batch, save_kv_cache=k is not None)
        return out.reshape(q.shape[0], -1)


class InstalledTorchNativeAttn(AttentionBackend):
    """SGLang 0.5.23's ``TorchNativeAttnBackend`` under ``RadixAttention``, on the installed pool."""

    name = "sglang_torch_native"
    graph_support = GraphSupport.NONE
    devices = frozenset({Device.CPU})
    kv_write_paths = frozenset({KVWrite.PLAIN})
    # it reads token slots through req_to_token, whatever the page size
    page_sizes = None
    kv_layouts = frozenset({KVLayout.NHD})
    known_faults = frozenset()
    builder_cls = InstalledTorchNativeBuilder
    impl_cls = InstalledTorchNativeImpl
    reference_backend = "torch_native"

    @classmethod
    def unsupported(cls, *, mode: str, device: str, **case: Any) -> tuple[str, ...]:
        reasons = super().unsupported(mode=mode, device=device, **case)
        if mode == Mode.EAGER:
            return reasons
        # the generic line names the missing graph support; this one says why SGLang has none here
        return tuple(_NO_GRAPHS if "graph support" in r else r for r in reasons)

"""The attention-backend contract, split the way vLLM splits it (``vllm/v1/attention/backend.py``).

A backend is three parts:

* the **declaration** (``AttentionBackend``'s class attributes): its name, how far CUDA graphs can cover
  it (``GraphSupport``, ranked like vLLM's ``AttentionCGSupport``), the devices it runs on, its KV write
  paths and the catalog faults whose switches sit in it. Collection reads these to mark items ``gpu`` and
  to skip (backend, mode) pairs the backend cannot run;
* the **metadata builder**: eager build (fresh tensors per forward), capture build (views of static
  buffers it owns, registered for the graph input audit), and the replay refresh that copies a new batch
  into those buffers *outside* the graph. It is exactly the part that differs between eager, capture and
  replay, which is where most graph bugs live;
* the **implementation**: it owns the SWA write seam, ``_get_layer_cache_loc(layer_id, forward_batch)``,
  which calls the design under test for SWA layers (SGLang PR 24138's function), and the KV write,
  including the fused FP8 path; a subclass supplies only ``attend``.

``AttentionBackend`` also presents SGLang's entry points (``init_forward_metadata``,
``init_forward_metadata_capture_cuda_graph``, ...), which is all a runner calls. A new backend is one
module with three subclasses plus one line in ``registry.py``.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Collection
from typing import ClassVar

import torch

from ..runspec import Device, KVWrite, Mode
from ..serving.batch import BackendMetadata, ForwardBatch, ForwardMode, SWALocDesign
from ..serving.faults import Component, faults_acting_on
from ..serving.model import DTYPES, ModelSpec
from ..serving.pool import HybridSWAKVPool, quantize_fp8


class GraphSupport(enum.IntEnum):
    """How much of a forward CUDA graphs may capture with this backend, ranked."""

    NONE = 0
    """eager only: the backend cannot run between or inside captured pieces"""
    PIECEWISE_ONLY = 1
    """attention must stay an eager island: piecewise prefill graphs"""
    DECODE_ONLY = 2
    """full graphs for decode batches (and piecewise graphs for prefill)"""
    FULL = 3
    """full graphs for any batch"""


_NEEDS = {Mode.EAGER: GraphSupport.NONE, Mode.PIECEWISE: GraphSupport.PIECEWISE_ONLY, Mode.FULL: GraphSupport.DECODE_ONLY}


class AttentionMetadataBuilder(ABC):
    """Builds the per-forward metadata an implementation reads."""

    def __init__(
        self, *, model_spec: ModelSpec, pool: HybridSWAKVPool, req_to_token: torch.Tensor, faults: frozenset[str]
    ) -> None:
        self.model_spec = model_spec
        self.pool = pool
        self.req_to_token = req_to_token
        self.faults = faults
        self.device = pool.device

    @abstractmethod
    def build(self, forward_batch: ForwardBatch) -> BackendMetadata:
        """Fresh metadata for one eager forward."""

    @abstractmethod
    def init_graph_state(self, max_bs: int) -> None:
        """Allocate the static buffers every captured batch size shares."""

    @abstractmethod
    def build_for_graph_capture(
        self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, out_cache_loc: torch.Tensor,
        forward_mode: ForwardMode,
    ) -> BackendMetadata:
        """Metadata over views of the static buffers, filled for the capture batch of ``bs`` rows."""

    @abstractmethod
    def refresh_for_graph_replay(
        self, bs: int, num_real: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
        out_cache_loc: torch.Tensor, forward_mode: ForwardMode,
    ) -> BackendMetadata:
        """Copy the batch about to replay the ``bs`` graph into the static buffers (runs outside the graph)
        and return the metadata object that graph captured."""

    @abstractmethod
    def static_tensors(self) -> list[torch.Tensor]:
        """Every static buffer the builder owns, registered with the graph input audit."""


class AttentionImpl(ABC):
    """Writes a layer's new K/V where the design says, then attends."""

    def __init__(
        self, *, model_spec: ModelSpec, pool: HybridSWAKVPool, design: SWALocDesign, kv_write: KVWrite,
        faults: frozenset[str],
    ) -> None:
        self.model_spec = model_spec
        self.pool = pool
        self.design = design
        self.kv_write = kv_write
        self.faults = faults
        self.dtype = DTYPES[model_spec.dtype]
        self.num_kv_heads = model_spec.num_kv_heads
        self.head_dim = model_spec.head_dim

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, forward_batch: ForwardBatch,
        metadata: BackendMetadata,
    ) -> torch.Tensor:
        self.write_kv(layer_id, forward_batch, metadata, k, v)
        return self.attend(layer_id, q, forward_batch, metadata)

    @abstractmethod
    def attend(
        self, layer_id: int, q: torch.Tensor, forward_batch: ForwardBatch, metadata: BackendMetadata
    ) -> torch.Tensor:
        """Attention output [num_tokens, Hq*D] over what the pool holds after this layer's write."""

    def _get_layer_cache_loc(
        self, layer_id: int, forward_batch: ForwardBatch, metadata: BackendMetadata
    ) -> torch.Tensor:
        """Where this layer writes: ``out_cache_loc`` for full layers, the design's rule for SWA layers."""
        if not self.pool.is_swa_layer(layer_id):
            return forward_batch.out_cache_loc
        return self.design(forward_batch, self.pool, metadata, layer_id)

    def write_kv(
        self, layer_id: int, forward_batch: ForwardBatch, metadata: BackendMetadata, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        t = k.shape[0]
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        loc = self._get_layer_cache_loc(layer_id, forward_batch, metadata)
        if self.kv_write == KVWrite.FUSED_FP8:
            self._fused_fp8_set_kv_buffer(layer_id, loc, k, v)
        else:
            self.pool.set_kv_buffer(layer_id, loc, k, v)

    def _fused_fp8_set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Quantize with the layer's scales and store the bytes in one step, as TRT-LLM's fused write does."""
        k_scale, v_scale = self.pool.kv_scales[layer_id]
        k_buf, v_buf = self.pool.get_kv_buffer(layer_id)
        k_buf[loc] = quantize_fp8(k, k_scale)
        v_buf[loc] = quantize_fp8(v, v_scale)


class AttentionBackend(ABC):
    """A backend's declaration, and SGLang's backend entry points over its builder and implementation."""

    name: ClassVar[str]
    graph_support: ClassVar[GraphSupport]
    devices: ClassVar[frozenset[Device]]
    kv_write_paths: ClassVar[frozenset[KVWrite]] = frozenset({KVWrite.PLAIN, KVWrite.FUSED_FP8})
    known_faults: ClassVar[frozenset[str]] = faults_acting_on(Component.ATTENTION_BACKEND)
    """catalog faults whose switches this backend implements"""
    component: ClassVar[Component] = Component.ATTENTION_BACKEND
    builder_cls: ClassVar[type[AttentionMetadataBuilder]]
    impl_cls: ClassVar[type[AttentionImpl]]

    @classmethod
    def unsupported(cls, *, mode: str, device: str, kv_write: str = KVWrite.PLAIN) -> str | None:
        """Why this backend cannot run a (mode, device, KV write path) combination; None when it can."""
        if device not in cls.devices:
            return f"backend {cls.name} runs on {', '.join(sorted(cls.devices))}, not {device}"
        needed = _NEEDS[Mode(mode)]
        if cls.graph_support < needed:
            return (f"backend {cls.name} declares graph support {cls.graph_support.name}; "
                    f"{mode} mode needs {needed.name} or more")
        if kv_write not in cls.kv_write_paths:
            return f"backend {cls.name} has no {kv_write} KV write path"
        return None

    def __init__(
        self,
        *,
        model_spec: ModelSpec,
        pool: HybridSWAKVPool,
        req_to_token: torch.Tensor,
        design: SWALocDesign,
        kv_write: str = KVWrite.PLAIN,
        faults: Collection[str] = (),
    ) -> None:
        if kv_write not in self.kv_write_paths:
            raise ValueError(f"kv_write must be one of {sorted(self.kv_write_paths)}, got {kv_write!r}")
        if kv_write == KVWrite.FUSED_FP8 and pool.kv_dtype != "fp8_e4m3":
            raise ValueError(f"the fused FP8 KV write needs an fp8_e4m3 pool, not {pool.kv_dtype}")
        self.pool = pool
        self.faults = frozenset(faults) & self.known_faults
        self.builder = self.builder_cls(model_spec=model_spec, pool=pool, req_to_token=req_to_token, faults=self.faults)
        self.impl = self.impl_cls(model_spec=model_spec, pool=pool, design=design, kv_write=KVWrite(kv_write),
                                  faults=self.faults)
        self.forward_metadata: BackendMetadata | None = None

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        self.forward_metadata = self.builder.build(forward_batch)

    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.builder.init_graph_state(max_bs)

    def init_forward_metadata_capture_cuda_graph(
        self, bs: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, out_cache_loc: torch.Tensor,
        forward_mode: ForwardMode,
    ) -> None:
        self.forward_metadata = self.builder.build_for_graph_capture(
            bs, req_pool_indices, seq_lens, out_cache_loc, forward_mode
        )

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, num_real: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
        out_cache_loc: torch.Tensor, forward_mode: ForwardMode,
    ) -> None:
        # eager steps in between rebound forward_metadata; the graph's own object comes back
        self.forward_metadata = self.builder.refresh_for_graph_replay(
            bs, num_real, req_pool_indices, seq_lens, out_cache_loc, forward_mode
        )

    def graph_static_tensors(self) -> list[torch.Tensor]:
        return self.builder.static_tensors()

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        if self.forward_metadata is None:
            raise RuntimeError(f"backend {self.name}: forward before init_forward_metadata")
        return self.impl.forward(q, k, v, layer_id, forward_batch, self.forward_metadata)

"""The seed's own function as a design: the installed ``TRTLLMHAAttnBackend._get_layer_cache_loc`` (the
function SGLang PR 24138 changed) decides where each sliding-window layer writes.

Name it in a scenario as ``harness.sglang.designs:trtllm_layer_cache_loc``. The backend is built without its
constructor (``object.__new__``: the constructor needs CUDA, FlashInfer and a model runner), holding only
what the function reads: ``_swa_kv_pool`` (its ``layers_mapping``) and ``forward_metadata``. The metadata is
the installed ``TRTLLMMHAMetadata``, made afresh once per forward as 0.5.23's ``init_forward_metadata``
makes it: ``swa_out_cache_loc`` is the batch's ``out_cache_loc`` translated through the full-to-SWA mapping
once, as an int64 scatter index. A forward is the harness backend's per-forward metadata object (eager
builds a new one each forward); a new pool is a new run.

``skip_metadata_refresh`` is a fault on that refresh, a patch for a run's child process only (the caller
forks, applies it, runs): after a run's first forward the metadata is never rebuilt, so each later forward
finds the first one's ``swa_out_cache_loc``. When that batch was longer, the tensor passes the function's
length assert (``>= len(out_cache_loc)``) and is sliced: the layer writes at another batch's SWA slots with
no error. Only eager forwards are modelled: a graph replay reuses its captured metadata object, which the
real backend refills in ``init_forward_metadata_out_graph`` and this adapter does not.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ..serving.batch import BackendMetadata, ForwardBatch
from ..serving.pool import HybridSWAKVPool
from .installed import load


class _Adapter:
    """One run's backend instance and the forward its metadata was last built for."""

    def __init__(self, pool: HybridSWAKVPool) -> None:
        api = load()  # the version check and torchvision's stand-in; a run's parent has imported it already
        self.pool = pool
        self.metadata_cls = api.TRTLLMMHAMetadata
        self.backend = object.__new__(api.TRTLLMHAAttnBackend)
        # the function reads layers_mapping[layer_id] -> (index, is_swa); the harness's view of the pool
        # (SGLang's own SWAKVPool under serving = "sglang") has it in that shape
        self.backend._swa_kv_pool = pool
        self.backend.forward_metadata = None
        self.forward: BackendMetadata | None = None
        self.refresh = True
        """False once ``skip_metadata_refresh`` has let the first forward's metadata stand"""

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        """A fresh ``TRTLLMMHAMetadata`` whose ``swa_out_cache_loc`` is this batch's, translated once."""
        metadata = self.metadata_cls()
        metadata.swa_out_cache_loc = self.pool.translate_loc_from_full_to_swa(
            forward_batch.out_cache_loc).to(torch.int64)
        self.backend.forward_metadata = metadata


_adapter: _Adapter | None = None
_skip_refresh = False


def trtllm_layer_cache_loc(
    forward_batch: ForwardBatch, pool: HybridSWAKVPool, metadata: BackendMetadata, layer_id: int
) -> torch.Tensor:
    """The installed ``TRTLLMHAAttnBackend._get_layer_cache_loc`` over metadata built once per forward."""
    global _adapter
    if _adapter is None or _adapter.pool is not pool:
        _adapter = _Adapter(pool)
    if _adapter.forward is not metadata:
        _adapter.forward = metadata
        if _adapter.refresh:
            _adapter.init_forward_metadata(forward_batch)
            _adapter.refresh = not _skip_refresh
    layer = types.SimpleNamespace(layer_id=layer_id)
    return _adapter.backend._get_layer_cache_loc(layer, forward_batch)


@contextmanager
def skip_metadata_refresh() -> Iterator[None]:
    """The fault: inside, a run's metadata is built for its first forward only. Apply it in a child process."""
    global _skip_refresh
    _skip_refresh = True
    try:
        yield
    finally:
        _skip_refresh = False

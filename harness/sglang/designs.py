"""The seed's own function as a design: the installed ``TRTLLMHAAttnBackend._get_layer_cache_loc`` (the
function SGLang PR 24138 changed) decides where each sliding-window layer writes.

Name it in a scenario as ``harness.sglang.designs:trtllm_layer_cache_loc``. The backend is built without its
constructor (``object.__new__``: the constructor needs CUDA, FlashInfer and a model runner), holding only
what the function reads: ``_swa_kv_pool`` (its ``layers_mapping``) and ``forward_metadata``. The metadata is
the installed ``TRTLLMMHAMetadata``, made afresh once per forward as 0.5.23's ``init_forward_metadata``
makes it: ``swa_out_cache_loc`` is the batch's ``out_cache_loc`` translated through the full-to-SWA mapping
once, as an int64 scatter index. A forward is the harness backend's per-forward metadata object (eager
builds a new one each forward); a new pool is a new run.

``skip_metadata_refresh`` is a fault on that refresh (the catalog's ``sglang_skip_metadata_refresh``, entered
around a run in its own process): after a run's first forward the metadata is never rebuilt, so each later
forward finds the first one's ``swa_out_cache_loc``. When that batch was longer, the tensor passes the
function's length assert (``>= len(out_cache_loc)``) and is sliced: the layer writes at another batch's SWA
slots with no error. Only eager forwards are modelled: a graph replay reuses its captured metadata object,
which the real backend refills in ``init_forward_metadata_out_graph`` and this adapter does not.

``installed_plan`` is the location plan of 0.5.23 as a design: the installed ``KVIndexTranslator`` makes one
``KVLocPlan`` per scheduler iteration and every forward of it takes its columns of the plan's SWA ids.
``faults.reuse_previous_plan`` patches the translator to serve the previous iteration's SWA ids.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ..serving.batch import BackendMetadata, ForwardBatch
from ..serving.loc_plan import KVLocPlan
from ..serving.pool import HybridSWAKVPool
from .installed import load
from .stack import installed_stack


class _Adapter:
    """One run's backend instance and the forward its metadata was last built for."""

    def __init__(self, pool: HybridSWAKVPool) -> None:
        api = load()  # the version check and torchvision's stand-in; a run's parent has imported it already
        self.pool = pool
        self.metadata_cls = api.TRTLLMMHAMetadata
        self.backend = object.__new__(api.TRTLLMHAAttnBackend)
        # the function reads layers_mapping[layer_id] -> (index, is_swa); the harness's view of the pool
        # (SGLang's own SWAKVPool under [serving] stack = "sglang") has it in that shape
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


class _PlanAdapter:
    """One run's installed ``KVIndexTranslator`` and the iteration its plan was last built for."""

    def __init__(self, pool: HybridSWAKVPool) -> None:
        stack = installed_stack(pool)
        self.api = stack.api
        self.pool = pool
        self.translator = stack.api.KVIndexTranslator(
            req_to_token=stack.req_to_token_pool.req_to_token, token_to_kv_pool_allocator=stack.allocator,
            token_to_kv_pool=stack.kv_pool, page_size=stack.page_size, device=str(stack.device))
        self.iteration: KVLocPlan | None = None
        self.plan: Any = None
        """the installed ``KVLocPlan`` of that iteration"""

    def swa_ids(self, forward_batch: ForwardBatch) -> torch.Tensor:
        """This forward's columns of the iteration's SWA write ids, as ``KVIndexTranslator.write_ids`` gives
        them to trtllm_mha, flashinfer and triton (padded with the sink to ``out_cache_loc``'s length)."""
        harness_plan = forward_batch.kv_loc_plan
        if harness_plan is None:
            raise RuntimeError("the batch carries no kv_loc_plan: the scheduler builds one per iteration")
        if harness_plan is not self.iteration:  # a new iteration: a new plan, as the scheduler's translator makes
            self.iteration = harness_plan
            self.plan = self.translator.plan(
                req_pool_indices=forward_batch.req_pool_indices, seq_lens=forward_batch.seq_lens,
                seq_lens_cpu=forward_batch.seq_lens.cpu(), write_virtual=harness_plan.write_ids("full"))
        forward = types.SimpleNamespace(out_cache_loc=None)
        self.plan.bind(forward, self.translator, cols=self.api.TokenSpan(*forward_batch.kv_loc_cols))
        ids = self.translator.write_ids(forward, self.api.IdSpaceKind.SLIDING_WINDOW)
        n = forward_batch.out_cache_loc.shape[0]
        # the consumer's length check, as _get_layer_cache_loc makes it: at least one id per token, the rest cut
        if ids.shape[0] < n:
            raise RuntimeError(f"the installed plan holds {ids.shape[0]} SWA ids for {n} tokens")
        return ids[:n]


_plans: _PlanAdapter | None = None


def installed_plan(
    forward_batch: ForwardBatch, pool: HybridSWAKVPool, metadata: BackendMetadata, layer_id: int
) -> torch.Tensor:
    """The SWA write ids of the installed ``KVLocPlan``: one plan per scheduler iteration from the installed
    ``KVIndexTranslator``, translated once per sub-pool and shared by every forward of the iteration (SGLang
    0.5.23, PRs 35245, 37307). Needs ``[serving] stack = "sglang"``."""
    global _plans
    if _plans is None or _plans.pool is not pool:
        _plans = _PlanAdapter(pool)
    return _plans.swa_ids(forward_batch)


@contextmanager
def skip_metadata_refresh() -> Iterator[None]:
    """The fault: inside, a run's metadata is built for its first forward only. Apply it in a child process."""
    global _skip_refresh
    _skip_refresh = True
    try:
        yield
    finally:
        _skip_refresh = False

"""Faults patched, at run time, into the installed ``TRTLLMHAAttnBackend`` (0.5.23) under SGLang's decode graph
runner: each a context manager re-creating one upstream bug family in the code 0.5.23 runs (the installed files
are never edited). ``tests/sglang/test_trtllm_graph.py`` runs each with its expected verdict and without it; the
target-verify faults (``verify_*``) are run by ``tests/sglang/test_trtllm_verify.py``, the draft-extend one
(``draft_extend_v2_*``) by ``tests/sglang/test_trtllm_draft_extend_v2.py``.

The runner's own padding fault (a padded ``out_cache_loc`` row left at a live slot) is
``graph_runner.padded_out_cache_loc_left_stale``, shared with the torch-native backend.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from . import trtllm_cpu
from .installed import load


def _backend_cls() -> type:
    return load().TRTLLMHAAttnBackend


@contextmanager
def _patched(owner: Any, **replacements: Any) -> Iterator[None]:
    saved = {name: getattr(owner, name) for name in replacements}
    for name, value in replacements.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(owner, name, value)


@contextmanager
def prefix_layer_cache_loc() -> Iterator[None]:
    """The seed's ``_get_layer_cache_loc`` before PR 24138: an SWA layer's write location is
    ``out_cache_loc`` translated through the pool's live mapping at every layer, and the planned
    ``forward_metadata.swa_out_cache_loc`` is ignored. Patched on the method (the FP8 path's caller) and on the
    write the non-FP8 paths build (``KVWriteLoc.for_batch`` as ``trtllm_mha_backend`` looks it up). It acts only where
    the mapping changes between the plan and the write: under the overlap ordering (``run_timeline(overlap=True)``),
    where the write-location audit flags it; in the synchronous ordering it writes where planned."""
    load()
    from sglang.srt.layers.attention import trtllm_mha_backend
    from sglang.srt.model_executor.forward_context import get_attn_backend

    real = trtllm_mha_backend.KVWriteLoc

    def layer_cache_loc(self, layer, forward_batch):  # noqa: ANN001, ANN202
        if self._swa_kv_pool is not None and self._swa_kv_pool.layers_mapping[layer.layer_id][1]:
            return self._swa_kv_pool.translate_loc_from_full_to_swa(forward_batch.out_cache_loc)
        return forward_batch.out_cache_loc

    class PerLayerTranslation(real):  # type: ignore[misc, valid-type]
        @classmethod
        def for_batch(cls, forward_batch, swa_loc=None, **kwargs):  # noqa: ANN001, ANN206
            if swa_loc is not None:  # an SWA pool: the forward context's backend is the one writing
                swa_loc = get_attn_backend()._swa_kv_pool.translate_loc_from_full_to_swa(forward_batch.out_cache_loc)
            return real.for_batch(forward_batch, swa_loc=swa_loc, **kwargs)

    with _patched(_backend_cls(), _get_layer_cache_loc=layer_cache_loc), \
            _patched(trtllm_mha_backend, KVWriteLoc=PerLayerTranslation):
        yield


@contextmanager
def metadata_not_refreshed_on_replay() -> Iterator[None]:
    """The graph metadata (cache_seqlens, cu_seqlens_k, page tables, SWA write ids) built once, out of the graph,
    when each bucket is captured, and nothing inside the graph rebuilds it: the in-graph hook
    (``init_forward_metadata_in_graph``) is empty and capture's out-of-graph prep runs its body. Every replay
    reads the capture batch's lengths and tables and writes the SWA layers at the capture batch's ids (the
    family of the harness's ``sglang_skip_metadata_refresh``; PR 27617's per-forward refill)."""
    cls = _backend_cls()
    original_out, original_in = cls.init_forward_metadata_out_graph, cls.init_forward_metadata_in_graph

    def out_graph(self, forward_batch, in_capture=False):  # noqa: ANN001, ANN202
        original_out(self, forward_batch, in_capture=in_capture)
        if in_capture:
            original_in(self, forward_batch)

    def in_graph(self, forward_batch):  # noqa: ANN001, ANN202
        pass

    with _patched(cls, init_forward_metadata_out_graph=out_graph, init_forward_metadata_in_graph=in_graph):
        yield


@contextmanager
def swa_pad_tail_left_stale() -> Iterator[None]:
    """SGLang PR 24743 in 0.5.23's terms: the static SWA write ids (``cuda_graph_swa_out_cache_loc``) are refilled
    out of the graph at replay prep for the batch's own rows only, from the iteration's plan, and the padded tail
    keeps what the previous replay wrote (0.5.23's fused kernel translates and zero-pads the whole bucket inside
    the graph; here it is handed no SWA buffer). A padded row then writes its SWA K/V at a slot an earlier batch
    wrote, which the allocator may have handed to a live token."""
    cls = _backend_cls()
    original_out = cls.init_forward_metadata_out_graph
    launch = trtllm_cpu.update_trtllm_mha_graph_metadata

    def out_graph(self, forward_batch, in_capture=False):  # noqa: ANN001, ANN202
        original_out(self, forward_batch, in_capture=in_capture)
        if not in_capture and self.use_sliding_window_kv_pool:
            loc = forward_batch.out_cache_loc
            mapping = self._swa_kv_pool.full_to_swa_index_mapping
            self.cuda_graph_swa_out_cache_loc[: loc.shape[0]].copy_(mapping[loc])

    def without_swa_out(**kwargs):  # noqa: ANN003, ANN202
        launch(**{**kwargs, "swa_out_cache_loc": None})

    with _patched(cls, init_forward_metadata_out_graph=out_graph), \
            _patched(trtllm_cpu, update_trtllm_mha_graph_metadata=without_swa_out):
        yield


@contextmanager
def swa_loc_not_preset_before_capture() -> Iterator[None]:
    """SGLang PR 23552 in 0.5.23's terms: capture's graph metadata (``_build_cuda_graph_metadata``) does not bind
    the static SWA write-target buffer, so the captured forward has no SWA write location of its own."""
    cls = _backend_cls()
    original = cls._build_cuda_graph_metadata

    def build(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        metadata = original(self, *args, **kwargs)
        metadata.swa_out_cache_loc = None
        return metadata

    with _patched(cls, _build_cuda_graph_metadata=build):
        yield


@contextmanager
def verify_graph_swa_metadata_not_refreshed() -> Iterator[None]:
    """The target-verify graph without SWA window metadata of its own batch (the family of SGLang PR 29858 and
    issue 22679: a verify or draft-extend path that builds the full-pool metadata and skips the SWA one): the
    in-graph metadata of a ``TARGET_VERIFY`` forward (``_apply_cuda_graph_metadata``) launches the fused kernel
    without the SWA page table and the SWA write ids, so a replayed verify reads its SWA layers through the
    capture batch's SWA page table and writes them at the capture batch's SWA ids (zeros: the dummy slot), while
    its full-pool metadata is rebuilt. Decode graphs and every eager forward are untouched."""
    load()
    from sglang.srt.layers.attention import trtllm_mha_backend

    cls = _backend_cls()
    original = cls._apply_cuda_graph_metadata

    def apply(self, bs, req_pool_indices, seq_lens, forward_mode, spec_info, out_cache_loc=None):  # noqa: ANN001, ANN202
        if not forward_mode.is_target_verify():
            return original(self, bs, req_pool_indices, seq_lens, forward_mode, spec_info, out_cache_loc)
        launch = trtllm_mha_backend.update_trtllm_mha_graph_metadata

        def without_swa(**kwargs):  # noqa: ANN003, ANN202
            launch(**{**kwargs, "swa_page_table": None, "swa_out_cache_loc": None})

        with _patched(trtllm_mha_backend, update_trtllm_mha_graph_metadata=without_swa):
            return original(self, bs, req_pool_indices, seq_lens, forward_mode, spec_info, out_cache_loc)

    with _patched(cls, _apply_cuda_graph_metadata=apply):
        yield



@contextmanager
def _eager_swa_page_table_over(applies: Any, lengths: Any) -> Iterator[None]:
    """``init_forward_metadata`` as 0.5.23 builds it, then, for the forwards ``applies(forward_batch)`` picks, an SWA
    page table rebuilt by SGLang's page-table kernel (as the backend module looks it up) over ``lengths(
    forward_batch)`` only: the columns past them at page 0 (the dummy page). What both eager SWA-window faults
    below share."""
    import torch

    load()
    from sglang.srt.layers.attention import trtllm_mha_backend

    cls = _backend_cls()
    original = cls.init_forward_metadata

    def init(self, forward_batch):  # noqa: ANN001, ANN202
        original(self, forward_batch)
        metadata = self.forward_metadata
        if not applies(forward_batch) or metadata.swa_page_table is None:
            return
        committed = torch.zeros_like(metadata.page_table)
        swa = torch.zeros_like(metadata.swa_page_table)
        trtllm_mha_backend.build_trtllm_mha_page_table(
            req_to_token=self.req_to_token, req_pool_indices=forward_batch.req_pool_indices,
            cache_seqlens=lengths(forward_batch).to(torch.int32), page_table=committed, page_size=self.page_size,
            swa_page_table=swa, full_to_swa=self._swa_kv_pool.full_to_swa_index_mapping)
        metadata.swa_page_table = swa

    with _patched(cls, init_forward_metadata=init):
        yield


@contextmanager
def verify_swa_page_table_without_draft_tokens() -> Iterator[None]:
    """The eager target-verify metadata with an SWA page table of the committed tokens only (a verify whose SWA
    window metadata is built by the decode rule, from ``seq_lens`` without the draft tokens: the shape of issue
    22679): ``init_forward_metadata``'s ``TARGET_VERIFY`` branch builds its full page table over ``seq_lens + 1 +
    steps`` as 0.5.23 does, and the SWA page table over ``seq_lens`` only, its draft columns at page 0 (the dummy
    page), so SWA layers read the dummy K/V in place of the draft tokens' own. SGLang's page-table kernel builds the
    faulty table (``build_trtllm_mha_page_table`` as the backend module looks it up). Decode and extend forwards,
    and replayed verifies, are untouched."""
    with _eager_swa_page_table_over(lambda fb: fb.forward_mode.is_target_verify(), lambda fb: fb.seq_lens):
        yield



@contextmanager
def draft_extend_v2_swa_page_table_without_window() -> Iterator[None]:
    """The eager ``DRAFT_EXTEND_V2`` metadata with an SWA page table of the committed tokens only (the draft-extend's
    SWA window metadata built from the lengths before the verify window, as if its ``seq_lens`` had not been
    bumped by ``num_draft_tokens``: the shape of issue 22679 on the draft-extend path): ``init_forward_metadata``
    builds its full page table over the post-write lengths as 0.5.23 does, and the SWA page table over
    ``seq_lens - (1 + steps)`` only, the window's columns at page 0 (the dummy page), so the draft-extend's SWA
    layers read the dummy K/V in place of the window's own keys. SGLang's page-table kernel builds the faulty
    table. Its write ids are untouched; verifies, decodes and extends are too."""
    with _eager_swa_page_table_over(lambda fb: fb.forward_mode.is_draft_extend_v2(), lambda fb: fb.seq_lens - fb.extend_seq_lens):
        yield

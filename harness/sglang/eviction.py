"""SGLang's own eviction decision as an eviction policy: the installed ``free_swa_out_of_window_slots``, gated
the way 0.5.23's ``ScheduleBatch.maybe_evict_swa`` gates it, says where a request's SWA frontier goes.

Name it in a scenario as ``eviction.policy = "harness.sglang.eviction:InstalledSGLangEviction"``. The policy
asks the real function, over a request record (``ReqKvInfo``) holding the request's frontier so far, and
reads the frontier it leaves; the function's free is not taken there but by the scheduler, which frees the
slots it names through the stack (under ``[serving] stack = "sglang"``, the installed allocator's
``free_swa_segment``, the call the real function makes). The caller's gates are reproduced from 0.5.23:
decode batches free once the window has slid ``interval`` tokens past the frontier (the batch's trigger;
the function itself is then called with an interval of 1), never in a request's first decode batch, and
extend batches free (with an interval of 1) only without prefix sharing.

The harness's ``sglang`` policy (``serving/eviction.py``) is the miniature's model of this; the differential
test (``harness.sglang.differential``) compares the two step by step.
"""

from __future__ import annotations

import sys
import types

import torch

from ..serving.eviction import EvictionPolicy, EvictionSpec, RequestWindow
from .installed import load


class InstalledSGLangEviction(EvictionPolicy):
    """Frontiers from the installed SGLang's ``free_swa_out_of_window_slots``."""

    name = "sglang_installed"
    evicts_at_batch_build = True  # as maybe_evict_swa: building a batch, for the requests in it

    def __init__(self, spec: EvictionSpec = EvictionSpec(), *, window: int, page_size: int = 1,
                 prefix_sharing: bool = False) -> None:
        super().__init__(spec, window=window, page_size=page_size, prefix_sharing=prefix_sharing)
        self._api = load()
        # looked up at each call, as SGLang's prefix caches import it at theirs: a fault patches the module
        self._common = sys.modules[self._api.free_swa_out_of_window_slots.__module__]
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType  # noqa: PLC0415
        self._swa = ComponentType.SWA
        # SGLang's sliding_window_size is the window without the query's own key
        self.sliding_window_size = window - 1

    def frontier(self, req: RequestWindow) -> int:
        if req.prefilling:
            if self.prefix_sharing:
                return req.swa_evicted
            return self._ask(pre_len=req.seq_len, evicted=req.swa_evicted, interval=1)
        if req.decoded == 0:
            return req.swa_evicted  # the next batch is the request's first decode batch (decode_batch_idx 0)
        # the batch's trigger, as _swa_eviction_trigger builds it: seqlen - 1 is the tokens cached so far
        if req.seq_len - self.sliding_window_size < req.swa_evicted + self.spec.interval:
            return req.swa_evicted
        return self._ask(pre_len=req.seq_len, evicted=req.swa_evicted, interval=1)

    def _ask(self, *, pre_len: int, evicted: int, interval: int) -> int:
        kv = self._api.ReqKvInfo(req_pool_idx=0, kv_allocated_len=pre_len, kv_committed_len=pre_len)
        kv.set_evicted_seqlen(self._swa, evicted)
        # the request's row as positions, so the slots the function would free name the positions themselves
        rows = types.SimpleNamespace(req_to_token=torch.arange(pre_len + 1, dtype=torch.int64)[None])
        self._common.free_swa_out_of_window_slots(
            types.SimpleNamespace(kv=kv), pre_len, sliding_window_size=self.sliding_window_size,
            page_size=self.page_size, req_to_token_pool=rows, token_to_kv_pool_allocator=None,
            supports_prefix_sharing=self.prefix_sharing, eviction_interval=interval,
            free_segment=_free_nothing,
        )
        return max(evicted, int(kv.get_evicted_seqlen(self._swa)))


def _free_nothing(free_slots: torch.Tensor, *, start_pos: int) -> None:
    """The function's free, left to the scheduler (which frees those positions through the stack)."""

"""The piecewise prefill graph runner, shaped like SGLang's: everything but attention is captured.

Extend batches are bucketed by token count. Static ``input_ids``, ``positions``, ``out_cache_loc`` and
``out_cache_loc_swa`` are zero-padded to the bucket; the captured pieces run over the whole bucket, and
attention runs between them as an eager island on views narrowed to the real tokens, with
``pool.swa_loc`` pointed at the narrowed static SWA locations for the call and restored after.

Because attention runs eagerly on views of the same static buffers at every replay, anything keyed on
those buffers' addresses sees the same key for different batches: the ``memoized`` design depends on
the runner invalidating it once per forward (the ``skip_memo_invalidate`` fault skips that). The static
batch's SWA locations are where two more replay bugs lived: left at the bucket's length while
``out_cache_loc`` is narrowed (``swa_loc_not_narrowed``, SGLang PR 29460), or left out altogether
(``static_batch_without_swa_loc``, SGLang PR 14248).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

import torch

from ..graphs.engine import GraphEngine, eager_island, module_roots, weakly_bound
from ..graphs.registry import get_engine
from ..runspec import RunSpec
from ..serving.batch import ForwardBatch, ForwardMode, make_forward_batch
from ..serving.faults import Component
from ..serving.loc_plan import KVLocPlan
from .base import GraphRunner, Runner, RunnerContext, fill_static, swa_out_cache_loc
from .dispatch import GraphCover


class PiecewisePrefillRunner(GraphRunner):
    component = Component.PIECEWISE_RUNNER

    @classmethod
    def for_run(cls, ctx: RunnerContext, spec: RunSpec, *, eager: Runner) -> PiecewisePrefillRunner:
        return cls(ctx, eager=eager, engine=get_engine(spec.engine), buckets=spec.graphs.prefill_buckets,
                   faults=spec.faults)

    def __init__(
        self,
        ctx: RunnerContext,
        *,
        eager: Runner,
        engine: GraphEngine,
        buckets: tuple[int, ...],
        faults: Collection[str] = (),
    ) -> None:
        super().__init__(ctx, eager=eager, engine=engine, buckets=buckets, faults=faults)
        # extend batches of any mix of lengths, bucketed by tokens
        self.covers = (GraphCover(forward_mode=ForwardMode.EXTEND, tokens_per_request=None, buckets=self.buckets,
                                  captures_attention=False),)
        n, dev = self.buckets[-1], self.pool.device
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.zeros(n, dtype=torch.int64, device=dev)
        self.out_cache_loc_swa = torch.zeros(n, dtype=torch.int32, device=dev)
        self._hidden_width = self.model.spec.num_heads * self.model.spec.head_dim
        self._batch: ForwardBatch | None = None
        self._num_real = 0
        # the runner holds its graphs and each graph its island: bound weakly, they form no reference cycle
        self._island = weakly_bound(self._attention)
        for bucket in reversed(self.buckets):
            self._capture(bucket)

    def _narrow(self, batch: ForwardBatch, n: int, *, bucket: int | None = None) -> ForwardBatch:
        """The real batch re-pointed at views of the static buffers, as attention sees it at replay.

        ``bucket`` is given at replay only, where the faults of the static batch's SWA locations act (both
        real bugs were in SGLang's replay preparation, never in capture).
        """
        swa: torch.Tensor | None = self.out_cache_loc_swa[:n]
        if bucket is not None and "swa_loc_not_narrowed" in self.faults:
            # SGLang PR 29460: out_cache_loc is narrowed to the real tokens, the SWA write ids are not
            swa = self.out_cache_loc_swa[:bucket]
        if bucket is not None and "static_batch_without_swa_loc" in self.faults:
            # SGLang PR 14248: the copy's condition tested the incoming batch, so the static one went without
            swa = None
        return dataclasses.replace(
            batch,
            input_ids=self.input_ids[:n],
            positions=self.positions[:n],
            out_cache_loc=self.out_cache_loc[:n],
            out_cache_loc_swa=swa,
        )

    def _attention(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The eager island: runs as Python at every replay, between the captured pieces."""
        n, batch = self._num_real, self._batch
        assert batch is not None
        previous = self.pool.swa_loc
        # as SGLang's eager step: pointed at the batch's SWA locations when it carries them, never cleared
        if batch.out_cache_loc_swa is not None:
            self.pool.set_swa_loc(batch.out_cache_loc_swa)
        rows = q.shape[0]
        full = n == rows
        if not full:
            q, k, v = q[:n], k[:n], v[:n]
        try:
            real = self.backend.forward(q, k, v, layer_id, batch)
        finally:
            self.pool.set_swa_loc(previous)
        if full:
            return real
        out = real.new_zeros(rows, self._hidden_width)
        out[:n] = real
        return out

    def _capture(self, bucket: int) -> None:
        # capture batch: one dummy request whose tokens all write to the dummy slot
        for buf in (self.input_ids, self.positions, self.out_cache_loc, self.out_cache_loc_swa):
            buf[:bucket].zero_()
        dummy = self._narrow(
            make_forward_batch(
                forward_mode=ForwardMode.EXTEND,
                input_ids=self.input_ids[:bucket],
                positions=self.positions[:bucket],
                req_pool_indices=torch.zeros(1, dtype=torch.int64, device=self.pool.device),
                prefix_lens=[0],
                extend_lens=[bucket],
                out_cache_loc=self.out_cache_loc[:bucket],
                req_to_token_pool=self.req_to_token_pool,
                pool=self.pool,
                # a runner holds the pool, not the stack; every token of this batch writes the dummy slot
                translate=self.pool.translate_loc_from_full_to_swa,
            ),
            bucket,
        )
        # the capture batch's location plan: the static SWA ids, all at the sink like its other rows
        dummy = dataclasses.replace(dummy, kv_loc_plan=KVLocPlan.over_static(
            full_ids=self.out_cache_loc[:bucket], swa_ids=self.out_cache_loc_swa[:bucket]), kv_loc_cols=(0, bucket))
        self._batch, self._num_real = dummy, bucket
        self.backend.init_forward_metadata(dummy)
        model, ids, pos = self.model, self.input_ids[:bucket], self.positions[:bucket]
        produced: list[torch.Tensor] = []

        def forward() -> torch.Tensor:
            out = model.forward(ids, pos, lambda layer_id, q, k, v: eager_island(self._island, layer_id, q, k, v))
            produced.append(out)
            return out

        graph = self.engine.capture(
            forward,
            label=self.covers[0].key(bucket).name,
            # not the runner: its _batch is per-replay Python state that the island reads, never the graph
            roots={"pool": self.pool, "backend": self.backend, "model": self.model,
                   # module-level state of the design, the backend and this runner, named module.attr
                   **module_roots(self.backend.impl.design, self.backend.impl, self.backend, self)},
            static_inputs=[self.input_ids, self.positions, self.out_cache_loc, self.out_cache_loc_swa,
                           *self.model.parameters(), *self.model.buffers(), *self.pool.buffers()],
            islands=True,
        )
        self._keep(bucket, graph, produced[-1])
        self._batch = None

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        if batch.forward_mode is not ForwardMode.EXTEND:
            return self._run_eagerly(batch, batch.num_tokens, fallback=False)
        n = batch.num_tokens
        bucket = self.bucket_for(n)
        if bucket is None:
            return self._run_eagerly(batch, n, fallback=True)
        swa = swa_out_cache_loc(batch, self.pool)
        for static, real in ((self.input_ids, batch.input_ids), (self.positions, batch.positions),
                             (self.out_cache_loc, batch.out_cache_loc), (self.out_cache_loc_swa, swa)):
            fill_static(static, real, bucket, 0)
        self._batch, self._num_real = self._narrow(batch, n, bucket=bucket), n
        if "skip_memo_invalidate" not in self.faults:
            self.pool.invalidate_translate_cache()
        self.backend.init_forward_metadata(self._batch)
        return self._replay(bucket, n)

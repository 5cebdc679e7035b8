"""The target-verify graph runner: full graphs of the verify forward, one per batch-size bucket, for a backend
whose graphs capture uniform batches (``GraphSupport.UNIFORM_BATCH``).

A verify after a draft of ``steps`` tokens is extend-shaped with the same number of tokens in every request:
each request's last token and its draft tokens, ``n = 1 + steps``. That shape is what makes it capturable:
the token rows, the positions' layout and every buffer's length depend on the bucket and ``n`` alone, as in
SGLang's decode graph runner, which captures the ``TARGET_VERIFY`` forward with ``num_tokens_per_bs = 1 +
steps`` (its backends keep a ``target_verify_metadata`` of their own). Static buffers of the bucket-2 graph of
a 3-step verify (requests r0 r1, padding row p; ``rNK``: request N's verify token K)::

    input_ids / positions / out_cache_loc / out_cache_loc_swa / plan   [ r00 r01 r02 r03 | r10 .. r13 | p p p p ]
    req_pool_indices                                                    [ r0 r1 0 ]
    seq_lens (after the verify)                                         [ n0 n1 4 ]   padding: n keys each
    extend_prefix_lens = seq_lens - n, extend_seq_lens = n

Padding tokens write at the dummy slot 0 in both pools and read the dummy request row; before each replay the
runner fills the buffers (padding at the dummy slot), refreshes its backend's metadata outside the graph
(each token's kv length computed there into a static buffer) and replays once. The runner holds a backend
of its own, as SGLang's backends keep the verify's graph metadata apart from the decode graphs'. A verify of
fewer tokens per request (a request drafting up to its end) or of a batch no bucket holds runs eagerly.

Built only where the run verifies (``timeline.accept_lens``) and the backend's graphs cover the shape; the
dispatcher (``dispatch.py``) asks the same of the backend before it hands a verify to these graphs.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from ..backends.base import AttentionBatch, GraphSupport, SpecInfo, attention_batch
from ..graphs.engine import GraphEngine
from ..graphs.registry import get_engine
from ..runspec import CapturePolicy, RunSpec
from ..serving.batch import ForwardBatch, ForwardMode
from ..serving.faults import Component
from ..serving.loc_plan import KVLocPlan
from .base import GraphRunner, Runner, RunnerContext, fill_static, swa_out_cache_loc
from .dispatch import GraphCover


class VerifyGraphRunner(GraphRunner):
    # SGLang's verify graphs are its decode graph runner's (captured with num_tokens_per_bs = 1 + steps): of that
    # runner's fault switches this one has the padded tail of the static SWA locations (``no_zero_swa_pad``)
    component = Component.DECODE_GRAPH_RUNNER

    @classmethod
    def for_run(cls, ctx: RunnerContext, spec: RunSpec, *, eager: Runner) -> VerifyGraphRunner:
        steps = spec.timeline.draft_steps if spec.timeline.verifies else 0
        return cls(ctx, eager=eager, engine=get_engine(spec.engine), buckets=spec.graphs.decode_buckets,
                   tokens_per_request=1 + steps if steps else 0, capture=spec.graphs.capture, faults=spec.faults)

    def __init__(
        self,
        ctx: RunnerContext,
        *,
        eager: Runner,
        engine: GraphEngine,
        buckets: tuple[int, ...],
        tokens_per_request: int,
        forward_mode: ForwardMode = ForwardMode.TARGET_VERIFY,
        capture: CapturePolicy = CapturePolicy.STARTUP,
        faults: Collection[str] = (),
    ) -> None:
        super().__init__(ctx, eager=eager, engine=engine, buckets=buckets, faults=faults)
        # of the decode runner's switches, the one of its static buffers this runner shares the layout of
        self.faults = self.faults & {"no_zero_swa_pad"}
        n = self.per = tokens_per_request
        self.forward_mode = forward_mode
        """``TARGET_VERIFY``, or ``DRAFT_EXTEND`` for the draft-extend graphs of one length (``draft_extend_graph.py``)"""
        # a run that does not verify, or a backend whose graphs cannot take extend-shaped batches of n tokens per
        # request (a decode-only one, even at one token: its graph path builds decode metadata), has nothing for
        # these graphs: they declare nothing and capture nothing
        least = 2 if forward_mode is ForwardMode.TARGET_VERIFY else 1
        if n < least or self.backend.graph_support < GraphSupport.UNIFORM_BATCH:
            self.covers: tuple[GraphCover, ...] = ()
            return
        self.covers = (GraphCover(forward_mode=forward_mode, tokens_per_request=n, buckets=self.buckets),)
        self.backend = self.backend.for_draft_step()  # its own metadata and graph state
        max_bs, dev = self.buckets[-1], self.pool.device
        tokens = max_bs * n
        self.input_ids = torch.zeros(tokens, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(tokens, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.zeros(tokens, dtype=torch.int64, device=dev)
        self.out_cache_loc_swa = torch.zeros(tokens, dtype=torch.int32, device=dev)
        self.plan_swa_ids = torch.zeros(tokens, dtype=torch.int32, device=dev)
        self.req_pool_indices = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.seq_lens = torch.full((max_bs,), n, dtype=torch.int64, device=dev)
        self.extend_seq_lens = torch.full((max_bs,), n, dtype=torch.int64, device=dev)
        self.backend.init_cuda_graph_state(max_bs)
        if CapturePolicy(capture) is CapturePolicy.STARTUP:
            for bs in reversed(self.buckets):
                self._capture(bs)

    def static_buffers(self) -> list[torch.Tensor]:
        return [self.input_ids, self.positions, self.out_cache_loc, self.out_cache_loc_swa, self.plan_swa_ids,
                self.req_pool_indices, self.seq_lens, self.extend_seq_lens]

    def _static_batch(self, bs: int) -> ForwardBatch:
        t = bs * self.per
        return ForwardBatch(
            forward_mode=self.forward_mode,
            batch_size=bs,
            input_ids=self.input_ids[:t],
            positions=self.positions[:t],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            extend_prefix_lens=self.seq_lens[:bs] - self.per,
            extend_seq_lens=self.extend_seq_lens[:bs],
            extend_seq_lens_cpu=(self.per,) * bs,
            out_cache_loc=self.out_cache_loc[:t],
            out_cache_loc_swa=self.out_cache_loc_swa[:t],
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.pool,
            kv_loc_plan=KVLocPlan.over_static(full_ids=self.out_cache_loc[:t], swa_ids=self.plan_swa_ids[:t]),
            kv_loc_cols=(0, t),
        )

    def _attention_batch(self, bucket: int, num_real: int) -> AttentionBatch:
        verify = self.forward_mode is ForwardMode.TARGET_VERIFY
        return attention_batch(
            forward_mode=self.forward_mode,
            num_real=num_real,
            req_pool_indices=self.req_pool_indices[:bucket],
            seq_lens=self.seq_lens[:bucket],
            out_cache_loc=self.out_cache_loc[: bucket * self.per],
            page_size=self.pool.page_size,
            extend_seq_lens=self.extend_seq_lens[:bucket],
            extend_seq_lens_cpu=(self.per,) * bucket,
            # what an eager forward's batch carries (``spec_info_of``): a draft-extend's length is its extend's
            spec_info=SpecInfo(draft_steps=self.per - 1, tokens_per_request=self.per) if verify else None,
        )

    def _capture(self, bs: int) -> None:
        # the capture batch: every request padding (dummy row 0, dummy slot 0, n keys each)
        for buffer in (self.input_ids, self.positions, self.out_cache_loc, self.out_cache_loc_swa, self.plan_swa_ids,
                       self.req_pool_indices):
            buffer.zero_()
        self.seq_lens.fill_(self.per)
        batch = self._static_batch(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(self._attention_batch(bs, bs))
        self.pool.set_swa_loc(batch.out_cache_loc_swa)  # SGLang PR 23552's preset, as the decode runner does
        model, backend, pool = self.model, self.backend, self.pool

        def forward() -> torch.Tensor:
            pool.invalidate_translate_cache()  # what the model runner does per forward, frozen at capture
            return model.forward(
                batch.input_ids, batch.positions, lambda layer_id, q, k, v: backend.forward(q, k, v, layer_id, batch))

        self._capture_whole(bs, forward)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Hidden states of the forward's tokens, request-major ([batch_size * n, hidden])."""
        bs = batch.batch_size
        if batch.forward_mode is not self.forward_mode or set(batch.extend_seq_lens_cpu) != {self.per}:
            return self._run_eagerly(batch, batch.num_tokens, fallback=False)
        bucket = self.bucket_for(bs)
        if bucket is None:
            return self._run_eagerly(batch, bs, fallback=True)
        captured = bucket not in self.graphs
        if captured:
            self._capture(bucket)
        self._fill(batch, bucket)
        self.pool.invalidate_translate_cache()
        self.backend.init_forward_metadata_replay_cuda_graph(self._attention_batch(bucket, bs))
        self.log.replayed(self.graphs[bucket], self.graphs[bucket].replay(), bucket=bucket, rows=bs,
                          captured=captured)
        return self.outputs[bucket][: bs * self.per].clone()

    def _fill(self, batch: ForwardBatch, bucket: int) -> None:
        t = bucket * self.per
        fill_static(self.input_ids, batch.input_ids, t, 0)
        fill_static(self.positions, batch.positions, t, 0)
        fill_static(self.out_cache_loc, batch.out_cache_loc, t, 0)
        swa = swa_out_cache_loc(batch, self.pool)
        if "no_zero_swa_pad" in self.faults:
            self.out_cache_loc_swa[: swa.shape[0]].copy_(swa)  # SGLang PR 24743: the padded tail keeps old slots
        else:
            fill_static(self.out_cache_loc_swa, swa, t, 0)
        fill_static(self.req_pool_indices, batch.req_pool_indices, bucket, 0)
        fill_static(self.seq_lens, batch.seq_lens, bucket, self.per)
        if batch.kv_loc_plan is not None:
            start, stop = batch.kv_loc_cols
            # padded lanes at the sink, as SGLang's graph path fills its plan buffer (PR 37550)
            fill_static(self.plan_swa_ids, batch.kv_loc_plan.write_ids("swa")[start:stop], t, 0)

"""The draft graph runner, shaped like SGLang's EAGLE draft CUDA-graph runner: the whole multi-step draft loop
captured as one graph per batch-size bucket.

SGLang's EAGLE worker allocates every draft step's slots at once, ``bs * topk * steps`` of them, each
request's run contiguous (``assign_draft_cache_locs``). Inside the graph ``draft_forward`` reshapes them to
one row per step and, at each step, points ``out_cache_loc`` at that step's row view, advances
``positions`` in place and runs the step's forward with the step's own attention backend (its multi-step
draft backend holds one per step, each with its own metadata). Static buffers of the bucket-2 graph of a
3-step draft (top-k 1; requests r0 r1, padding row p)::

    out_cache_loc (flat, as allocated)   [ r0s0 r0s1 r0s2 | r1s0 r1s1 r1s2 | 0 0 0 ]
    in the graph: view(bs, 1, steps).permute(2, 0, 1).reshape(steps, bs * topk), a copy
        step 0's out_cache_loc            [ r0s0 r1s0 0 ]    <- a row view of that copy
        step 1's out_cache_loc            [ r0s1 r1s1 0 ]
        step 2's out_cache_loc            [ r0s2 r1s2 0 ]
    out_cache_loc_swa                    the flat SWA translation, read through the same permute
    positions                            [ p0 p1 0 ], += 1 in place before steps 1 and 2
    seq_lens[step]                       [ n0+step n1+step pad ]  one row per step's backend metadata

A tree draft (``timeline.draft_topk`` > 1) has ``bs * topk`` rows per step, request-major and branch-minor: the
graphs stay bucketed by requests and hold ``bucket * topk`` rows, and each step's backend is refreshed with the
batch's ``DraftTree`` (``serving/draft_tree.py``), so each row reads its request's tokens and then its own
branch's slots.

Before each replay the runner fills the buffers from the batch (padding at the dummy slot), refreshes every
step's backend metadata outside the graph and replays once; the graph writes every step's K/V. In a run with
a draft-extend (``timeline.draft_extend``) the draft's first token is the draft-extend's, so the graph runs
``steps - 1`` forwards over rows 0 .. steps - 2 and the last row is allocated but never written, as SGLang's
``draft_forward`` breaks before the last step's forward. A batch no bucket holds, or of fewer steps than the graphs were captured for (a request drafting up to its end), is
stepped by the speculative worker instead.

Faults that act here (the speculative worker's): ``stale_swa_after_reassign`` (each step keeps the whole
draft's SWA locations, ``speculative.py`` says what follows), ``draft_metadata_captured_once`` (every step reads step 0's attention metadata),
``skip_memo_invalidate_in_draft_graph`` (the memo invalidated once for the whole loop, not before each step),
``skip_memo_invalidate_before_step_metadata`` (once before the steps' metadata refresh, not before each step's).
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from ..backends.base import AttentionBackend, AttentionBatch, SpecInfo, attention_batch
from ..graphs.engine import GraphEngine
from ..graphs.registry import get_engine
from ..runspec import CapturePolicy, RunSpec
from ..serving.batch import ForwardBatch, ForwardMode
from ..serving.draft_tree import DraftTree, request_order
from ..serving.faults import Component
from ..serving.loc_plan import KVLocPlan
from .base import GraphRunner, Runner, RunnerContext, fill_static
from .dispatch import GraphCover

class DraftGraphRunner(GraphRunner):
    component = Component.SPECULATIVE_WORKER

    @classmethod
    def for_run(cls, ctx: RunnerContext, spec: RunSpec, *, eager: Runner) -> DraftGraphRunner:
        return cls(ctx, eager=eager, engine=get_engine(spec.engine), buckets=spec.graphs.decode_buckets,
                   steps=spec.timeline.draft_steps, topk=spec.timeline.draft_topk,
                   from_extend=spec.timeline.draft_extend, capture=spec.graphs.capture, faults=spec.faults)

    def __init__(
        self,
        ctx: RunnerContext,
        *,
        eager: Runner,
        engine: GraphEngine,
        buckets: tuple[int, ...],
        steps: int,
        topk: int = 1,
        from_extend: bool = False,
        capture: CapturePolicy = CapturePolicy.STARTUP,
        faults: Collection[str] = (),
    ) -> None:
        super().__init__(ctx, eager=eager, engine=engine, buckets=buckets, faults=faults)
        self.steps = steps
        self.topk = topk
        """draft rows per request per step (SGLang's ``speculative_eagle_topk``): a tree's branches"""
        self.from_extend = from_extend
        self.runs = steps - 1 if from_extend else steps
        """forwards inside the graph: one fewer than the steps when a draft-extend gave the first token"""
        # a run that does not speculate declares nothing and builds nothing
        self.covers = (GraphCover(forward_mode=ForwardMode.DRAFT, tokens_per_request=steps, buckets=self.buckets),
                       ) if self.runs > 0 else ()
        if self.runs <= 0:
            self.backends: list[AttentionBackend] = []
            return
        max_bs, dev = self.buckets[-1], self.pool.device
        rows = max_bs * topk
        self.out_cache_loc = torch.zeros(rows * steps, dtype=torch.int64, device=dev)
        """every step's slots, request-major as allocated"""
        self.out_cache_loc_swa = torch.zeros(rows * steps, dtype=torch.int32, device=dev)
        self.input_ids = torch.zeros((steps, rows), dtype=torch.int64, device=dev)
        """the teacher-forced draft token of each step (SGLang's come from the previous step's top-k)"""
        self.positions = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.req_pool_indices = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones((steps, rows), dtype=torch.int64, device=dev)
        self.step_out_cache_loc = torch.zeros((steps, rows), dtype=torch.int64, device=dev)
        """each step's slots again, for the metadata builders outside the graph"""
        self.plan_swa_ids = torch.zeros(rows * steps, dtype=torch.int32, device=dev)
        """the location plan's SWA ids, step-major with a stride of the bucket"""
        # SGLang's multi-step draft backend: one backend, and so one metadata, per step
        self.backends = [self.backend.for_draft_step() for _ in range(steps)]
        self.backend.init_draft_cuda_graph_state(self.backends, rows)
        if CapturePolicy(capture) is CapturePolicy.STARTUP:
            for bs in reversed(self.buckets):
                self._capture(bs)

    def static_buffers(self) -> list[torch.Tensor]:
        return [self.out_cache_loc, self.out_cache_loc_swa, self.input_ids, self.positions, self.req_pool_indices,
                self.seq_lens, self.step_out_cache_loc, self.plan_swa_ids]

    def _attention_batch(self, step: int, bucket: int, num_real: int, tree: DraftTree | None = None
                         ) -> AttentionBatch:
        """Step ``step``'s metadata batch over ``bucket`` rows (requests times branches), ``num_real`` real."""
        return attention_batch(
            forward_mode=ForwardMode.DRAFT,
            num_real=num_real,
            req_pool_indices=self.req_pool_indices[:bucket],
            seq_lens=self.seq_lens[step, :bucket],
            out_cache_loc=self.step_out_cache_loc[step, :bucket],
            page_size=self.pool.page_size,
            spec_info=SpecInfo(draft_steps=self.steps),
            tree=tree,
        )

    def _step_batch(self, step: int, bs: int, locs: torch.Tensor, swa: torch.Tensor) -> ForwardBatch:
        """Draft step ``step``'s forward inside the graph: its rows of the step-major copies (``bs`` rows:
        requests times branches)."""
        return ForwardBatch(
            forward_mode=ForwardMode.DRAFT,
            batch_size=bs,
            input_ids=self.input_ids[step, :bs],
            positions=self.positions[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[step, :bs],
            extend_prefix_lens=self.seq_lens[step, :bs] - 1,
            extend_seq_lens=torch.ones(bs, dtype=torch.int64, device=self.pool.device),
            extend_seq_lens_cpu=(1,) * bs,
            out_cache_loc=locs[step],
            # the fault: draft_forward rebinds out_cache_loc only, and the whole draft's SWA locations stay
            out_cache_loc_swa=(self.out_cache_loc_swa[: self.steps * bs]
                               if "stale_swa_after_reassign" in self.faults else swa[step]),
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.pool,
            kv_loc_plan=KVLocPlan.over_static(full_ids=locs.reshape(-1), swa_ids=self.plan_swa_ids[: self.steps * bs]),
            kv_loc_cols=(step * bs, (step + 1) * bs),
            draft_step=step,
        )

    def _capture(self, bucket: int) -> None:
        steps, topk = self.steps, self.topk
        bs = bucket * topk  # the rows of every step
        for buffer in (self.out_cache_loc, self.out_cache_loc_swa, self.input_ids, self.positions,
                       self.req_pool_indices, self.step_out_cache_loc, self.plan_swa_ids):
            buffer.zero_()
        self.seq_lens.fill_(self.backend.pad_seq_len)
        for step, backend in enumerate(self.backends):
            self._invalidate_before_metadata(step)
            backend.init_forward_metadata_capture_cuda_graph(self._attention_batch(step, bs, bs))
        model, pool, backends = self.model, self.pool, self.backends
        once = "draft_metadata_captured_once" in self.faults
        invalidate = "skip_memo_invalidate_in_draft_graph" not in self.faults

        def draft_forward() -> torch.Tensor:
            # SGLang's draft_forward: the flat allocation read as one row per step (a copy: permuted)
            locs = self.out_cache_loc[: bs * steps].view(bucket, topk, steps).permute(2, 0, 1).reshape(steps, -1)
            swa = self.out_cache_loc_swa[: bs * steps].view(bucket, topk, steps).permute(2, 0, 1).reshape(steps, -1)
            outs = []
            for step in range(self.runs):
                batch = self._step_batch(step, bs, locs, swa)
                if step > 0:
                    batch.positions.add_(1)  # in place, as draft_forward advances them
                # each step is a model-runner forward: the memo and pool.swa_loc as the decode runner leaves them
                if invalidate or step == 0:
                    pool.invalidate_translate_cache()
                pool.set_swa_loc(batch.out_cache_loc_swa)
                # SGLang's multi-step draft backend gives each step its own; the fault keeps step 0's throughout
                backend = backends[0 if once else step]
                outs.append(model.forward(batch.input_ids, batch.positions,
                                          lambda layer_id, q, k, v, b=batch, be=backend: be.forward(q, k, v, layer_id, b)))
            return torch.stack(outs)

        self._capture_whole(bucket, draft_forward, backends=self.backends)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Hidden states of every draft forward, step-major ([forwards * batch_size, hidden])."""
        if (batch.forward_mode is not ForwardMode.DRAFT or batch.draft_steps != self.steps
                or batch.draft_forwards != self.runs):
            raise ValueError(f"the draft graph runner takes whole {self.steps}-step drafts, got a batch of mode "
                             f"{batch.forward_mode.value} with {batch.draft_steps} draft steps ({batch.draft_forwards} "
                             f"forwards; its graphs run {self.runs})")
        if batch.draft_topk != self.topk:
            raise ValueError(f"the draft graph runner takes drafts of {self.topk} branches, got {batch.draft_topk}")
        reqs, rows = batch.num_requests, batch.batch_size
        bucket = self.bucket_for(reqs)
        if bucket is None:
            raise ValueError(f"no draft graph holds a batch of {reqs} (buckets {self.buckets})")
        captured = bucket not in self.graphs
        if captured:
            self._capture(bucket)
        self._fill(batch, bucket)
        tree = batch.draft_tree.padded(bucket * self.topk) if batch.draft_tree is not None else None
        for step, backend in enumerate(self.backends):
            self._invalidate_before_metadata(step)
            backend.init_forward_metadata_replay_cuda_graph(self._attention_batch(step, bucket * self.topk, rows, tree))
        self.log.replayed(self.graphs[bucket], self.graphs[bucket].replay(), bucket=bucket, rows=reqs,
                          captured=captured)
        return self.outputs[bucket][:, :rows].reshape(self.runs * rows, -1).clone()

    def _invalidate_before_metadata(self, step: int) -> None:
        """SGLang PR 26184: invalidate the memo before every step backend's metadata init. The steps' page tables
        are rows of one buffer of one length (``init_draft_cuda_graph_state``), so a memo kept across the loop
        (``skip_memo_invalidate_before_step_metadata``) serves every later step step 0's SWA page table."""
        if step == 0 or "skip_memo_invalidate_before_step_metadata" not in self.faults:
            self.pool.invalidate_translate_cache()

    def _fill(self, batch: ForwardBatch, bucket: int) -> None:
        assert batch.draft_out_cache_loc is not None and batch.draft_input_ids is not None
        steps, bs = self.steps, batch.batch_size  # rows: requests times branches
        bucket *= self.topk
        by_step = batch.draft_out_cache_loc  # [steps, bs]
        flat = request_order(by_step, topk=self.topk)  # request-major, as the worker allocated them
        fill_static(self.out_cache_loc, flat, bucket * steps, 0)
        swa = self.pool.translate_loc_from_full_to_swa(flat)
        fill_static(self.out_cache_loc_swa, swa, bucket * steps, 0)
        fill_static(self.positions, batch.positions, bucket, 0)
        fill_static(self.req_pool_indices, batch.req_pool_indices, bucket, 0)
        plan = batch.kv_loc_plan.write_ids("swa") if batch.kv_loc_plan is not None else None
        for step in range(steps):
            fill_static(self.input_ids[step], batch.draft_input_ids[step], bucket, 0)
            fill_static(self.seq_lens[step], batch.seq_lens + step, bucket, self.backend.pad_seq_len)
            fill_static(self.step_out_cache_loc[step], by_step[step], bucket, 0)
            if plan is not None:
                # padded lanes at the sink, as SGLang's graph path fills its plan buffer (PR 37550)
                fill_static(self.plan_swa_ids[step * bucket : (step + 1) * bucket], plan[step * bs : (step + 1) * bs],
                            bucket, 0)

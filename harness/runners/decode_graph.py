"""The decode CUDA-graph runner, shaped like SGLang's: full capture per batch-size bucket.

Static buffers (max bucket rows)::

    input_ids  positions  req_pool_indices  seq_lens  out_cache_loc  out_cache_loc_swa
    [real rows ..................][padding rows: 0     0        1         0              0 ]

A batch of 3 replays the bucket-4 graph: padding is filled, the real rows copied in, the backend's
static metadata refreshed outside the graph, then the graph replays. Python does not run during replay,
so this path never performs the eager step's ``pool.swa_loc`` update (SGLang's did not either).

The behaviours real bugs came from are switches (``faults``), correct by default:
``no_zero_swa_pad`` (SGLang PR 24743), ``no_preset_swa_loc`` (before PR 23552), ``pad_seq_len_zero``
(vLLM PR 38436), ``pad_slot_minus_one`` (vLLM issue 43810), ``skip_memo_invalidate_at_capture`` (PR 25824's
in-capture invalidation) and ``skip_memo_invalidate_on_replay`` (before PR 26152: replays skipped the
per-forward invalidation).
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from ..backends.base import AttentionBatch, attention_batch, spec_info_of
from ..graphs.engine import GraphEngine
from ..graphs.registry import get_engine
from ..runspec import CapturePolicy, RunSpec
from ..serving.batch import ForwardBatch, ForwardMode
from ..serving.loc_plan import KVLocPlan
from ..serving.faults import Component
from .base import GraphRunner, Runner, RunnerContext, fill_static, swa_out_cache_loc
from .dispatch import GraphCover


class DecodeGraphRunner(GraphRunner):
    component = Component.DECODE_GRAPH_RUNNER

    @classmethod
    def for_run(cls, ctx: RunnerContext, spec: RunSpec, *, eager: Runner) -> DecodeGraphRunner:
        return cls(ctx, eager=eager, engine=get_engine(spec.engine), buckets=spec.graphs.decode_buckets,
                   capture=spec.graphs.capture, faults=spec.faults)

    def __init__(
        self,
        ctx: RunnerContext,
        *,
        eager: Runner,
        engine: GraphEngine,
        buckets: tuple[int, ...],
        capture: CapturePolicy = CapturePolicy.STARTUP,
        faults: Collection[str] = (),
    ) -> None:
        super().__init__(ctx, eager=eager, engine=engine, buckets=buckets, faults=faults)
        self.covers = (GraphCover(forward_mode=ForwardMode.DECODE, tokens_per_request=1, buckets=self.buckets),)
        max_bs = self.buckets[-1]
        dev = self.pool.device
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.req_pool_indices = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(max_bs, dtype=torch.int64, device=dev)
        self.out_cache_loc = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.out_cache_loc_swa = torch.zeros(max_bs, dtype=torch.int32, device=dev)
        # the location plan's SWA ids, copied in before every replay (a batch without a plan leaves it alone)
        self.plan_swa_ids = torch.zeros(max_bs, dtype=torch.int32, device=dev)
        self.backend.init_cuda_graph_state(max_bs)
        if CapturePolicy(capture) is CapturePolicy.STARTUP:
            # largest first, as serving engines do, so smaller graphs reuse the big one's pool memory
            for bs in reversed(self.buckets):
                self._capture(bs)

    def static_buffers(self) -> list[torch.Tensor]:
        return [self.input_ids, self.positions, self.req_pool_indices, self.seq_lens, self.out_cache_loc,
                self.out_cache_loc_swa, self.plan_swa_ids]

    def _static_batch(self, bs: int, forward_mode: ForwardMode) -> ForwardBatch:
        return ForwardBatch(
            forward_mode=forward_mode,
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            extend_prefix_lens=self.seq_lens[:bs] - 1,
            extend_seq_lens=torch.ones(bs, dtype=torch.int64, device=self.pool.device),
            extend_seq_lens_cpu=(1,) * bs,
            out_cache_loc=self.out_cache_loc[:bs],
            out_cache_loc_swa=self.out_cache_loc_swa[:bs],
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.pool,
            kv_loc_plan=KVLocPlan.over_static(full_ids=self.out_cache_loc[:bs], swa_ids=self.plan_swa_ids[:bs]),
            kv_loc_cols=(0, bs),
        )

    def _attention_batch(self, bucket: int, batch: ForwardBatch) -> AttentionBatch:
        """What the backend's builder reads of ``batch`` in the ``bucket`` graph: the static buffers' rows,
        padding included, the batch's own rows at their head."""
        return attention_batch(
            forward_mode=batch.forward_mode,
            num_real=batch.batch_size,
            req_pool_indices=self.req_pool_indices[:bucket],
            seq_lens=self.seq_lens[:bucket],
            out_cache_loc=self.out_cache_loc[:bucket],
            page_size=self.pool.page_size,
            spec_info=spec_info_of(batch),
            # a stepped tree draft's step: each row's branch, padding rows reading their own columns
            tree=batch.draft_tree.padded(bucket) if batch.draft_tree is not None else None,
        )

    def _capture(self, bs: int) -> None:
        # the capture batch: every row is padding (dummy request row 0, dummy slot 0, the backend's pad seq_len)
        self.input_ids[:bs].zero_()
        self.positions[:bs].zero_()
        self.req_pool_indices[:bs].zero_()
        self.seq_lens[:bs].fill_(self.backend.pad_seq_len)
        self.out_cache_loc[:bs].zero_()
        self.out_cache_loc_swa[:bs].zero_()
        self.plan_swa_ids[:bs].zero_()
        batch = self._static_batch(bs, ForwardMode.DECODE)
        # SGLang PR 26184: before every metadata init, whose read-path translation would otherwise meet the key a
        # previous capture left
        self.pool.invalidate_translate_cache()
        self.backend.init_forward_metadata_capture_cuda_graph(self._attention_batch(bs, batch))
        if "no_preset_swa_loc" not in self.faults:
            # SGLang PR 23552: point the attribute at the static buffer so the graph reads what replay fills
            self.pool.set_swa_loc(batch.out_cache_loc_swa)
        model, backend, pool = self.model, self.backend, self.pool
        invalidate = "skip_memo_invalidate_at_capture" not in self.faults

        def forward() -> torch.Tensor:
            if invalidate:
                # SGLang PR 25824's runner: a memo left by a warm-up run (keyed on the static buffer's
                # address, which capture reuses) would be frozen into the graph as a constant translation
                pool.invalidate_translate_cache()
            return model.forward(
                batch.input_ids, batch.positions, lambda layer_id, q, k, v: backend.forward(q, k, v, layer_id, batch)
            )

        self._capture_whole(bs, forward)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        bs = batch.batch_size
        if not batch.forward_mode.is_decode_like:
            return self._run_eagerly(batch, batch.num_tokens, fallback=False)
        bucket = self.bucket_for(bs)
        if bucket is None:
            return self._run_eagerly(batch, bs, fallback=True)  # no bucket fits: a real engine runs it eagerly
        captured = bucket not in self.graphs
        if captured:
            self._capture(bucket)
        self._fill(batch, bucket)
        if "skip_memo_invalidate_on_replay" not in self.faults:
            # SGLang PR 26152: the model runner's per-forward invalidation, moved before its graph early return
            # so that replays run it too; the backend's refresh then translates its static page table afresh
            self.pool.invalidate_translate_cache()
        self.backend.init_forward_metadata_replay_cuda_graph(self._attention_batch(bucket, batch))
        return self._replay(bucket, bs, captured=captured)

    def _fill(self, batch: ForwardBatch, bucket: int) -> None:
        pad_seq_len = 0 if "pad_seq_len_zero" in self.faults else self.backend.pad_seq_len
        pad_slot = -1 if "pad_slot_minus_one" in self.faults else 0
        fill_static(self.input_ids, batch.input_ids, bucket, 0)
        fill_static(self.positions, batch.positions, bucket, 0)
        fill_static(self.req_pool_indices, batch.req_pool_indices, bucket, 0)
        fill_static(self.seq_lens, batch.seq_lens, bucket, pad_seq_len)
        fill_static(self.out_cache_loc, batch.out_cache_loc, bucket, pad_slot)
        swa = swa_out_cache_loc(batch, self.pool)
        if "rebind_static_swa_loc" in self.faults:
            # a runner that builds a new static buffer for every replay: the graph still reads the one it
            # captured, which nothing refreshes any more (the input audit names it)
            self.out_cache_loc_swa = torch.zeros_like(self.out_cache_loc_swa)
        if "no_zero_swa_pad" in self.faults:
            self.out_cache_loc_swa[: swa.shape[0]].copy_(swa)  # SGLang PR 24743: the padded tail keeps old slots
        else:
            fill_static(self.out_cache_loc_swa, swa, bucket, pad_slot)
        if batch.kv_loc_plan is not None:
            start, stop = batch.kv_loc_cols
            # padded lanes at the sink, as SGLang's graph path fills its plan buffer (PR 37550)
            fill_static(self.plan_swa_ids, batch.kv_loc_plan.write_ids("swa")[start:stop], bucket, 0)

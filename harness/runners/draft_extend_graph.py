"""The draft-extend graph runner: full graphs of the draft-extend after a verify, one set per length, for a
backend whose graphs capture uniform batches.

After a verify the draft-extend covers each request's last token and its accepted drafts: ``n = 1 +
accepted`` tokens per request, the same for every request of an iteration (the timeline's acceptance rule),
so each ``n`` the timeline can produce has graphs of its own, one per batch-size bucket, built like the
verify's (``verify_graph.py``: its static buffers, padding at the dummy slot and row, its own backend per
length). SGLang's draft-extend graph runner captures one shape instead, ``1 + steps`` tokens per request:
its v1 worker pads each request's accepted tokens up to it, and 0.5.23's v2 worker extends over the whole
verify window (``DRAFT_EXTEND_V2``, ``num_tokens_per_req = num_draft_tokens``) and picks each request's row
by its acceptance; the harness's draft-extend covers the kept tokens alone (``batch_builder.DraftExtend``),
so it keeps one graph per length. With ``timeline.draft_extend = "v2"`` the draft-extend after a verify is
the verify's window, ``1 + steps`` tokens per request whatever was accepted: one length, as SGLang captures
it (a request drafting up to its end verifies fewer and runs eagerly). The draft-extend after a prefill
mixes lengths and runs eagerly, as SGLang runs it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..graphs.registry import get_engine
from ..runspec import CapturePolicy, RunSpec
from ..serving.batch import ForwardBatch, ForwardMode
from ..serving.faults import Component
from .base import GraphLog, Runner, RunnerContext
from .dispatch import GraphCover
from .observations import ForwardRecord, GraphObservations
from .verify_graph import VerifyGraphRunner


class DraftExtendGraphRunner:
    component = Component.SPECULATIVE_WORKER

    @classmethod
    def for_run(cls, ctx: RunnerContext, spec: RunSpec, *, eager: Runner) -> DraftExtendGraphRunner:
        timeline = spec.timeline
        if timeline.draft_extend_v2:
            lengths = [1 + timeline.draft_steps]  # the verify's window, whatever the verify accepted
        elif timeline.draft_extend:
            lengths = sorted({1 + timeline.accepted(i, timeline.draft_steps) for i in range(len(timeline.accept_lens))})
        else:
            lengths = []
        return cls(ctx, eager=eager, spec=spec, lengths=lengths)

    def __init__(self, ctx: RunnerContext, *, eager: Runner, spec: RunSpec, lengths: Sequence[int]) -> None:
        self.log = GraphLog()
        self.by_length: dict[int, VerifyGraphRunner] = {}
        for n in lengths:
            runner = VerifyGraphRunner(ctx, eager=eager, engine=get_engine(spec.engine),
                                       buckets=spec.graphs.decode_buckets, tokens_per_request=n,
                                       forward_mode=ForwardMode.DRAFT_EXTEND, capture=CapturePolicy.ON_DEMAND)
            if runner.covers:
                runner.log = self.log  # one log for every length's graphs: the dispatcher reads this runner's
                self.by_length[n] = runner
        self.covers: tuple[GraphCover, ...] = tuple(c for r in self.by_length.values() for c in r.covers)
        if CapturePolicy(spec.graphs.capture) is CapturePolicy.STARTUP:
            for runner in self.by_length.values():
                for bs in reversed(runner.buckets):
                    runner._capture(bs)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Hidden states of a draft-extend of one of the captured lengths, on that length's graphs."""
        lengths = set(batch.extend_seq_lens_cpu)
        runner = self.by_length.get(lengths.pop()) if len(lengths) == 1 else None
        if batch.forward_mode is not ForwardMode.DRAFT_EXTEND or runner is None:
            raise ValueError(f"the draft-extend graph runner takes draft-extends of {sorted(self.by_length)} tokens "
                             f"per request, got a {batch.forward_mode.value} batch of lengths "
                             f"{list(batch.extend_seq_lens_cpu)}")
        return runner.forward(batch)

    def forward_log(self) -> Sequence[ForwardRecord]:
        return self.log.forwards

    def observations(self) -> GraphObservations:
        return self.log.observations()

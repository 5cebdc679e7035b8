"""The eager model-runner step, as SGLang runs a batch that no graph covers."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..runspec import RunSpec
from ..serving.batch import ForwardBatch
from .base import Runner, RunnerContext
from .observations import ForwardPath, ForwardRecord, GraphObservations


class EagerRunner:
    @classmethod
    def for_run(cls, ctx: RunnerContext, spec: RunSpec, *, eager: Runner | None = None) -> EagerRunner:
        return cls(ctx)

    def __init__(self, ctx: RunnerContext) -> None:
        self.model = ctx.model
        self.backend = ctx.backend
        self.pool = ctx.pool
        self._log: list[ForwardRecord] = []

    def forward_log(self) -> Sequence[ForwardRecord]:
        return self._log

    def observations(self) -> GraphObservations | None:
        return None

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Hidden states [num_tokens, hidden] of one eager forward."""
        self.pool.invalidate_translate_cache()
        # SGLang's eager step: set whenever the batch carries SWA locations, never cleared. This is the
        # state the stale_state design reads, and what a later batch may fail to refresh.
        if batch.out_cache_loc_swa is not None:
            self.pool.set_swa_loc(batch.out_cache_loc_swa)
        self.backend.init_forward_metadata(batch)
        hidden = self.model.forward(
            batch.input_ids,
            batch.positions,
            lambda layer_id, q, k, v: self.backend.forward(q, k, v, layer_id, batch),
        )
        self._log.append(ForwardRecord(path=ForwardPath.EAGER, rows=int(hidden.shape[0])))
        return hidden

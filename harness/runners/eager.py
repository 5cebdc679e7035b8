"""The eager model-runner step, as SGLang runs a batch that no graph covers."""

from __future__ import annotations

import torch

from ..serving.batch import ForwardBatch
from .base import RunnerContext


class EagerRunner:
    def __init__(self, ctx: RunnerContext) -> None:
        self.model = ctx.model
        self.backend = ctx.backend
        self.pool = ctx.pool

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Hidden states [num_tokens, hidden] of one eager forward."""
        self.pool.invalidate_translate_cache()
        # SGLang's eager step: set whenever the batch carries SWA locations, never cleared. This is the
        # state the stale_state design reads, and what a later batch may fail to refresh.
        if batch.out_cache_loc_swa is not None:
            self.pool.set_swa_loc(batch.out_cache_loc_swa)
        self.backend.init_forward_metadata(batch)
        return self.model.forward(
            batch.input_ids,
            batch.positions,
            lambda layer_id, q, k, v: self.backend.forward(q, k, v, layer_id, batch),
        )

"""Runners: how one ``ForwardBatch`` reaches the model (eagerly, or through captured graphs)."""

from __future__ import annotations

from typing import Protocol

import torch

from ..serving.batch import ForwardBatch, ForwardMode
from .eager import EagerRunner


class Runner(Protocol):
    mode: str

    def forward(self, batch: ForwardBatch) -> torch.Tensor: ...


def run_batch(runner: Runner, batch: ForwardBatch) -> list[torch.Tensor]:
    """Hidden states of every forward the batch takes: one, or one per speculative draft step."""
    if batch.forward_mode is not ForwardMode.DRAFT:
        return [runner.forward(batch)]
    outs = []
    for step in range(batch.draft_steps):
        batch.enter_draft_step(step)
        outs.append(runner.forward(batch))
    return outs


__all__ = ["EagerRunner", "Runner", "run_batch"]

"""Per-step copies of both KV pools, the live-token map and the step's hidden states."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ..serving.pool import HybridSWAKVPool
from ..serving.timeline import LiveToken, TokenKey


class ScheduledStepLike(Protocol):
    """The parts of the scheduler's ``ScheduledStep`` a snapshot records (no import of the scheduler)."""

    index: int
    forwards: tuple[tuple[TokenKey, ...], ...]

    @property
    def kind(self) -> str: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class KVSnapshot:
    step: int
    kind: str
    """forward mode of the step's batch"""
    live: tuple[LiveToken, ...]
    full_k: torch.Tensor
    """[full layers, full_size, Hkv, D] in the pool's storage dtype"""
    full_v: torch.Tensor
    swa_k: torch.Tensor
    """[SWA layers, swa_size, Hkv, D] in the pool's storage dtype"""
    swa_v: torch.Tensor
    hidden: torch.Tensor
    """[tokens of the step, hidden] final hidden states, every forward of the step concatenated"""
    hidden_owners: tuple[TokenKey, ...]


def _stack(buffers: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    if not buffers:
        return like.new_zeros((0, *like.shape[1:]))
    return torch.stack([b.detach().cpu().clone() for b in buffers])


def take_snapshot(
    pool: HybridSWAKVPool, step: ScheduledStepLike, live: list[LiveToken], hidden: list[torch.Tensor]
) -> KVSnapshot:
    like = (pool.full_k_buffer or pool.swa_k_buffer)[0]
    return KVSnapshot(
        step=step.index,
        kind=step.kind,
        live=tuple(live),
        full_k=_stack(pool.full_k_buffer, like),
        full_v=_stack(pool.full_v_buffer, like),
        swa_k=_stack(pool.swa_k_buffer, like),
        swa_v=_stack(pool.swa_v_buffer, like),
        hidden=torch.cat([h.detach().cpu() for h in hidden]) if hidden else torch.empty(0),
        hidden_owners=tuple(key for forward in step.forwards for key in forward),
    )

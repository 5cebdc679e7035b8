"""Per-step copies of both KV pools, the live-token map and the step's hidden states.

A snapshot holds whole pools, not only live slots: classifying a bad slot needs the rows of every slot
of the layer (a misplaced row can sit in a free or stale slot) and the previous step's contents of the
slot. Each pool buffer is copied exactly once per step, straight into its place in the stacked tensor.

The live map is also kept as tensors (``live_table``, ``live_written``), built once here, so that the
diff selects and checks live slots without a Python loop over tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..serving.timeline import LiveToken, TokenKey


class ScheduledStepLike(Protocol):
    """The parts of the scheduler's ``ScheduledStep`` a snapshot records (no import of the scheduler)."""

    index: int
    forwards: tuple[tuple[TokenKey, ...], ...]

    @property
    def kind(self) -> str: ...

class PoolBuffersLike(Protocol):
    """What a snapshot copies: a serving stack's ``kv_buffers()``, one [slots, Hkv, D] tensor per layer of
    each pool (``serving.stack.PoolBuffers``; no import of the stack)."""

    full_k: Sequence[torch.Tensor]
    full_v: Sequence[torch.Tensor]
    swa_k: Sequence[torch.Tensor]
    swa_v: Sequence[torch.Tensor]


# Columns of ``KVSnapshot.live_table``.
RID, POS, FULL_SLOT, SWA_SLOT, IN_WINDOW = range(5)


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
    live_rids: tuple[str, ...] = field(init=False, repr=False, compare=False)
    """distinct request ids of ``live`` in order of first appearance"""
    live_table: torch.Tensor = field(init=False, repr=False, compare=False)
    """[live, 5] int64 per live token: index into ``live_rids``, pos, full_slot, swa_slot, in_window"""
    live_written: torch.Tensor = field(init=False, repr=False, compare=False)
    """[live] bool: the token is among ``hidden_owners`` (this step wrote its K/V)"""

    def __post_init__(self) -> None:
        rids: dict[str, int] = {}
        rows = [(rids.setdefault(t.rid, len(rids)), t.pos, t.full_slot, t.swa_slot, t.in_window) for t in self.live]
        written = {(key.rid, key.pos) for key in self.hidden_owners}
        object.__setattr__(self, "live_rids", tuple(rids))
        object.__setattr__(self, "live_table", torch.tensor(rows, dtype=torch.int64).reshape(len(rows), 5))
        object.__setattr__(
            self, "live_written", torch.tensor([(t.rid, t.pos) in written for t in self.live], dtype=torch.bool)
        )

    def same_schedule(self, other: KVSnapshot) -> bool:
        """Same step and the same live tokens in the same slots (``live == other.live``, compared as tensors)."""
        return (
            self.step == other.step
            and self.live_rids == other.live_rids
            and torch.equal(self.live_table, other.live_table)
        )


def _stack(buffers: Sequence[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    if not buffers:
        return torch.empty((0, *like.shape[1:]), dtype=like.dtype)
    out = torch.empty((len(buffers), *buffers[0].shape), dtype=buffers[0].dtype)
    for i, buf in enumerate(buffers):
        out[i].copy_(buf.detach())
    return out


def take_snapshot(
    buffers: PoolBuffersLike, step: ScheduledStepLike, live: list[LiveToken], hidden: list[torch.Tensor]
) -> KVSnapshot:
    """Copy both pools (each buffer once) and the step's hidden states to host memory."""
    like = (buffers.full_k or buffers.swa_k)[0]
    return KVSnapshot(
        step=step.index,
        kind=step.kind,
        live=tuple(live),
        full_k=_stack(buffers.full_k, like),
        full_v=_stack(buffers.full_v, like),
        swa_k=_stack(buffers.swa_k, like),
        swa_v=_stack(buffers.swa_v, like),
        hidden=_concat(hidden),
        hidden_owners=tuple(key for forward in step.forwards for key in forward),
    )


def _concat(parts: list[torch.Tensor]) -> torch.Tensor:
    if not parts:
        return torch.empty(0)
    out = torch.empty((sum(p.shape[0] for p in parts), *parts[0].shape[1:]), dtype=parts[0].dtype)
    row = 0
    for p in parts:
        out[row : row + p.shape[0]].copy_(p.detach())
        row += p.shape[0]
    return out

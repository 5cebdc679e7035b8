"""A request timeline and the token bookkeeping types every layer above the scheduler shares.

Plain data only: the scheduler turns a ``TimelineSpec`` into batches, and the checking code names tokens
by ``TokenKey`` (request id and position) without importing the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestSpec:
    rid: str
    arrive: int = 0
    """step at which the request joins the waiting queue"""
    prompt_len: int
    output_len: int = 0
    """tokens decoded after the prompt; the request finishes once they are written"""
    abort: int | None = None
    """step at which the request is aborted (before that step's batch is built)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class TimelineSpec:
    requests: tuple[RequestSpec, ...]
    chunk_size: int | None = None
    """token budget of one extend batch; None prefills whole prompts"""
    draft_steps: int = 0
    """>0: decode runs as speculative drafts of this many forwards per step"""
    seed: int = 0
    max_steps: int = 512


@dataclass(frozen=True, slots=True)
class TokenKey:
    rid: str
    pos: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveToken:
    rid: str
    pos: int
    full_slot: int
    swa_slot: int
    """0 when the token has been evicted from the SWA pool"""
    in_window: bool
    """among the W-1 latest tokens of its request, which its next query reads: its SWA slot must hold its K/V"""


def request_tokens(timeline: TimelineSpec, vocab_size: int) -> dict[str, torch.Tensor]:
    """The teacher-forced token stream (prompt then output) of every request, drawn from the timeline seed."""
    gen = torch.Generator().manual_seed(timeline.seed)
    return {
        r.rid: torch.randint(vocab_size, (r.prompt_len + r.output_len,), generator=gen) for r in timeline.requests
    }

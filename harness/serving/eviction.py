"""SWA eviction policies: which of a running request's tokens have left the window, and when their SWA
slots are freed.

Two questions, asked by different readers, answered in one place:

* ``window_start(seq_len)``: the first position the request's next query reads. This is attention
  semantics (a window of W keys, the query's own included, so positions ``seq_len - W + 1 .. seq_len``),
  the same for every policy; the snapshots compare SWA slots from here on and the report draws the window.
* ``frontier(request)``: how far the SWA slots of the request are freed after a step. A policy frees
  nothing at or past ``window_start``; how much earlier it stops, and how often it frees, is the policy.

A policy of your own is a subclass named by ``package.module:Class`` or registered in
``serving/registry.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar


def window_start(seq_len: int, window: int) -> int:
    """The first position a query at position ``seq_len`` reads with a window of ``window`` keys: the same
    under every policy (readers of recorded runs ask this, not a policy named in a file)."""
    return max(0, seq_len - window + 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestWindow:
    """What an eviction policy sees of one running request after a step's forward."""

    seq_len: int
    """tokens the request holds KV for, the step's new ones included"""
    swa_evicted: int
    """positions below this have already had their SWA slots freed"""
    prefilling: bool
    """prompt tokens remain to be prefilled (chunked prefill)"""
    decoded: int
    """decode steps the request has run"""


class EvictionPolicy(ABC):
    """Decides what leaves the SWA window and when it is freed."""

    name: ClassVar[str]

    def __init__(self, *, window: int, page_size: int = 1) -> None:
        self.window = window
        """keys visible to a query, the query's own key included"""
        self.page_size = page_size

    def window_start(self, seq_len: int) -> int:
        """The first position the next query of a request with ``seq_len`` tokens reads."""
        return window_start(seq_len, self.window)

    @abstractmethod
    def frontier(self, req: RequestWindow) -> int:
        """Free the SWA slots of positions below this (never below ``req.swa_evicted``)."""


class TightEviction(EvictionPolicy):
    """Free exactly what left the window, after every step.

    Stricter than any serving engine (SGLang keeps a page of slack and frees only every so many tokens), so
    a write location that still points at a freed slot, or a window off by one, shows at the first step it
    could matter: the freed slot is poisoned and reused at once.
    """

    name = "tight"

    def frontier(self, req: RequestWindow) -> int:
        return max(req.swa_evicted, self.window_start(req.seq_len))

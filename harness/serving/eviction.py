"""SWA eviction policies: which of a running request's tokens have left the window, and when their SWA
slots are freed.

Two questions, asked by different readers, answered in one place:

* ``window_start(seq_len)``: the first position the request's next query reads. This is attention
  semantics (a window of W keys, the query's own included, so positions ``seq_len - W + 1 .. seq_len``),
  the same for every policy; the snapshots compare SWA slots from here on and the report draws the window.
* ``frontier(request)``: how far the SWA slots of the request are freed after a step. A policy frees
  nothing at or past ``window_start``; how much earlier it stops, and how often it frees, is the policy.

Two policies ship: ``tight`` (the harness default: free exactly what left the window, every step) and
``sglang`` (SGLang's own: slack, page floors and an eviction interval). A policy of your own is a subclass
named by ``package.module:Class`` or registered in ``serving/registry.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar


def window_start(seq_len: int, window: int) -> int:
    """The first position a query at position ``seq_len`` reads with a window of ``window`` keys: the same
    under every policy (readers of recorded runs ask this, not a policy named in a file)."""
    return max(0, seq_len - window + 1)


SGLANG_EVICTION_INTERVAL = 128
"""SGLang's default ``SGLANG_SWA_EVICTION_INTERVAL``: tokens the frontier moves before SWA slots are freed"""


@dataclass(frozen=True, slots=True, kw_only=True)
class EvictionSpec:
    """Which eviction policy a run uses, and its knobs."""

    policy: str = "tight"
    """a registered policy name or ``package.module:Class``"""
    interval: int = SGLANG_EVICTION_INTERVAL
    """for policies that batch their frees (``sglang``): free only once the frontier has moved this many
    tokens past what was already freed; ``tight`` frees every step whatever this says"""
    prefix_cache: bool = False
    """finished requests (and chunked prefills between chunks) are kept by an SWA-aware prefix cache
    (``prefix_cache.py``) instead of freed, and later prompts that share a prefix reuse their KV: the
    policy runs with prefix sharing"""

    def problems(self) -> list[str]:
        out = []
        if not self.policy or not self.policy.isprintable():
            out.append(f"policy: expected a policy name, got {self.policy!r}")
        if not 1 <= self.interval <= 1 << 20:
            out.append(f"interval: expected an integer from 1 to {1 << 20}, got {self.interval}")
        return out


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
    key_len: int | None = None
    """entries of the radix key a prefix cache inserts for the request, when that is not ``seq_len``: with
    EAGLE's bigram keys (one entry per pair of adjacent tokens) one fewer than its tokens"""

    @property
    def insert_len(self) -> int:
        """How far an insert of the request reaches (before its floor to a page): its key's length."""
        return self.seq_len if self.key_len is None else self.key_len


class EvictionPolicy(ABC):
    """Decides what leaves the SWA window and when it is freed."""

    name: ClassVar[str]
    frees_every_step: ClassVar[bool] = False
    """the policy frees what left the window after every step (``tight``); False: it may batch its frees, up to
    the scenario's eviction ``interval`` tokens at a time (``sglang``). The ``retained`` invariant holds every
    policy to the bound this declares (``retention_bound``), whoever wrote it"""
    evicts_at_batch_build: ClassVar[bool] = False
    """the policy frees when a batch is built, for the requests in that batch only, as SGLang's
    ``ScheduleBatch.maybe_evict_swa`` does (``sglang``); False: after every step, for every running request"""

    @property
    def declared_interval(self) -> int:
        """Tokens the frontier may move past what was freed before the policy must free: 1 for a policy that
        frees every step, else the scenario's ``[eviction] interval``."""
        return 1 if self.frees_every_step else self.spec.interval

    def __init__(self, spec: EvictionSpec = EvictionSpec(), *, window: int, page_size: int = 1,
                 prefix_sharing: bool = False) -> None:
        self.spec = spec
        self.window = window
        """keys visible to a query, the query's own key included"""
        self.page_size = page_size
        self.prefix_sharing = prefix_sharing or spec.prefix_cache
        """finished requests stay in a prefix cache, whose SWA part must stay matchable"""

    def window_start(self, seq_len: int) -> int:
        """The first position the next query of a request with ``seq_len`` tokens reads."""
        return window_start(seq_len, self.window)

    @abstractmethod
    def frontier(self, req: RequestWindow) -> int:
        """Free the SWA slots of positions below this (never below ``req.swa_evicted``)."""


class TightEviction(EvictionPolicy):
    """Free exactly what left the window, after every step (whole pages of it: frees are page frees).

    Stricter than any serving engine (SGLang frees only every so many tokens), so a write location that
    still points at a freed slot, or a window off by one, shows at the first step it could matter: the freed
    slot is poisoned and reused at once. With prefix sharing it keeps the window rounded up to whole pages,
    as SGLang's policy does (PR 29860): at pages longer than the window, flooring the window's start to a
    page would free the request's last full page, and the prefix cache would receive a branch with no SWA
    KV at its end, which no later prompt can match. At pages of one token the two agree. That window is kept
    below where the insert ends, the key's length (SGLang PR 34870: a bigram key ends a token earlier than
    the tokens it spans, a page earlier at a page multiple).
    """

    name = "tight"
    frees_every_step = True

    def frontier(self, req: RequestWindow) -> int:
        if self.prefix_sharing:
            return max(req.swa_evicted, _floor_to(req.insert_len - retained_with_sharing(self.window, self.page_size),
                                                  self.page_size))
        return max(req.swa_evicted, self.window_start(req.seq_len) // self.page_size * self.page_size)


class SGLangEviction(EvictionPolicy):
    """SGLang's policy (``free_swa_out_of_window_slots`` as the scheduler calls it), in the harness's units.

    SGLang's ``sliding_window_size`` is the window without the query's own key (W - 1 here). Before a batch it
    frees a request's SWA slots below ``pre_len - retain``, ``pre_len`` being the tokens cached so far (the
    harness's ``seq_len`` after the step): ``retain`` is the window without prefix sharing, and with a prefix
    cache the window rounded up to whole pages (at least one page) so a cached branch keeps a matchable
    window, counted back from the key's length (PR 34870). The frontier is floored to a page, frees wait
    until it has moved ``interval`` tokens past what was freed, nothing is freed before a request's first
    decode batch, and during chunked prefill only without prefix sharing (there at an interval of 1: the
    interval gates decode batches). It frees when a batch is built, for the requests in that batch only
    (``evicts_at_batch_build``): a request that sits out another's extend batch keeps its slots until it is
    batched again.
    """

    name = "sglang"
    evicts_at_batch_build = True

    def frontier(self, req: RequestWindow) -> int:
        if req.prefilling and self.prefix_sharing:
            return req.swa_evicted
        # SGLANG_SWA_EVICTION_INTERVAL gates decode batches only: an extend batch frees at an interval of 1
        interval = 1 if req.prefilling else self.spec.interval
        if not req.prefilling and req.decoded == 0:
            return req.swa_evicted  # the batch about to run is the request's first decode batch
        sliding = self.window - 1
        retain = retained_with_sharing(self.window, self.page_size) if self.prefix_sharing else sliding
        moved = (req.insert_len if self.prefix_sharing else req.seq_len) - retain
        if moved < req.swa_evicted + interval:
            return req.swa_evicted
        return max(req.swa_evicted, moved // self.page_size * self.page_size)


def retention_bound(req: RequestWindow, *, window: int, page_size: int, interval: int, prefix_sharing: bool) -> int:
    """The position below which every SWA slot of ``req`` must be free after a step, whatever the policy: what
    SGLang may legitimately retain, from the model's ``window``, the ``page_size`` and the declared eviction
    ``interval`` alone. It keeps the window back from the newest token (without the query's own key; with a
    prefix cache rounded up to whole pages and counted back from the key's length, PR 34870), may wait until
    the frontier has moved ``interval`` tokens past what it freed, and frees whole pages; it frees nothing
    before a request's first decode batch, nor mid-prefill with a prefix cache. 0 where nothing is due.

    A policy that meets it after every step frees at least this much: freeing ``interval`` tokens late at the
    most (else it would have freed), floored to a page. The ``retained`` invariant measures against it, so a
    policy that frees too late breaches it whoever wrote the policy (``tight`` declares an interval of 1, where
    the bound is its own frontier)."""
    if req.prefilling and prefix_sharing:
        return 0
    if not req.prefilling and req.decoded == 0:
        return 0
    retain = retained_with_sharing(window, page_size) if prefix_sharing else window - 1
    moved = (req.insert_len if prefix_sharing else req.seq_len) - retain
    return _floor_to(moved - interval + 1, page_size)


def retained_with_sharing(window: int, page_size: int) -> int:
    """Tokens a request keeps behind its newest with a prefix cache: the window without the query's own key,
    rounded up to whole pages (at least one), so the page-aligned part a cache receives ends in live SWA KV."""
    return _ceil_to(max(window - 1, page_size), page_size)


def _ceil_to(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def _floor_to(n: int, unit: int) -> int:
    return max(0, n) // unit * unit

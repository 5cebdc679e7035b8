"""The scheduler's eviction driving: after each step, what leaves the pools and the prefix cache.

A finished request is freed, or with prefix sharing inserted into the SWA radix cache (``prefix_cache.py``)
and freed of what the cache did not take; a live request gives back the SWA slots its eviction policy frees
(the frontier, with the scheduler's faults bent into it), and a request mid-prefill is inserted between its
chunks. With the clock advanced, waiting requests are matched against the cache and cache pressure makes
room for the next batch. Every free goes through the run's serving stack.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .eviction import EvictionPolicy, retained_with_sharing, retention_bound
from .prefix_cache import SWARadixCache
from .registry import frontier
from .requests import Req, RequestBook
from .stack import ServingStack
from .timeline import TokenKey


@dataclass(frozen=True, slots=True, kw_only=True)
class StepEnd:
    """What ``finish_step`` freed after a step's forward."""

    finished: tuple[str, ...] = ()
    """requests that wrote their last token: both pools freed"""
    evicted: tuple[TokenKey, ...] = ()
    """tokens of live requests that left the window: their SWA slots freed"""


class EvictionDriver:
    """Frees, evicts and caches for the scheduler, over its request book."""

    def __init__(self, book: RequestBook, *, stack: ServingStack, eviction: EvictionPolicy,
                 cache: SWARadixCache | None, faults: frozenset[str], draft_steps: int) -> None:
        self.book = book
        self.stack = stack
        self.eviction = eviction
        self.cache = cache
        self.faults = faults
        self.draft_steps = draft_steps
        self._evicted_at_build: list[TokenKey] = []
        self.bigram = cache is not None and draft_steps > 0
        """EAGLE keys its radix cache by pairs of adjacent tokens (the draft model's KV at a position depends on the
        next token too): a request's key holds one entry fewer than its tokens"""

    def finish_running(self) -> StepEnd:
        """Free finished requests and evict what the eviction policy frees (the clock not yet advanced)."""
        finished: list[str] = []
        evicted, self._evicted_at_build = self._evicted_at_build, []
        at_build = self.eviction.evicts_at_batch_build
        for req in list(self.book.running):
            if req.seq_len >= req.total_len and not req.prefilling:
                if self.cache is not None and not req.released:
                    self._cache_finished(req)
                else:
                    self.book.free(req)
                finished.append(req.spec.rid)
            elif not req.released:
                if not at_build:
                    req.due = max(req.due, self._due(req))
                    evicted.extend(self._evict(req, self._frontier(req)))
                if self.cache is not None and req.prefilling:
                    evicted.extend(self._cache_unfinished(req))
                if "release_before_last_batch" in self.faults and self._last_batch_next(req):
                    # SGLang PR 18803 defers a finished request's release past the overlapped forward that still
                    # reads it; here it runs a batch early, while the request's last decode batch is still to come
                    self.stack.free(self.book.slots(req.slots[req.cached_len :]))
                    req.released = True
        return StepEnd(finished=tuple(finished), evicted=tuple(evicted))

    def evict_batch(self, reqs: list[Req]) -> None:
        """Under a policy that frees at batch build (``EvictionPolicy.evicts_at_batch_build``), free the
        out-of-window SWA slots of the running requests in the batch being built, before it allocates, as one
        group of frees; reported with the step's ``StepEnd``."""
        if not self.eviction.evicts_at_batch_build:
            return
        with self.stack.free_group():
            for req in reqs:
                if req.row < 0 or req.released:
                    continue  # admitted by this batch: nothing held yet
                req.due = max(req.due, self._due(req))
                self._evicted_at_build.extend(self._evict(req, self._frontier(req)))

    def _evict(self, req: Req, evict_to: int) -> list[TokenKey]:
        """Free the request's SWA slots of positions up to ``evict_to``."""
        if evict_to <= req.swa_evicted:
            return []
        self.stack.free_swa(self.book.slots(req.slots[req.swa_evicted : evict_to]))
        evicted = [TokenKey(req.spec.rid, p) for p in range(req.swa_evicted, evict_to)]
        req.swa_evicted = evict_to
        return evicted

    def _due(self, req: Req) -> int:
        """How far the request's SWA slots must be free after this step (``retention_bound``): from the model's
        window, the page size and the policy's declared interval, never from the policy's own frontier."""
        policy = self.eviction
        return retention_bound(req.window(bigram=self.bigram), window=policy.window, page_size=self.stack.page_size,
                               interval=policy.declared_interval, prefix_sharing=policy.prefix_sharing)

    def _last_batch_next(self, req: Req) -> bool:
        """The next decode batch writes the request's last token."""
        left = req.total_len - req.seq_len
        return not req.prefilling and 0 < left <= max(1, self.draft_steps)

    def _frontier(self, req: Req) -> int:
        window = req.window(bigram=self.bigram)
        if "evict_by_token_count" in self.faults:
            # SGLang before PR 34870: the frontier is counted back from the request's tokens, while a bigram
            # key's insert ends a token earlier (a page earlier at a page multiple)
            window = dataclasses.replace(window, key_len=None)
        if "skip_evict_mid_prefill" in self.faults and req.prefilling:
            return req.swa_evicted
        if "skip_evict_on_spec_decode" in self.faults and self.draft_steps > 0 and not req.prefilling:
            return req.swa_evicted  # SGLang PR 33805: the speculative decode path never called the eviction
        page = self.stack.page_size
        if "evict_one_past_window" in self.faults:
            # the frontier's formula one page ahead, as if a page more had been cached
            window = dataclasses.replace(window, seq_len=window.seq_len + page)
        at = frontier(self.eviction, window)
        if "evict_one_past_window" in self.faults:
            at = min(at, req.seq_len)
        if "evict_not_page_aligned" in self.faults:
            # the same policy without its floor to a page
            policy = self.eviction
            unpaged = type(policy)(policy.spec, window=policy.window, page_size=1, prefix_sharing=policy.prefix_sharing)
            at = max(at, frontier(unpaged, window))
        return at

    # ---- the prefix cache ------------------------------------------------------------------------------
    def _cache_finished(self, req: Req) -> None:
        """Insert a finished request (SGLang's ``cache_finished_req``) and free what the cache did not take."""
        assert self.cache is not None
        kept = self.cache.insert(self.key(req.tokens[: req.seq_len]), req.slots, cached_len=req.cached_len,
                                 swa_evicted=req.swa_evicted)
        # the cache freed the request's copies of what it already held; past ``kept`` the slots are still its own
        self.stack.free(self.book.slots(req.slots[kept.length :]))
        self.book.drop(req)

    def _cache_unfinished(self, req: Req) -> list[TokenKey]:
        """Insert a request between chunks of its prefill (SGLang's ``cache_unfinished_req``): its prefix so far
        becomes the cache's, and the request holds it locked from then on."""
        assert self.cache is not None
        evicted = []
        if "tombstone_last_leaf" in self.faults:
            # the eager free before the insert keeps only the window, without the page past it
            page = self.stack.page_size
            evicted = self._evict(req, max(0, req.seq_len - (self.eviction.window - 1)) // page * page)
        elif self.eviction.evicts_at_batch_build:
            evicted = self._evict(req, self._frontier_before_insert(req))
        swa_evicted = 0 if "unfinished_insert_no_evicted_len" in self.faults else req.swa_evicted
        lease = self.cache.insert(self.key(req.tokens[: req.seq_len]), req.slots, cached_len=req.cached_len,
                                  swa_evicted=swa_evicted, holder=req.spec.rid)
        self.book.release(req)
        req.lease = lease
        if lease.length > req.cached_len:
            theirs = list(lease.slots[req.cached_len : lease.length])
            if theirs != req.slots[req.cached_len : lease.length]:
                # the cache already held some of these tokens and freed the request's copies: read the cache's
                self.stack.write_req_to_token(req.row, req.cached_len,
                                              self.book.slots(theirs))
                req.slots[req.cached_len : lease.length] = theirs
            req.cached_len = lease.length
        req.swa_evicted = max(req.swa_evicted, req.cached_len)
        return evicted

    def _frontier_before_insert(self, req: Req) -> int:
        """Where SGLang's policy frees a request between chunks before inserting it (0.5.23's
        ``checkpoint_into_tree``, ``SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS`` on by default): its
        ``free_swa_out_of_window_slots`` at the key's last position, keeping the window rounded up to whole
        pages, once the window has moved a token past what it freed, floored to a page. The leaf the insert
        makes (up to the key's page floor) keeps at least a window of live SWA KV."""
        page, w = self.stack.page_size, self.eviction.window - 1
        pre_len = req.window(bigram=self.bigram).insert_len - 1
        if pre_len - w < req.swa_evicted + 1:
            return req.swa_evicted
        keep = retained_with_sharing(self.eviction.window, page)
        return max(req.swa_evicted, max(req.swa_evicted, pre_len - keep) // page * page)

    def prepare_next_step(self, next_step_pages: Callable[[], int]) -> None:
        """With the clock advanced: take in the requests that arrive now, match every waiting request against
        the cache (after this step's inserts), and make room for the next batch (``next_step_pages`` of each
        pool, as the batch builder counts them once the matches are known)."""
        assert self.cache is not None
        self.book.take_arrivals()
        for req in self.book.waiting:
            self.match(req)
        need = next_step_pages()
        page = self.stack.page_size
        while True:
            free = self.stack.free_slots()  # the SWA radix cache runs on SGLang's two groups
            free_full, free_swa = free["full"], free["swa"]
            short = ("swa_size" if len(free_swa) // page < need else
                     "full_size" if len(free_full) // page < need else None)
            if short is None or not self.cache.evict(short):
                return

    def match(self, req: Req) -> None:
        """Match the request's prompt (all but its last token, which must be computed) against the cache."""
        assert self.cache is not None
        self.book.release(req)
        # a bigram key of the whole prompt has an entry for every position but the last, like the plain key
        # of all but the last token
        prompt = req.tokens[: req.spec.prompt_len] if self.bigram else req.tokens[: req.spec.prompt_len - 1]
        req.lease = self.cache.match(self.key(prompt), holder=req.spec.rid)

    def key(self, tokens: torch.Tensor) -> list:
        """The radix key of ``tokens``: the tokens, or with bigram keys the pairs of adjacent ones (entry i
        stands for position i's KV)."""
        ids = tokens.tolist()
        return list(zip(ids, ids[1:])) if self.bigram else ids

    def admit_shared(self, req: Req) -> None:
        """Admit a request with its matched prefix: its row points at the cache's slots."""
        if req.lease is None:
            self.match(req)
        assert req.lease is not None
        m = req.lease.length
        if m:
            slots = list(req.lease.slots[:m])
            self.stack.write_req_to_token(req.row, 0, self.book.slots(slots))
            req.slots = slots
            req.seq_len = req.cached_len = req.swa_evicted = req.due = m

    def matched(self, req: Req) -> int:
        return req.lease.length if req.lease is not None else 0

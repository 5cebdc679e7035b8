"""Turns a request timeline into the sequence of ``ForwardBatch``es a serving engine would run.

Policy, SGLang's default without mixed chunked prefill: a step runs an extend batch while any request
still has prompt tokens to prefill (chunked by ``chunk_size``), otherwise one decode batch of every
running request (or a speculative draft batch when ``draft_steps`` > 0). Between steps, finished and
aborted requests free both pools and live requests give back the SWA slots their eviction policy frees.
Every slot, row and free goes through the run's serving stack (``stack.py``), never a pool directly.

With prefix sharing (``eviction.prefix_cache``) the scheduler keeps an SWA radix cache (``prefix_cache.py``):
a finished request is inserted instead of freed, a chunked prefill is inserted between its chunks, and a
request is admitted with the longest cached prefix its prompt matches (``prefix_lens`` = the match, its
``req_to_token`` row pointing at the cache's full slots), so its extend batch computes only the rest. A
request frees only what it owns, never the cache's slots. Matching and making room for the next batch
(cache pressure evicts from the cache) happen when the clock advances past a step, after that step's
inserts, so the pool invariants check both before a batch reads or reuses what they chose; a request that
arrives while nothing runs is matched when it is admitted. A run that speculates keys the cache as EAGLE does,
by pairs of adjacent tokens: a request's key is a token shorter than its tokens.

Tokens are teacher-forced from a seeded stream per request, so the schedule and every slot assignment
depend on the timeline alone, never on model outputs: a subject run and its reference see identical
batches and slots, and their KV caches can be compared slot by slot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass, field

import torch

from .batch import ForwardBatch, ForwardMode, make_forward_batch
from .eviction import EvictionPolicy, RequestWindow
from .faults import Component, faults_acting_on
from .loc_plan import KVIndexTranslator
from .pool import PoolExhausted
from .prefix_cache import Match, SWARadixCache
from .stack import ServingStack
from .timeline import LiveToken, RequestSpec, TimelineSpec, TokenKey, request_tokens


@dataclass(slots=True, kw_only=True)
class ScheduledStep:
    index: int
    batch: ForwardBatch
    forwards: tuple[tuple[TokenKey, ...], ...]
    """owner of each token row, per forward (a draft step runs several forwards)"""
    aborted: tuple[str, ...] = ()
    """requests aborted (both pools freed) before this step's batch was built"""

    @property
    def kind(self) -> str:
        return self.batch.forward_mode.value


@dataclass(frozen=True, slots=True, kw_only=True)
class StepEnd:
    """What ``finish_step`` freed after a step's forward."""

    finished: tuple[str, ...] = ()
    """requests that wrote their last token: both pools freed"""
    evicted: tuple[TokenKey, ...] = ()
    """tokens of live requests that left the window: their SWA slots freed"""


@dataclass(slots=True)
class _Req:
    spec: RequestSpec
    tokens: torch.Tensor
    row: int = -1
    seq_len: int = 0
    swa_evicted: int = 0
    """the request's own SWA slots below this are freed (the cache's below ``cached_len`` are not its own)"""
    due: int = 0
    """where the eviction policy (without faults) has put the frontier: positions below it hold no SWA slot"""
    decoded: int = 0
    slots: list[int] = field(default_factory=list)
    cached_len: int = 0
    """positions below this are the prefix cache's (a matched prefix, or the request's own inserted between
    chunks): shared, never freed by the request"""
    lease: Match | None = None
    """the request's locked prefix in the cache: its match while it waits or runs, then what it inserted"""
    released: bool = False
    """its slots are already back in the pools while it still runs (only under ``release_before_last_batch``)"""

    @property
    def total_len(self) -> int:
        return self.spec.prompt_len + self.spec.output_len

    @property
    def prefilling(self) -> bool:
        return self.seq_len < self.spec.prompt_len

    @property
    def last_loc(self) -> int:
        return self.slots[-1] if self.slots else 0

    def window(self, *, bigram: bool = False) -> RequestWindow:
        return RequestWindow(seq_len=self.seq_len, swa_evicted=self.swa_evicted, prefilling=self.prefilling,
                             decoded=self.decoded, key_len=max(0, self.seq_len - 1) if bigram else None)


class TimelineTooLong(RuntimeError):
    """The timeline did not finish within ``max_steps`` steps."""

    def __init__(self, max_steps: int) -> None:
        super().__init__(max_steps)
        self.max_steps = max_steps

    def __str__(self) -> str:
        return f"timeline did not finish within max_steps={self.max_steps}"


class Scheduler:
    """Drive it with ``next_step()`` until it returns None, calling ``finish_step()`` after each forward."""

    component = Component.SCHEDULER

    def __init__(
        self,
        timeline: TimelineSpec,
        *,
        stack: ServingStack,
        eviction: EvictionPolicy,
        vocab_size: int,
        faults: Collection[str] = (),
    ) -> None:
        self.timeline = timeline
        self.stack = stack
        self.eviction = eviction
        self.faults = frozenset(faults) & faults_acting_on(Component.SCHEDULER)
        self.device = stack.device
        self._translator = KVIndexTranslator(stack.translate, reuse_stale_plan="reuse_stale_plan" in self.faults)
        self.cache = (SWARadixCache(stack, window=eviction.window, page_size=stack.page_size, faults=faults)
                      if eviction.prefix_sharing else None)
        if self.cache is not None:
            stack.hold_prefix_cache(self.cache)
        self._bigram = self.cache is not None and timeline.draft_steps > 0
        """EAGLE keys its radix cache by pairs of adjacent tokens (the draft model's KV at a position depends on the
        next token too): a request's key holds one entry fewer than its tokens"""
        tokens = request_tokens(timeline, vocab_size)
        self._pending = [
            _Req(spec=r, tokens=tokens[r.rid]) for r in sorted(timeline.requests, key=lambda r: r.arrive)
        ]
        self._waiting: list[_Req] = []
        self._running: list[_Req] = []
        self._step = 0
        self._aborted: list[str] = []

    @property
    def step_index(self) -> int:
        return self._step

    def next_step(self) -> ScheduledStep | None:
        """The next batch to run, or None once every request has finished or been aborted."""
        while self._step < self.timeline.max_steps:
            self._apply_aborts()
            while self._pending and self._pending[0].spec.arrive <= self._step:
                self._waiting.append(self._pending.pop(0))
            step = self._build()
            if step is not None:
                step.aborted, self._aborted = tuple(self._aborted), []
                return step
            if not self._pending:
                return None
            self._step += 1
        raise TimelineTooLong(self.timeline.max_steps)

    def live_tokens(self) -> list[LiveToken]:
        """Every token of every running request, with its slots, as of now."""
        out = []
        # one translation of every running request's slots (it maps slot by slot) rather than one per request:
        # this runs twice a step, and on the tiny tensors here each call costs far more than its elements
        every = [slot for req in self._running for slot in req.slots]
        per_token = list(zip(*self.stack.group_slots(torch.tensor(every, dtype=torch.int64, device=self.device))
                             .tolist())) if every else []
        start = 0
        for req in self._running:
            # the keys the request's next query will read; older ones may already be evicted
            first_in_window = self.eviction.window_start(req.seq_len)
            slots = per_token[start : start + len(req.slots)]
            start += len(req.slots)
            for pos, held in enumerate(slots):
                out.append(
                    LiveToken(
                        rid=req.spec.rid, pos=pos, slots=held, in_window=pos >= first_in_window,
                        past_frontier=req.cached_len <= pos < req.due, shared=pos < req.cached_len,
                    )
                )
        return out

    def finish_step(self) -> StepEnd:
        """Free finished requests and evict what the eviction policy frees, then advance the clock."""
        finished: list[str] = []
        evicted: list[TokenKey] = []
        for req in list(self._running):
            if req.seq_len >= req.total_len and not req.prefilling:
                if self.cache is not None and not req.released:
                    self._cache_finished(req)
                else:
                    self._free(req)
                finished.append(req.spec.rid)
            elif not req.released:
                req.due = max(req.due, self.eviction.frontier(req.window(bigram=self._bigram)))
                evicted.extend(self._evict(req, self._frontier(req)))
                if self.cache is not None and req.prefilling:
                    evicted.extend(self._cache_unfinished(req))
                if "release_before_last_batch" in self.faults and self._last_batch_next(req):
                    # SGLang PR 18803 defers a finished request's release past the overlapped forward that still
                    # reads it; here it runs a batch early, while the request's last decode batch is still to come
                    self.stack.free(torch.tensor(req.slots[req.cached_len :], dtype=torch.int64, device=self.device))
                    req.released = True
        self._step += 1
        if self.cache is not None:
            self._prepare_next_step()
        return StepEnd(finished=tuple(finished), evicted=tuple(evicted))

    # ---- internals -------------------------------------------------------------------------------------
    def _evict(self, req: _Req, evict_to: int) -> list[TokenKey]:
        """Free the request's SWA slots of positions up to ``evict_to``."""
        if evict_to <= req.swa_evicted:
            return []
        self.stack.free_swa(torch.tensor(req.slots[req.swa_evicted : evict_to], dtype=torch.int64, device=self.device))
        evicted = [TokenKey(req.spec.rid, p) for p in range(req.swa_evicted, evict_to)]
        req.swa_evicted = evict_to
        return evicted

    def _last_batch_next(self, req: _Req) -> bool:
        """The next decode batch writes the request's last token."""
        left = req.total_len - req.seq_len
        return not req.prefilling and 0 < left <= max(1, self.timeline.draft_steps)

    def _frontier(self, req: _Req) -> int:
        window = req.window(bigram=self._bigram)
        if "evict_by_token_count" in self.faults:
            # SGLang before PR 34870: the frontier is counted back from the request's tokens, while a bigram
            # key's insert ends a token earlier (a page earlier at a page multiple)
            window = dataclasses.replace(window, key_len=None)
        if "skip_evict_mid_prefill" in self.faults and req.prefilling:
            return req.swa_evicted
        page = self.stack.page_size
        if "evict_one_past_window" in self.faults:
            # the frontier's formula one page ahead, as if a page more had been cached
            window = dataclasses.replace(window, seq_len=window.seq_len + page)
        frontier = self.eviction.frontier(window)
        if "evict_one_past_window" in self.faults:
            frontier = min(frontier, req.seq_len)
        if "evict_not_page_aligned" in self.faults:
            # the same policy without its floor to a page
            policy = self.eviction
            unpaged = type(policy)(policy.spec, window=policy.window, page_size=1, prefix_sharing=policy.prefix_sharing)
            frontier = max(frontier, unpaged.frontier(window))
        return frontier

    def _apply_aborts(self) -> None:
        for req in list(self._running):
            if req.spec.abort is not None and req.spec.abort <= self._step:
                self._free(req)
                self._aborted.append(req.spec.rid)
        for req in self._waiting:
            if req.spec.abort is not None and req.spec.abort <= self._step:
                self._release(req)
        self._waiting = [r for r in self._waiting if r.spec.abort is None or r.spec.abort > self._step]

    def _free(self, req: _Req) -> None:
        """A request leaves without being cached: free what it owns (all of it, without a prefix cache)."""
        if not req.released:
            self.stack.free(torch.tensor(req.slots[req.cached_len :], dtype=torch.int64, device=self.device))
        self._drop(req)

    def _drop(self, req: _Req) -> None:
        """The request leaves, its slots already freed or cached: its lease and row go."""
        self._release(req)
        self.stack.free_req_row(req.row)
        self._running.remove(req)

    # ---- the prefix cache ------------------------------------------------------------------------------
    def _release(self, req: _Req) -> None:
        if self.cache is not None and req.lease is not None:
            self.cache.release(req.lease)
            req.lease = None

    def _cache_finished(self, req: _Req) -> None:
        """Insert a finished request (SGLang's ``cache_finished_req``) and free what the cache did not take."""
        assert self.cache is not None
        kept = self.cache.insert(self._key(req.tokens[: req.seq_len]), req.slots, cached_len=req.cached_len,
                                 swa_evicted=req.swa_evicted)
        # the cache freed the request's copies of what it already held; past ``kept`` the slots are still its own
        self.stack.free(torch.tensor(req.slots[kept.length :], dtype=torch.int64, device=self.device))
        self._release(req)
        self.stack.free_req_row(req.row)
        self._running.remove(req)

    def _cache_unfinished(self, req: _Req) -> list[TokenKey]:
        """Insert a request between chunks of its prefill (SGLang's ``cache_unfinished_req``): its prefix so far
        becomes the cache's, and the request holds it locked from then on."""
        assert self.cache is not None
        evicted = []
        if "tombstone_last_leaf" in self.faults:
            # the eager free before the insert keeps only the window, without the page past it
            page = self.stack.page_size
            evicted = self._evict(req, max(0, req.seq_len - (self.eviction.window - 1)) // page * page)
        swa_evicted = 0 if "unfinished_insert_no_evicted_len" in self.faults else req.swa_evicted
        lease = self.cache.insert(self._key(req.tokens[: req.seq_len]), req.slots, cached_len=req.cached_len,
                                  swa_evicted=swa_evicted, holder=req.spec.rid)
        self._release(req)
        req.lease = lease
        if lease.length > req.cached_len:
            theirs = list(lease.slots[req.cached_len : lease.length])
            if theirs != req.slots[req.cached_len : lease.length]:
                # the cache already held some of these tokens and freed the request's copies: read the cache's
                self.stack.write_req_to_token(req.row, req.cached_len,
                                              torch.tensor(theirs, dtype=torch.int64, device=self.device))
                req.slots[req.cached_len : lease.length] = theirs
            req.cached_len = lease.length
        req.swa_evicted = max(req.swa_evicted, req.cached_len)
        return evicted

    def _prepare_next_step(self) -> None:
        """With the clock advanced: take in the requests that arrive now, match every waiting request against
        the cache (after this step's inserts), and make room for the next batch."""
        assert self.cache is not None
        while self._pending and self._pending[0].spec.arrive <= self._step:
            self._waiting.append(self._pending.pop(0))
        for req in self._waiting:
            self._match(req)
        need = self._next_step_pages()
        page = self.stack.page_size
        while True:
            free = self.stack.free_slots()  # the SWA radix cache runs on SGLang's two groups
            free_full, free_swa = free["full"], free["swa"]
            short = ("swa_size" if len(free_swa) // page < need else
                     "full_size" if len(free_full) // page < need else None)
            if short is None or not self.cache.evict(short):
                return

    def _match(self, req: _Req) -> None:
        """Match the request's prompt (all but its last token, which must be computed) against the cache."""
        assert self.cache is not None
        self._release(req)
        # a bigram key of the whole prompt has an entry for every position but the last, like the plain key
        # of all but the last token
        prompt = req.tokens[: req.spec.prompt_len] if self._bigram else req.tokens[: req.spec.prompt_len - 1]
        req.lease = self.cache.match(self._key(prompt), holder=req.spec.rid)

    def _key(self, tokens: torch.Tensor) -> list:
        """The radix key of ``tokens``: the tokens, or with bigram keys the pairs of adjacent ones (entry i
        stands for position i's KV)."""
        ids = tokens.tolist()
        return list(zip(ids, ids[1:])) if self._bigram else ids

    def _admit_shared(self, req: _Req) -> None:
        """Admit a request with its matched prefix: its row points at the cache's slots."""
        if req.lease is None:
            self._match(req)
        assert req.lease is not None
        m = req.lease.length
        if m:
            slots = list(req.lease.slots[:m])
            self.stack.write_req_to_token(req.row, 0, torch.tensor(slots, dtype=torch.int64, device=self.device))
            req.slots = slots
            req.seq_len = req.cached_len = req.swa_evicted = req.due = m

    def _matched(self, req: _Req) -> int:
        return req.lease.length if req.lease is not None else 0

    def _next_step_pages(self) -> int:
        """Pages (of each pool) the batch ``next_step`` would build now allocates."""
        page = self.stack.page_size

        def opening(pre: int, n: int) -> int:
            return -(-(pre + n) // page) - -(-pre // page)

        prefilling = [r for r in self._running if r.prefilling]
        if prefilling or self._waiting:
            return sum(opening(req.seq_len if req.row >= 0 else self._matched(req), n)
                       for req, n in self._plan_extend(prefilling))
        steps = self._decode_steps(self._running) if self._running else 0
        return sum(opening(r.seq_len + i, 1) for i in range(steps) for r in self._running)

    def _alloc(self, *, prefix_lens: list[int], extend_lens: list[int], last_locs: list[int]) -> torch.Tensor:
        """Slots from the stack; when a pool runs out with a prefix cache, the cache gives some back first."""
        while True:
            try:
                return self.stack.alloc_extend(prefix_lens=prefix_lens, extend_lens=extend_lens, last_locs=last_locs)
            except PoolExhausted as exc:
                if self.cache is None or not self.cache.evict(exc.field):
                    raise

    def _build(self) -> ScheduledStep | None:
        prefilling = [r for r in self._running if r.prefilling]
        if prefilling or self._waiting:
            return self._build_extend(prefilling)
        if self._running:
            return self._build_decode()
        return None

    def _plan_extend(self, prefilling: list[_Req]) -> list[tuple[_Req, int]]:
        """The requests of the next extend batch and how many tokens each adds: the ones mid-prefill first,
        then waiting ones (after their matched prefix) while the chunk budget lasts."""
        budget = self.timeline.chunk_size or 1 << 30
        chosen: list[tuple[_Req, int]] = []
        for req in prefilling:
            if budget <= 0:
                break
            n = min(req.spec.prompt_len - req.seq_len, budget)
            chosen.append((req, n))
            budget -= n
        for req in self._waiting:
            if budget <= 0:
                break
            n = min(req.spec.prompt_len - self._matched(req), budget)
            chosen.append((req, n))
            budget -= n
        return chosen

    def _build_extend(self, prefilling: list[_Req]) -> ScheduledStep:
        if self.cache is not None:
            for req in self._waiting:
                if req.lease is None:
                    self._match(req)  # arrived while nothing ran: matched at admission
        chosen = self._plan_extend(prefilling)
        for req, _ in chosen:
            if req.row >= 0:
                continue  # already running: mid-prefill
            self._waiting.remove(req)
            req.row = self.stack.alloc_req_row()
            self._running.append(req)
            if self.cache is not None:
                self._admit_shared(req)
        ids, positions, rows, prefix_lens, extend_lens, locs, owners = [], [], [], [], [], [], []
        for req, n in chosen:
            start = req.seq_len
            slots = self._alloc(prefix_lens=[start], extend_lens=[n], last_locs=[req.last_loc])
            self.stack.write_req_to_token(req.row, start, slots)
            req.slots.extend(slots.tolist())
            ids.append(req.tokens[start : start + n])
            positions.append(torch.arange(start, start + n))
            rows.append(req.row)
            prefix_lens.append(start)
            extend_lens.append(n)
            locs.append(slots)
            owners.extend(TokenKey(req.spec.rid, p) for p in range(start, start + n))
            req.seq_len += n
        out_cache_loc = torch.cat(locs)
        batch = make_forward_batch(
            forward_mode=ForwardMode.EXTEND,
            input_ids=torch.cat(ids).to(self.device),
            positions=torch.cat(positions).to(self.device),
            req_pool_indices=torch.tensor(rows, dtype=torch.int64, device=self.device),
            prefix_lens=prefix_lens,
            extend_lens=extend_lens,
            out_cache_loc=out_cache_loc,
            req_to_token_pool=self.stack.req_to_token_pool,
            pool=self.stack.pool,
            kv_loc_plan=self._translator.own_plan(self._step, out_cache_loc),
        )
        return ScheduledStep(index=self._step, batch=batch, forwards=(tuple(owners),))

    def _build_decode(self) -> ScheduledStep:
        reqs = list(self._running)
        steps = self._decode_steps(reqs)
        # step-major allocation: all of draft step 0's slots, then step 1's ...
        ids = torch.zeros((steps, len(reqs)), dtype=torch.int64)
        forwards: list[tuple[TokenKey, ...]] = []
        loc_rows = []
        for i in range(steps):
            locs = self._alloc(prefix_lens=[r.seq_len + i for r in reqs], extend_lens=[1] * len(reqs),
                               last_locs=[r.last_loc for r in reqs])
            loc_rows.append(locs)
            owners = []
            for b, req in enumerate(reqs):
                pos = req.seq_len + i
                self.stack.write_req_to_token(req.row, pos, locs[b : b + 1])
                req.slots.append(int(locs[b]))
                ids[i, b] = req.tokens[pos]
                owners.append(TokenKey(req.spec.rid, pos))
            forwards.append(tuple(owners))
        prefix_lens = [r.seq_len for r in reqs]
        for req in reqs:
            req.seq_len += steps
            req.decoded += 1
        draft = self.timeline.draft_steps > 0
        batch = make_forward_batch(
            forward_mode=ForwardMode.DRAFT if draft else ForwardMode.DECODE,
            input_ids=ids[0].to(self.device),
            positions=torch.tensor(prefix_lens, dtype=torch.int64, device=self.device),
            req_pool_indices=torch.tensor([r.row for r in reqs], dtype=torch.int64, device=self.device),
            prefix_lens=prefix_lens,
            extend_lens=[1] * len(reqs),
            out_cache_loc=loc_rows[0],
            req_to_token_pool=self.stack.req_to_token_pool,
            pool=self.stack.pool,
            draft_out_cache_loc=torch.stack(loc_rows) if draft else None,
            draft_input_ids=ids.to(self.device) if draft else None,
            kv_loc_plan=self._translator.own_plan(self._step, torch.cat(loc_rows)),
        )
        return ScheduledStep(index=self._step, batch=batch, forwards=tuple(forwards))

    def _decode_steps(self, reqs: list[_Req]) -> int:
        """Forwards of the next decode step: one, or the draft length (no request drafting past its end)."""
        if self.timeline.draft_steps > 0:
            return min(self.timeline.draft_steps, *(r.total_len - r.seq_len for r in reqs))
        return 1

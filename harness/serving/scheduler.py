"""Turns a request timeline into the sequence of ``ForwardBatch``es a serving engine would run.

Policy, SGLang's default without mixed chunked prefill: a step runs an extend batch while any request
still has prompt tokens to prefill (chunked by ``chunk_size``), otherwise one decode batch of every
running request (or a speculative draft batch when ``draft_steps`` > 0). Between steps, finished and
aborted requests free both pools and live requests give back the SWA slots their eviction policy frees.
Every slot, row and free goes through the run's serving stack (``stack.py``), never a pool directly.

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
    due: int = 0
    """where the eviction policy (without faults) has put the frontier: positions below it hold no SWA slot"""
    decoded: int = 0
    slots: list[int] = field(default_factory=list)

    @property
    def total_len(self) -> int:
        return self.spec.prompt_len + self.spec.output_len

    @property
    def prefilling(self) -> bool:
        return self.seq_len < self.spec.prompt_len

    @property
    def last_loc(self) -> int:
        return self.slots[-1] if self.slots else 0

    def window(self) -> RequestWindow:
        return RequestWindow(seq_len=self.seq_len, swa_evicted=self.swa_evicted, prefilling=self.prefilling,
                             decoded=self.decoded)


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
        for req in self._running:
            # the keys the request's next query will read; older ones may already be evicted
            first_in_window = self.eviction.window_start(req.seq_len)
            swa = self.stack.translate(torch.tensor(req.slots, dtype=torch.int64, device=self.device)).tolist() \
                if req.slots else []
            for pos, (full, swa_slot) in enumerate(zip(req.slots, swa)):
                out.append(
                    LiveToken(
                        rid=req.spec.rid, pos=pos, full_slot=full, swa_slot=swa_slot, in_window=pos >= first_in_window,
                        past_frontier=pos < req.due,
                    )
                )
        return out

    def finish_step(self) -> StepEnd:
        """Free finished requests and evict what the eviction policy frees, then advance the clock."""
        finished: list[str] = []
        evicted: list[TokenKey] = []
        for req in list(self._running):
            if req.seq_len >= req.total_len and not req.prefilling:
                self._free(req)
                finished.append(req.spec.rid)
            else:
                req.due = max(req.due, self.eviction.frontier(req.window()))
                evict_to = self._frontier(req)
                if evict_to > req.swa_evicted:
                    self.stack.free_swa(
                        torch.tensor(req.slots[req.swa_evicted : evict_to], dtype=torch.int64, device=self.device)
                    )
                    evicted.extend(TokenKey(req.spec.rid, p) for p in range(req.swa_evicted, evict_to))
                    req.swa_evicted = evict_to
        self._step += 1
        return StepEnd(finished=tuple(finished), evicted=tuple(evicted))

    # ---- internals -------------------------------------------------------------------------------------
    def _frontier(self, req: _Req) -> int:
        window = req.window()
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
        self._waiting = [r for r in self._waiting if r.spec.abort is None or r.spec.abort > self._step]

    def _free(self, req: _Req) -> None:
        self.stack.free(torch.tensor(req.slots, dtype=torch.int64, device=self.device))
        self.stack.free_req_row(req.row)
        self._running.remove(req)

    def _build(self) -> ScheduledStep | None:
        prefilling = [r for r in self._running if r.prefilling]
        if prefilling or self._waiting:
            return self._build_extend(prefilling)
        if self._running:
            return self._build_decode()
        return None

    def _build_extend(self, prefilling: list[_Req]) -> ScheduledStep:
        budget = self.timeline.chunk_size or 1 << 30
        chosen: list[tuple[_Req, int]] = []
        for req in prefilling:
            if budget <= 0:
                break
            n = min(req.spec.prompt_len - req.seq_len, budget)
            chosen.append((req, n))
            budget -= n
        while self._waiting and budget > 0:
            req = self._waiting.pop(0)
            req.row = self.stack.alloc_req_row()
            self._running.append(req)
            n = min(req.spec.prompt_len, budget)
            chosen.append((req, n))
            budget -= n
        ids, positions, rows, prefix_lens, extend_lens, locs, owners = [], [], [], [], [], [], []
        for req, n in chosen:
            start = req.seq_len
            slots = self.stack.alloc_extend(prefix_lens=[start], extend_lens=[n], last_locs=[req.last_loc])
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
        steps = 1
        if self.timeline.draft_steps > 0:
            steps = min(self.timeline.draft_steps, *(r.total_len - r.seq_len for r in reqs))
        # step-major allocation: all of draft step 0's slots, then step 1's ...
        ids = torch.zeros((steps, len(reqs)), dtype=torch.int64)
        forwards: list[tuple[TokenKey, ...]] = []
        loc_rows = []
        for i in range(steps):
            locs = self.stack.alloc_extend(prefix_lens=[r.seq_len + i for r in reqs], extend_lens=[1] * len(reqs),
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

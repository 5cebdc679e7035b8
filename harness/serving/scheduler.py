"""Turns a request timeline into the sequence of ``ForwardBatch``es a serving engine would run.

Policy, SGLang's default without mixed chunked prefill: a step runs an extend batch while any request
still has prompt tokens to prefill (chunked by ``chunk_size``), otherwise one decode batch of every
running request (or a speculative draft batch when ``draft_steps`` > 0). Between steps, finished and
aborted requests free both pools and live requests give back the SWA slots their eviction policy frees.
Every slot, row and free goes through the run's serving stack (``stack.py``), never a pool directly.

Three jobs, three modules: request bookkeeping (``requests.py``: each request's state, the queues, the
clock), batch building (``batch_builder.py``) and eviction driving after each step
(``eviction_driver.py``: frees, evictions, the prefix cache's inserts and matches). The scheduler holds
them together and is what a run drives.

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

from collections.abc import Collection

import torch

from .batch_builder import BatchBuilder, ScheduledStep
from .eviction import EvictionPolicy
from .eviction_driver import EvictionDriver, StepEnd
from .faults import Component, faults_acting_on
from .loc_plan import KVIndexTranslator
from .prefix_cache import SWARadixCache
from .requests import RequestBook
from .stack import ServingStack
from .timeline import LiveToken, TimelineSpec

__all__ = ["ScheduledStep", "Scheduler", "StepEnd", "TimelineTooLong"]


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
        self.cache = (SWARadixCache(stack, window=eviction.window, page_size=stack.page_size, faults=faults)
                      if eviction.prefix_sharing else None)
        if self.cache is not None:
            stack.hold_prefix_cache(self.cache)
        self.book = RequestBook(timeline, stack=stack, cache=self.cache, vocab_size=vocab_size)
        self.driver = EvictionDriver(self.book, stack=stack, eviction=eviction, cache=self.cache, faults=self.faults,
                                     draft_steps=timeline.draft_steps)
        translator = KVIndexTranslator(stack.translate, reuse_stale_plan="reuse_stale_plan" in self.faults)
        self.builder = BatchBuilder(self.book, stack=stack, timeline=timeline, translator=translator,
                                    driver=self.driver)
        self._running = self.book.running  # the book changes it in place only

    @property
    def step_index(self) -> int:
        return self.book.step

    @property
    def evicts_at_batch_build(self) -> bool:
        """Its eviction frees when a batch is built (``EvictionPolicy.evicts_at_batch_build``), not after a step."""
        return self.eviction.evicts_at_batch_build

    def next_step(self) -> ScheduledStep | None:
        """The next batch to run, or None once every request has finished or been aborted."""
        book = self.book
        while book.step < self.timeline.max_steps:
            book.apply_aborts()
            book.take_arrivals()
            step = self.builder.build()
            if step is not None:
                step.aborted, book.aborted = tuple(book.aborted), []
                return step
            if not book.pending:
                return None
            book.step += 1
        raise TimelineTooLong(self.timeline.max_steps)

    def live_tokens(self) -> list[LiveToken]:
        """Every token of every running request, with its slots, as of now."""
        out = []
        # one translation of every running request's slots (it maps slot by slot) rather than one per request:
        # this runs twice a step, and on the tiny tensors here each call costs far more than its elements
        branches = self.builder.held_branches
        every = [slot for req in self._running for slot in req.slots] + [slot for *_, slot in branches]
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
        # a tree draft's other branches, between its batch build and its verify: the draft's, not yet freed
        out.extend(LiveToken(rid=req.spec.rid, pos=pos, slots=per_token[start + i], in_window=True, branch=k)
                   for i, (req, pos, k, _) in enumerate(branches))
        return out

    def finish_step(self) -> StepEnd:
        """Free finished requests and evict what the eviction policy frees, then advance the clock."""
        end = self.driver.finish_running()
        self.book.step += 1
        if self.cache is not None:
            self.driver.prepare_next_step(self.builder.next_step_pages)
        return end

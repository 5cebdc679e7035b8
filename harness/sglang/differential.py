"""The differential test of the miniature: one timeline through the miniature's allocator, eviction and
translation and through the installed SGLang's, with the same knobs, compared step by step.

Per step both sides record the batch's full slots (``out_cache_loc``), their SWA slots (translated), the whole
``full_to_swa_index_mapping``, what was finished and evicted after the step, and both pools' free slots.
Everything must be identical, except the differences listed in ``DIFFERENCES`` (the one place they are
named, each with its reason), which the comparison leaves out or converts.

The knobs: the page size and the timeline are the scenario's; the eviction interval is the scenario's under
its ``sglang`` policy and 1 otherwise; the miniature runs its model of SGLang's policy (``sglang``) against
the installed function (``eviction.InstalledSGLangEviction``), in SGLang's free order for the page size.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..runspec import RunSpec
from ..serving.eviction import EvictionSpec
from ..serving.miniature import MiniatureStack
from ..serving.pool import PoolExhausted
from ..serving.registry import eviction_policy
from ..serving.scheduler import Scheduler
from ..serving.stack import HybridSWAStack, StackSpec
from .eviction import InstalledSGLangEviction
from .stack import SGLangStack, free_order, unsupported

DIFFERENCES: dict[str, str] = {
    "request rows": "SGLang's ReqToTokenPool hands out the highest free row first, reuses a freed row first and "
                    "does not zero it; the miniature takes the lowest and zeroes it. Rows never choose slots, so "
                    "the rows are not compared (every slot and mapping entry is)",
    "translate dtype": "SGLang's translate_loc_from_full_to_swa returns int64, the miniature's int32 (the width "
                       "its backends index with); compared as values",
    "free order": "the miniature's default reuses the lowest free slot first, so a freed slot is reused at once "
                  "(stale writes show sooner); SGLang reuses first in, first out at page 1 and last freed first "
                  "with pages. Compared in SGLang's order (pool.free_order = 'fifo' / 'lifo')",
    "eviction policy": "the harness's default policy (tight) frees every step, to the window; SGLang frees only "
                       "past an interval and not in a request's first decode batch. Compared with the "
                       "miniature's model of SGLang's policy ('sglang'), at the scenario's interval (or 1)",
    "finished rows with pages": "SGLang frees a finished request's row as two segments "
                                "(free_kv_row_segments): first the run its eviction already freed, full side "
                                "only, then the rest, and each call puts its pages at the head of the free list, "
                                "so with pages the finished request's pages still in the window are reused "
                                "first. The miniature frees the row in one call, in position order, so its "
                                "first page is reused first. Not on purpose: the miniature side frees in "
                                "SGLang's two calls here (_TwoSegmentFree) until the miniature does",
    "interval in chunked prefill": "SGLang's maybe_evict_swa frees an extend batch's requests (without prefix "
                                   "sharing) at an interval of 1: SGLANG_SWA_EVICTION_INTERVAL gates decode "
                                   "batches only. The miniature's sglang policy waits for the interval in "
                                   "chunked prefill too, so it frees later there. Not on purpose; no library "
                                   "timeline chunks a prompt past the window under an interval above 1, so the "
                                   "traces agree, and the frontier test names the case",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSlots:
    """What one side did in one step, in the stack's slot numbers."""

    index: int
    kind: str
    full: tuple[int, ...]
    swa: tuple[int, ...]
    mapping: tuple[int, ...]
    finished: tuple[str, ...]
    evicted: tuple[tuple[str, int], ...]
    free_full: tuple[int, ...]
    free_swa: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    steps: tuple[StepSlots, ...]
    exhausted: str | None = None
    """the pool field that ran out, and at which step (both sides must run out alike)"""


class _TwoSegmentFree(MiniatureStack):
    """The miniature, freeing a finished row in SGLang's two calls ("finished rows with pages")."""

    def free(self, full_slots: torch.Tensor) -> None:
        mapped = (self.pool.full_to_swa_index_mapping[full_slots.long()] > 0).tolist()
        evicted = mapped.index(True) if True in mapped else len(mapped)
        self.allocator.free(full_slots[:evicted])
        self.allocator.free(full_slots[evicted:])


def comparable_spec(spec: RunSpec) -> RunSpec:
    """``spec`` with the knobs both sides share: SGLang's free order at its page size, and its policy with the
    scenario's interval under the ``sglang`` policy (1 otherwise)."""
    interval = spec.eviction.interval if spec.eviction.policy == "sglang" else 1
    return dataclasses.replace(
        spec, pool=dataclasses.replace(spec.pool, free_order=free_order(spec.pool.page_size)),
        eviction=EvictionSpec(policy="sglang", interval=interval, prefix_cache=spec.eviction.prefix_cache),
    )


def not_expressible(spec: RunSpec) -> str | None:
    """Why SGLang cannot run ``spec``'s timeline through the adapter, or None."""
    spec = comparable_spec(spec)
    return unsupported(_stack_spec(spec), prefix_cache=spec.eviction.prefix_cache)


def trace(spec: RunSpec, *, installed: bool) -> Trace:
    """The timeline of ``spec`` (made comparable) through the miniature or the installed SGLang."""
    spec = comparable_spec(spec)
    stack_spec = _stack_spec(spec)
    stack: HybridSWAStack = SGLangStack.build(stack_spec) if installed else _TwoSegmentFree.build(stack_spec)
    window, page = spec.model.window, spec.pool.page_size
    policy = (InstalledSGLangEviction(spec.eviction, window=window, page_size=page) if installed
              else eviction_policy(spec.eviction, window=window, page_size=page))
    sched = Scheduler(spec.timeline, stack=stack, eviction=policy, vocab_size=spec.model.vocab_size)
    steps: list[StepSlots] = []
    mapping = stack.pool.full_to_swa_index_mapping
    try:
        while (step := sched.next_step()) is not None:
            full = step.batch.out_cache_loc
            swa = stack.translate(full)
            end = sched.finish_step()
            free = stack.free_slots()
            free_full, free_swa = free["full"], free["swa"]
            steps.append(StepSlots(
                index=step.index, kind=step.kind, full=tuple(full.tolist()), swa=tuple(swa.tolist()),
                mapping=tuple(mapping.tolist()), finished=end.finished,
                evicted=tuple((k.rid, k.pos) for k in end.evicted),
                free_full=tuple(sorted(free_full)), free_swa=tuple(sorted(free_swa)),
            ))
    except PoolExhausted as exc:
        return Trace(steps=tuple(steps), exhausted=f"{exc.field} at step {sched.step_index}")
    return Trace(steps=tuple(steps))


def first_difference(miniature: Trace, sglang: Trace) -> str | None:
    """The first step and field where the two traces differ, or None when they agree throughout."""
    for mine, theirs in zip(miniature.steps, sglang.steps):
        for field in dataclasses.fields(StepSlots):
            a, b = getattr(mine, field.name), getattr(theirs, field.name)
            if a != b:
                return f"step {mine.index}: {field.name} differs: miniature {_short(a)}, SGLang {_short(b)}"
    if len(miniature.steps) != len(sglang.steps):
        return f"the miniature ran {len(miniature.steps)} steps, SGLang {len(sglang.steps)}"
    if miniature.exhausted != sglang.exhausted:
        return f"pool exhaustion differs: miniature {miniature.exhausted}, SGLang {sglang.exhausted}"
    return None


def _stack_spec(spec: RunSpec) -> StackSpec:
    # slot bookkeeping only: one KV head of one element per layer keeps the pools tiny
    return StackSpec(pool=spec.pool, layer_is_swa=tuple(spec.model.layer_is_swa), num_kv_heads=1, head_dim=1,
                     device="cpu", poison_freed=False)


def _short(value: object) -> str:
    if isinstance(value, tuple) and len(value) > 12:
        return f"{value[:12]}... ({len(value)} items)"
    return repr(value)

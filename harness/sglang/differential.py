"""The differential test of the miniature: one timeline through the miniature's scheduler, allocator, eviction
and translation and through SGLang's own path (``schedule.SGLangScheduler``: real ``Req`` objects and
``ScheduleBatch``es, their ``maybe_evict_swa`` and allocation, ``release_kv_cache``, over the installed
allocator), with the same knobs, compared step by step.

Per step both sides record, once the step's batch is built: its full slots (``out_cache_loc``), their SWA
slots (translated), its input ids, the whole ``full_to_swa_index_mapping``, what was evicted building it and
what finished the step before, and both pools' free slots; a last record holds the state after the last
frees. Everything must be identical, except the differences listed in ``DIFFERENCES`` (the one place they are
named, each with its reason and the configuration that shows it), which the comparison leaves out, converts
or skips.

The knobs: the timeline is the scenario's; the page size and the eviction interval are the scenario's (the
interval under its ``sglang`` policy, 1 otherwise) unless the caller sets them (the test runs every timeline at
pages of 1, 4 and 16 and intervals of 1 and 128); the miniature runs its model of SGLang's policy
(``sglang``), in SGLang's free order for the page size.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from ..runspec import RunSpec
from ..serving.eviction import EvictionSpec
from ..serving.miniature import MiniatureStack
from ..serving.eviction_driver import StepEnd
from ..serving.pool import PoolExhausted
from ..serving.registry import eviction_policy
from ..serving.scheduler import Scheduler
from ..serving.stack import HybridSWAStack, StackSpec
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
    "eviction policy": "the harness's default policy (tight) frees every running request after every step, to "
                       "the window; SGLang frees when a batch is built, for the requests in that batch only, "
                       "past an interval (decode batches) and not in a request's first decode batch. Compared "
                       "with the miniature's model of SGLang's policy ('sglang'), which frees as SGLang does "
                       "(EvictionPolicy.evicts_at_batch_build, in one group of frees per batch build)",
    "exhausted pool": "when a batch build runs out, the miniature names the SWA pool if it is short (it checks "
                      "that one first); SGLang's allocator returns None without saying which pool was short, and "
                      "the adapter names the one with fewer free slots, so where both are short the two can name "
                      "different pools (found by the differential fuzzer: pages of 1, interval 1, two requests "
                      "in an 11/11 pool). Compared: the step at which each runs out",
    "speculative timelines": "SGLang's schedule here runs no draft worker (spec_prepare_for_decode needs one), "
                             "so timelines with draft_steps are skipped (4 of the library's)",
    "radix tree": "with a prefix cache, where SGLang's UnifiedRadixCache does what the miniature's SWARadixCache "
                  "does not (PREFIX_CACHE_DIFFERENCES, each with the configurations that show it and the first "
                  "step and field that differ there): compared up to that step, pinned there",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class NamedDifference:
    """A way SGLang's radix tree legitimately acts otherwise than the miniature's cache, and where it shows."""

    reason: str
    shows: dict[tuple[str, int, int], str]
    """(library scenario stem, page size, interval) -> the start of ``first_difference`` there ("step N: field"):
    the traces agree before that step, and the difference must show exactly there (a pin: a fix in either
    side, or a new difference before it, fails the test until this table says what changed)"""


PREFIX_CACHE_DIFFERENCES: dict[str, NamedDifference] = {
    "branching insert": NamedDifference(
        reason="a request whose match stopped at the last live SWA window short of its full-KV hit carries "
               "SGLang's swa_branching_seqlen (SWAComponent.finalize_match_result_in_tree_core: the page-aligned "
               "full hit past the SWA boundary); when it finishes, prepare_for_caching_req cuts its insert there, "
               "so only its prefix up to the branching point enters the tree and its own later tokens are freed, "
               "both pools. The miniature's cache inserts the whole page-aligned key",
        shows={("swa_prefix_tombstone_last_leaf", 1, 1): "step -1: mapping",
               ("swa_prefix_tombstone_last_leaf", 4, 1): "step -1: mapping",
               ("swa_prefix_tombstone_last_leaf", 1, 128): "step -1: mapping",
               ("swa_prefix_tombstone_last_leaf", 4, 128): "step -1: mapping",
               ("swa_prefix_match_len_not_reset", 1, 1): "step 10: mapping",
               ("swa_prefix_match_len_not_reset", 4, 1): "step -1: mapping"}),
    "tree eviction under pressure": NamedDifference(
        reason="where a pool runs short, SGLang evicts from the tree inside the allocation of the batch being "
               "built (UnifiedRadixCache.evict_for_alloc, by its components' LRU lists, SWAComponent.evict_component "
               "tombstoning), at the step the first difference names in every configuration below, while the "
               "miniature's cache evicts after each step for the next batch's pages (SWARadixCache.evict: "
               "internal nodes outside every branch's trailing window, then the least recently used leaf); the "
               "two free different nodes, or at another step, so later allocations differ",
        shows={("swa_prefix_multi_turn", 4, 128): "step 19: mapping",
               ("swa_prefix_sglang_pages_of_4", 4, 1): "step 18: mapping",
               ("swa_prefix_sglang_pages_of_4", 1, 128): "step 18: mapping",
               ("swa_prefix_sglang_pages_of_4", 4, 128): "step 17: swa",
               ("swa_prefix_match_len_not_reset", 16, 1): "step 10: full",
               ("swa_prefix_match_len_not_reset", 16, 128): "step 10: full",
               ("swa_prefix_branch_tail_evicted", 1, 1): "step 9: swa",
               ("swa_prefix_branch_tail_evicted", 1, 128): "step 9: swa",
               ("swa_prefix_branch_tail_evicted", 4, 1): "step 9: full",
               ("swa_prefix_branch_tail_evicted", 4, 128): "step 9: full"}),
}


def named_difference(stem: str, *, page_size: int, interval: int) -> tuple[str, str] | None:
    """The named radix-tree difference the library scenario ``stem`` shows at this configuration, with where its
    first difference must start, or None where the traces must agree."""
    for name, difference in PREFIX_CACHE_DIFFERENCES.items():
        if (at := difference.shows.get((stem, page_size, interval))) is not None:
            return name, at
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSlots:
    """What one side did in one step, in the stack's slot numbers."""

    index: int
    kind: str
    full: tuple[int, ...]
    swa: tuple[int, ...]
    input_ids: tuple[int, ...]
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


def comparable_spec(spec: RunSpec, *, page_size: int | None = None, interval: int | None = None) -> RunSpec:
    """``spec`` with the knobs both sides share: SGLang's free order at its page size, and its policy with the
    scenario's interval under the ``sglang`` policy (1 otherwise); ``page_size`` and ``interval`` override the
    scenario's (the test runs every timeline at several)."""
    page = spec.pool.page_size if page_size is None else page_size
    if interval is None:
        interval = spec.eviction.interval if spec.eviction.policy == "sglang" else 1
    return dataclasses.replace(
        spec, pool=dataclasses.replace(spec.pool, page_size=page, free_order=free_order(page)),
        eviction=EvictionSpec(policy="sglang", interval=interval, prefix_cache=spec.eviction.prefix_cache),
    )


def not_expressible(spec: RunSpec, *, page_size: int | None = None, interval: int | None = None) -> str | None:
    """Why SGLang cannot run ``spec``'s timeline through the adapter, or None."""
    spec = comparable_spec(spec, page_size=page_size, interval=interval)
    if spec.timeline.draft_steps:
        return "speculative timelines: SGLang's schedule here runs no draft worker (spec_prepare_for_decode)"
    if problems := spec.pool.problems():
        return f"the miniature refuses this pool at page_size {spec.pool.page_size}: {problems[0]}"
    return unsupported(_stack_spec(spec))


def trace(spec: RunSpec, *, installed: bool, page_size: int | None = None, interval: int | None = None) -> Trace:
    """The timeline of ``spec`` (made comparable) through the miniature's scheduler, allocator and eviction, or
    through SGLang's ``ScheduleBatch`` path over its allocator (``schedule.SGLangScheduler``).

    Each step is recorded once its batch is built (SGLang evicts and allocates there): the batch's slots, the
    mapping and the free lists then, and what left the pools since the previous batch was built (the
    miniature frees after each step, SGLang at the next batch build). A last record holds the state after the
    last step's frees."""
    spec = comparable_spec(spec, page_size=page_size, interval=interval)
    stack_spec = _stack_spec(spec)
    window, page = spec.model.window, spec.pool.page_size
    stack: HybridSWAStack
    if installed:
        from .schedule import SGLangScheduler  # noqa: PLC0415 - publishes SGLang's server args

        stack = SGLangStack.build(stack_spec)
        sched: Any = SGLangScheduler(spec.timeline, stack=stack, vocab_size=spec.model.vocab_size,
                                     eviction=eviction_policy(spec.eviction, window=window, page_size=page))
    else:
        stack = MiniatureStack.build(stack_spec)
        sched = Scheduler(spec.timeline, stack=stack, vocab_size=spec.model.vocab_size,
                          eviction=eviction_policy(spec.eviction, window=window, page_size=page))
    steps: list[StepSlots] = []
    mapping = stack.pool.full_to_swa_index_mapping
    left = StepEnd()

    def state() -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        free = stack.free_slots()
        return tuple(mapping.tolist()), tuple(sorted(free["full"])), tuple(sorted(free["swa"]))

    def record(index: int, kind: str, full: tuple[int, ...], swa: tuple[int, ...], ids: tuple[int, ...],
               seen: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]], gone: StepEnd) -> None:
        steps.append(StepSlots(
            index=index, kind=kind, full=full, swa=swa, input_ids=ids, mapping=seen[0], finished=gone.finished,
            evicted=tuple(sorted((k.rid, k.pos) for k in gone.evicted)), free_full=seen[1], free_swa=seen[2],
        ))

    try:
        while (step := sched.next_step()) is not None:
            full = step.batch.out_cache_loc
            swa, seen = tuple(stack.translate(full).tolist()), state()
            end = sched.finish_step()
            # both free out-of-window slots when a batch is built: the step's own; finished ones the step before
            gone = StepEnd(finished=left.finished, evicted=end.evicted)
            record(step.index, step.kind, tuple(full.tolist()), swa,
                   tuple(step.batch.input_ids.tolist()), seen, gone)
            left = end
        record(-1, "end", (), (), (), state(), StepEnd(finished=left.finished))
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
    if _exhaustion_step(miniature) != _exhaustion_step(sglang):
        return f"pool exhaustion differs: miniature {miniature.exhausted}, SGLang {sglang.exhausted}"
    return None


def _exhaustion_step(trace: Trace) -> str | None:
    # the step, not the pool named (DIFFERENCES: "exhausted pool")
    return None if trace.exhausted is None else trace.exhausted.rpartition(" at step ")[2]


def _stack_spec(spec: RunSpec) -> StackSpec:
    # slot bookkeeping only: one KV head of one element per layer keeps the pools tiny
    return StackSpec(pool=spec.pool, layer_is_swa=tuple(spec.model.layer_is_swa), num_kv_heads=1, head_dim=1,
                     device="cpu", poison_freed=False)


def _short(value: object) -> str:
    if isinstance(value, tuple) and len(value) > 12:
        return f"{value[:12]}... ({len(value)} items)"
    return repr(value)

"""The SWA prefix cache: what it keeps of a finished request, what a prompt matches, what cache pressure
gives up first, and how the scheduler admits a request on a cached prefix."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.check.drive import execute
from harness.runspec import RunSpec
from harness.serving.eviction import EvictionSpec, TightEviction
from harness.serving.invariants import pool_violations
from harness.serving.miniature import MiniatureStack
from harness.serving.model import model_spec
from harness.serving.pool import PoolSpec
from harness.serving.prefix_cache import SWARadixCache
from harness.serving.scheduler import Scheduler
from harness.serving.stack import StackSpec
from harness.serving.timeline import RequestSpec, TimelineSpec, request_tokens

W = 8  # a query reads 8 keys: a match needs 7 live SWA tokens before its end


def _stack(page_size: int = 1, full: int = 128, swa: int = 128) -> MiniatureStack:
    return MiniatureStack.build(StackSpec(pool=PoolSpec(full_size=full, swa_size=swa, page_size=page_size),
                                          layer_is_swa=(), num_kv_heads=1, head_dim=1, poison_freed=False))


def _cache(stack: MiniatureStack, faults=()) -> SWARadixCache:
    cache = SWARadixCache(stack, window=W, page_size=stack.page_size, faults=faults)
    stack.hold_prefix_cache(cache)
    return cache


def _run(stack: MiniatureStack, n: int, evicted: int = 0) -> list[int]:
    """The full slots of a request that computed ``n`` tokens and freed the SWA slots of the first ``evicted``."""
    slots = stack.alloc_extend(prefix_lens=[0], extend_lens=[n], last_locs=[0])
    if evicted:
        stack.free_swa(slots[:evicted])
    return slots.tolist()


def _finish(cache: SWARadixCache, stack: MiniatureStack, tokens: list[int], evicted: int = 0) -> list[int]:
    """A request that matched nothing, ran ``tokens`` and finished: cached, its unaligned tail freed."""
    slots = _run(stack, len(tokens), evicted)
    kept = cache.insert(tokens, slots, cached_len=0, swa_evicted=evicted)
    if kept.length < len(slots):
        stack.free(torch.tensor(slots[kept.length:]))
    return slots


A = list(range(100, 124))  # a's 24 tokens


def _violations(stack: MiniatureStack) -> list[str]:
    return [str(v) for v in stack.invariant_violations([])]


def test_a_finished_request_is_cached_with_its_evicted_swa_part_tombstoned():
    stack = _stack()
    cache = _cache(stack)
    slots = _finish(cache, stack, A, evicted=16)
    cached = cache.cached_tokens()
    assert [t.full_slot for t in cached] == slots
    assert [t.tombstoned for t in cached] == [True] * 16 + [False] * 8
    assert all(t.swa_slot == 0 for t in cached[:16]) and all(t.swa_slot > 0 for t in cached[16:])
    free_full = stack.free_slots()["full"]
    assert not set(slots) & free_full
    assert _violations(stack) == []


@pytest.mark.parametrize("prompt, matched", [
    (A + [7], 24),    # 16..23 are live: 8 >= 7 before the end
    (A[:23], 23),     # 16..22: exactly 7
    (A[:22], 0),      # 16..21: 6, not a full window; nothing before the tombstone either
])
def test_a_prompt_matches_only_where_a_full_window_of_live_swa_precedes_the_end(prompt, matched):
    stack = _stack()
    cache = _cache(stack)
    slots = _finish(cache, stack, A, evicted=16)
    match = cache.match(prompt, holder="b")
    assert match.length == matched
    assert list(match.slots[:matched]) == slots[:matched]


def test_a_path_without_tombstones_matches_at_any_length():
    stack = _stack()
    cache = _cache(stack)
    _finish(cache, stack, A[:10])
    assert cache.match(A[:3], holder="b").length == 3


def _two_tombstones(cache: SWARadixCache, stack: MiniatureStack) -> list[int]:
    """a's branch: 0..15 tombstoned, 16..19 live; c's continuation from 20: 20..25 tombstoned, 26..33 live."""
    _finish(cache, stack, A, evicted=16)
    c = A[:20] + list(range(200, 214))
    _finish(cache, stack, c, evicted=26)
    return c


def test_the_live_count_restarts_at_every_tombstone():
    stack = _stack()
    cache = _cache(stack)
    c = _two_tombstones(cache, stack)
    # 4 live tokens (16..19), a tombstone, 4 more (26..29): no full window anywhere before 30
    assert cache.match(c[:30] + [9], holder="d").length == 0


def test_without_the_reset_a_short_run_counts_towards_the_next_window():
    stack = _stack()
    cache = _cache(stack, faults={"match_len_not_reset"})
    c = _two_tombstones(cache, stack)
    match = cache.match(c[:30] + [9], holder="d")
    assert match.length == 30
    # d's first query would read 23..29, and 23..25 are tombstoned: the window invariant names 23 first
    found = stack.invariant_violations([])
    assert [(v.invariant, v.slot) for v in found][:1] == [("window", match.slots[23])]


def test_matches_and_inserts_are_page_aligned():
    stack = _stack(page_size=4)
    cache = _cache(stack)
    _finish(cache, stack, A + [1, 2])  # 26 tokens: the partial page 24..25 is not cached
    assert len(cache.cached_tokens()) == 24
    assert cache.match(A[:22] + [1] * 6, holder="b").length == 20  # diverging inside a page: that page is not shared
    assert cache.match(A[:23], holder="c").length == 20


def test_deleting_a_leaf_takes_the_parents_it_leaves_unmatchable():
    stack = _stack()
    cache = _cache(stack)
    slots = _finish(cache, stack, A, evicted=16)
    assert cache.evict("full_size")
    # 16..23 went first; 0..15, all tombstone, would be a leaf no match can end in: it goes too
    assert cache.cached_tokens() == [] and _violations(stack) == []
    assert set(slots) <= stack.free_slots()["full"]


def test_a_locked_prefix_is_never_evicted_and_goes_once_released():
    stack = _stack()
    cache = _cache(stack)
    slots = _finish(cache, stack, A[:10])
    match = cache.match(A[:10], holder="b")
    assert not cache.evict("full_size") and not cache.evict("swa_size")
    cache.release(match)
    assert cache.evict("full_size")
    free_full, free_swa = stack.free_slots()["full"], stack.free_slots()["swa"]
    assert set(slots) <= free_full and cache.cached_tokens() == []


def test_an_insert_revives_a_tombstone_where_the_request_still_holds_live_swa():
    stack = _stack()
    cache = _cache(stack)
    _finish(cache, stack, A, evicted=16)
    r = A + list(range(300, 308))
    mine = _run(stack, len(r), evicted=8)
    cache.insert(r, mine, cached_len=0, swa_evicted=8)
    cached = cache.cached_tokens()
    assert [t.tombstoned for t in cached] == [True] * 8 + [False] * 24
    assert [t.full_slot for t in cached[8:16]] == mine[8:16]  # the request's live copy replaced the tombstone
    assert _violations(stack) == []


def _idle_branch(cache: SWARadixCache, stack: MiniatureStack) -> None:
    """a cached (0..15 tombstoned, 16..23 live), c's 5 more tokens after it: 17..23 is c's trailing window."""
    _finish(cache, stack, A, evicted=16)
    _finish(cache, stack, A + [1, 2, 3, 4, 5], evicted=24)


def test_swa_pressure_gives_up_a_branchs_trailing_window_last():
    stack = _stack()
    cache = _cache(stack)
    _idle_branch(cache, stack)
    assert cache.evict("swa_size")
    # no node outside a trailing window could go, so c's leaf went whole; a's branch still ends live
    assert [t.pos for t in cache.cached_tokens()] == list(range(24))
    assert _violations(stack) == []
    assert cache.match(A + [9], holder="f").length == 24


def test_plain_lru_swa_pressure_leaves_the_idle_branch_unmatchable():
    stack = _stack()
    cache = _cache(stack, faults={"evict_branch_tail_first"})
    _idle_branch(cache, stack)
    assert cache.evict("swa_size")
    assert [v.invariant for v in stack.invariant_violations([])] == ["unmatchable"]
    assert cache.match(A + [1, 2, 3, 4, 5], holder="f").length == 0


def test_swa_pressure_tombstones_the_least_recently_used_node_outside_every_trailing_window():
    stack = _stack()
    cache = _cache(stack)
    _finish(cache, stack, A)                                   # 0..23
    _finish(cache, stack, A[:16] + list(range(400, 414)))      # 16..29 on another branch from 16
    assert cache.evict("swa_size")
    cached = cache.cached_tokens()
    assert {t.pos for t in cached if t.tombstoned} == set(range(16))  # the shared 0..15: in no trailing window
    assert _violations(stack) == []
    assert cache.evict("swa_size")  # nothing else outside a trailing window: the older leaf (16..23) goes
    assert sorted(t.pos for t in cache.cached_tokens() if t.pos >= 16) == list(range(16, 30))


def test_the_invariants_let_live_tokens_share_the_caches_slots_and_nothing_else():
    stack = _stack()
    cache = _cache(stack)
    slots = _finish(cache, stack, A[:10])
    swa = stack.translate(torch.tensor(slots)).tolist()
    from harness.serving.timeline import LiveToken

    def live(rid, pos, *, shared):
        return LiveToken(rid=rid, pos=pos, slots=(slots[pos], swa[pos]), in_window=True, shared=shared)

    assert stack.invariant_violations([live("b", 3, shared=True), live("c", 3, shared=True)]) == []
    found = stack.invariant_violations([live("b", 3, shared=False)])
    assert {(v.invariant, v.slot) for v in found} == {("owned_twice", slots[3]), ("owned_twice", swa[3])}
    assert "cache@3" in found[0].detail and "b@3" in found[0].detail
    stack.allocator._full.give_back([slots[5]])  # the cache's slot handed back behind its back
    assert [(v.invariant, v.slot) for v in stack.invariant_violations([])] == [("free_but_owned", slots[5])]


def test_a_cached_token_marked_live_must_hold_an_swa_slot():
    stack = _stack()
    cache = _cache(stack)
    slots = _run(stack, 12, evicted=5)
    cache.insert(A[:12], slots, cached_len=0, swa_evicted=0)  # the insert is not told what was freed
    found = stack.invariant_violations([])
    assert [(v.invariant, v.slot) for v in found] == [("tombstone", s) for s in slots[:5]]


def test_tight_eviction_keeps_a_page_rounded_window_with_prefix_sharing():
    from harness.serving.eviction import RequestWindow

    shared = TightEviction(EvictionSpec(prefix_cache=True), window=W, page_size=16)
    plain = TightEviction(EvictionSpec(), window=W, page_size=16)
    req = RequestWindow(seq_len=40, swa_evicted=16, prefilling=True, decoded=0)
    assert plain.frontier(req) == 32   # the window's start floored: the whole page-aligned 0..31 freed
    assert shared.frontier(req) == 16  # a page past the window kept: 16..31 stays live for the cache
    at_one = [TightEviction(EvictionSpec(prefix_cache=s), window=W).frontier(dataclasses.replace(req, swa_evicted=0))
              for s in (True, False)]
    assert at_one[0] == at_one[1] == 33


# ---- the scheduler ---------------------------------------------------------------------------------------------
TURNS = TimelineSpec(requests=(
    RequestSpec(rid="a", prompt_len=12, output_len=6),
    RequestSpec(rid="b", arrive=7, prompt_len=26, output_len=5, prefix_of="a", shared_len=18),
), seed=5)


def _scheduler(timeline: TimelineSpec = TURNS, *, prefix_cache: bool = True) -> tuple[Scheduler, MiniatureStack]:
    stack = _stack()
    policy = TightEviction(EvictionSpec(prefix_cache=prefix_cache), window=W)
    return Scheduler(timeline, stack=stack, eviction=policy, vocab_size=256), stack


def test_a_request_with_prefix_of_starts_with_the_shared_tokens_and_no_other_stream_changes():
    tokens = request_tokens(TURNS, 256)
    assert torch.equal(tokens["b"][:18], tokens["a"][:18]) and not torch.equal(tokens["b"][:19], tokens["a"][:19])
    alone = dataclasses.replace(TURNS, requests=(TURNS.requests[0], dataclasses.replace(
        TURNS.requests[1], prefix_of=None, shared_len=0)))
    unshared = request_tokens(alone, 256)
    assert torch.equal(tokens["a"], unshared["a"]) and torch.equal(tokens["b"][18:], unshared["b"][18:])


def test_a_matched_request_extends_after_its_prefix_reading_the_caches_slots():
    sched, stack = _scheduler()
    a_slots = None
    while (step := sched.next_step()) is not None:
        if step.index == 6:
            a_slots = list(sched._running[0].slots)
        if step.index == 7:
            batch = step.batch
            assert batch.extend_prefix_lens.tolist() == [18] and batch.extend_seq_lens.tolist() == [8]
            row = int(batch.req_pool_indices[0])
            assert stack.req_to_token_pool.req_to_token[row, :18].tolist() == a_slots
            assert not set(batch.out_cache_loc.tolist()) & set(a_slots)
        sched.finish_step()
        assert stack.invariant_violations(sched.live_tokens()) == [], step.index
    assert a_slots is not None


def test_an_aborted_request_frees_only_what_it_owns():
    timeline = dataclasses.replace(TURNS, requests=(TURNS.requests[0], dataclasses.replace(TURNS.requests[1], abort=9)))
    sched, stack = _scheduler(timeline)
    while (step := sched.next_step()) is not None:
        sched.finish_step()
        assert stack.invariant_violations(sched.live_tokens()) == [], step.index
    assert [t.pos for t in sched.cache.cached_tokens()] == list(range(18))
    free_full = stack.free_slots()["full"]
    assert not {t.full_slot for t in sched.cache.cached_tokens()} & free_full


def test_a_request_on_a_cached_prefix_computes_what_it_computes_without_the_cache():
    spec = RunSpec(model=model_spec("gpt-oss-mini"), pool=PoolSpec(full_size=96, swa_size=48),
                   timeline=TURNS, eviction=EvictionSpec(prefix_cache=True))

    def hidden(run: RunSpec) -> dict[tuple[str, int], torch.Tensor]:
        result = execute(run)
        assert result.error is None and result.breach is None
        return {(k.rid, k.pos): row for s in result.snapshots for k, row in zip(s.hidden_owners, s.hidden)}

    cached, computed = hidden(spec), hidden(dataclasses.replace(spec, eviction=EvictionSpec()))
    assert ("b", 17) in computed and ("b", 17) not in cached  # b's first 18 tokens came from the cache
    assert ("b", 18) in cached
    for key, row in cached.items():
        assert torch.equal(row, computed[key]), key

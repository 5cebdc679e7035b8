"""SGLang's real radix tree under the target: its holdings as the pool invariants read them, and the fault on its
match validator (``sglang_match_len_not_reset``) on a tree built through its own insert."""

from array import array

import torch

from harness.serving.eviction import EvictionSpec
from harness.serving.invariants import pool_violations
from harness.serving.pool import PoolSpec
from harness.serving.registry import eviction_policy
from harness.serving.stack import StackSpec
from harness.serving.timeline import RequestSpec, TimelineSpec

WINDOW = 8  # sliding_window_size 7


def _scheduler(timeline, *, full_size=65, swa_size=33):
    from harness.sglang.schedule import own_scheduler
    from harness.sglang.stack import SGLangStack

    stack = SGLangStack.build(StackSpec(pool=PoolSpec(full_size=full_size, swa_size=swa_size, free_order="fifo"),
                                        layer_is_swa=(False, True), num_kv_heads=1, head_dim=1, poison_freed=False))
    policy = eviction_policy(EvictionSpec(policy="sglang", interval=1, prefix_cache=True), window=WINDOW)
    return stack, own_scheduler(stack, timeline, eviction=policy, vocab_size=64, faults=frozenset())


TURNS = TimelineSpec(requests=(
    RequestSpec(rid="a", prompt_len=8, output_len=12),
    RequestSpec(rid="b", arrive=14, prompt_len=24, output_len=2, prefix_of="a", shared_len=20)))


def test_a_prefix_cache_run_is_driven_by_sglangs_schedule_and_its_invariants_read_the_real_tree():
    from harness.sglang.radix_holdings import RadixHoldings
    from harness.sglang.schedule import SGLangScheduler

    stack, sched = _scheduler(TURNS)
    assert isinstance(sched, SGLangScheduler) and isinstance(stack._prefix_cache, RadixHoldings)
    seen_tombstone = seen_shared = False
    while (step := sched.next_step()) is not None:
        assert stack.invariant_violations(sched.live_tokens()) == [], step.index
        sched.finish_step()
        live = sched.live_tokens()
        assert stack.invariant_violations(live) == [], step.index
        cached = stack._prefix_cache.cached_tokens()
        seen_tombstone |= any(c.tombstoned and c.swa_slot == 0 for c in cached)
        seen_shared |= any(t.shared for t in live)
    # a's turn went into the tree with its evicted part tombstoned, and b ran on it (its matched tokens shared)
    assert seen_tombstone and seen_shared
    cached = stack._prefix_cache.cached_tokens()
    assert sorted({c.pos for c in cached}) == list(range(len({c.pos for c in cached})))
    assert all(c.trailing_of for c in cached[-(WINDOW - 1):])


def test_an_swa_slot_freed_behind_the_trees_back_is_named_by_the_tombstone_invariant():
    stack, sched = _scheduler(TURNS)
    while sched.next_step() is not None:
        sched.finish_step()
    live = [c for c in stack._prefix_cache.cached_tokens() if not c.tombstoned]
    victim = live[-1]
    stack.allocator.free_swa(torch.tensor([victim.full_slot], dtype=torch.int64))
    found = [v for v in stack.invariant_violations(sched.live_tokens()) if v.invariant == "tombstone"]
    assert [v.slot for v in found] == [victim.full_slot]
    assert f"cache@{victim.pos} is cached as live" in found[0].detail


def _tree_with_a_short_live_run_between_tombstones():
    """A real tree through SGLang's own insert, as checkpoint_into_tree calls it: 0..19 with 0..15 evicted,
    then 0..33 with 20..25 evicted: tombstone 0..15, 4 live (16..19), tombstone 20..25, live 26..33."""
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    stack, sched = _scheduler(TimelineSpec(requests=(RequestSpec(rid="x", prompt_len=2, output_len=1),)),
                              full_size=129, swa_size=65)
    tree, alloc = sched.tree_cache, stack.allocator
    tokens = list(range(100, 140))
    slots = alloc.alloc(34).to(torch.int64)
    for lo, hi in ((0, 16), (20, 26)):  # what each inserting request had already freed of its SWA KV
        alloc.free_swa(slots[lo:hi])
    for length, evicted, prev in ((20, 16, 0), (34, 26, 20)):
        params = InsertParams(key=RadixKey(array("q", tokens[:length])), value=slots[:length].clone(),
                              prev_prefix_len=prev)
        params.set_evicted_seqlen(ComponentType.SWA, evicted)
        tree.insert(params)

    def match(n: int) -> int:
        return tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens[:n] + [1, 2])))).device_prefix_len

    return stack, sched, match


def test_match_len_not_reset_lets_a_match_end_with_tombstones_in_its_window_on_the_real_tree():
    from harness.sglang.faults import match_len_not_reset

    _, _, match = _tree_with_a_short_live_run_between_tombstones()
    assert match(29) == 0  # as installed: 3 live tokens since the tombstone at 20..25 are no window
    with match_len_not_reset():
        assert match(29) == 29  # the 4 live tokens before that tombstone count too
    assert match(29) == 0


def test_the_window_invariant_names_the_tombstones_a_faulty_match_reads():
    from harness.sglang.faults import match_len_not_reset
    from harness.sglang.radix_holdings import RadixHoldings, Reader
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    stack, sched, _ = _tree_with_a_short_live_run_between_tombstones()
    key = RadixKey(array("q", list(range(100, 129)) + [1, 2]))
    with match_len_not_reset():
        end = sched.tree_cache.match_prefix(MatchPrefixParams(key=key)).last_device_node
    holdings = RadixHoldings(tree_cache=sched.tree_cache, translate=stack.translate,
                             readers=lambda: [Reader(rid="d", node_id=end)])
    found = pool_violations([], groups=stack.groups, free=stack.free_slots(), cached=holdings.cached_tokens())
    window = [v for v in found if v.invariant == "window"]
    assert [v.detail.split(" ")[0] for v in window] == ["cache@22", "cache@23", "cache@24", "cache@25"]


def _drive(timeline, *, page_size):
    from harness.sglang.schedule import own_scheduler
    from harness.sglang.stack import SGLangStack

    stack = SGLangStack.build(StackSpec(pool=PoolSpec(full_size=257, swa_size=129, page_size=page_size,
                                                      free_order="fifo" if page_size == 1 else "lifo"),
                                        layer_is_swa=(False, True), num_kv_heads=1, head_dim=1, poison_freed=False))
    policy = eviction_policy(EvictionSpec(policy="sglang", interval=1, prefix_cache=True), window=WINDOW,
                             page_size=page_size)
    sched = own_scheduler(stack, timeline, eviction=policy, vocab_size=64, faults=frozenset())
    out = []
    while (step := sched.next_step()) is not None:
        out.append((tuple(step.batch.out_cache_loc.tolist()), tuple(stack.translate(step.batch.out_cache_loc).tolist())))
        sched.finish_step()
    return out


CHUNKED = TimelineSpec(requests=(RequestSpec(rid="r", prompt_len=48, output_len=3),), chunk_size=20)


def test_frontier_in_tokens_stops_at_the_trees_page_alignment_assert_at_pages_and_changes_nothing_at_page_1():
    import pytest

    from harness.sglang.faults import frontier_in_tokens

    clean = _drive(CHUNKED, page_size=16)
    with frontier_in_tokens(), pytest.raises(AssertionError, match="must be page-aligned, window_start=12"):
        _drive(CHUNKED, page_size=16)
    assert _drive(CHUNKED, page_size=16) == clean
    unpaged = _drive(CHUNKED, page_size=1)
    with frontier_in_tokens():
        assert _drive(CHUNKED, page_size=1) == unpaged

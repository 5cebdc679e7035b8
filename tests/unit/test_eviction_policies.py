"""Eviction policies decide what leaves the SWA window and when it is freed; SGLang's policy is modelled
in the harness's units (a window of W keys is SGLang's sliding_window_size W - 1)."""

from __future__ import annotations

import pytest

from harness.serving.eviction import EvictionSpec, RequestWindow, SGLangEviction, TightEviction
from harness.serving.pool import FreeList


def _req(seq_len, evicted=0, *, prefilling=False, decoded=3):
    return RequestWindow(seq_len=seq_len, swa_evicted=evicted, prefilling=prefilling, decoded=decoded)


def test_the_window_starts_w_minus_one_keys_before_the_next_query():
    policy = TightEviction(window=4)
    assert [policy.window_start(n) for n in (0, 3, 4, 10)] == [0, 0, 1, 7]


def test_tight_frees_exactly_what_left_the_window_every_step():
    policy = TightEviction(window=4)
    assert policy.frontier(_req(10, 5)) == 7
    assert policy.frontier(_req(10, 8)) == 8  # never backwards
    assert policy.frontier(_req(10, 5, prefilling=True, decoded=0)) == 7


def test_sglang_frontier_equals_tight_with_interval_one_and_pages_of_one():
    sglang = SGLangEviction(EvictionSpec(policy="sglang", interval=1), window=4)
    tight = TightEviction(window=4)
    for seq_len in range(4, 30):
        assert sglang.frontier(_req(seq_len, seq_len - 4)) == tight.frontier(_req(seq_len, seq_len - 4))


def test_sglang_waits_for_the_eviction_interval():
    policy = SGLangEviction(EvictionSpec(policy="sglang", interval=8), window=4)
    # the frontier seq_len - 3 must reach evicted + 8 before anything is freed
    assert policy.frontier(_req(10, 0)) == 0
    assert policy.frontier(_req(11, 0)) == 8
    assert policy.frontier(_req(18, 8)) == 8
    assert policy.frontier(_req(19, 8)) == 16


def test_sglang_floors_the_frontier_to_a_page_and_keeps_a_page_with_prefix_sharing():
    spec = EvictionSpec(policy="sglang", interval=1)
    assert SGLangEviction(spec, window=4, page_size=4).frontier(_req(14, 0)) == 8  # 14 - 3 = 11 -> page 8
    shared = SGLangEviction(spec, window=4, page_size=4, prefix_sharing=True)
    assert shared.frontier(_req(14, 0)) == 8  # keeps ceil_align(max(3, 4), 4) = 4 tokens: 10 -> page 8
    assert shared.frontier(_req(13, 0)) == 8
    assert shared.frontier(_req(11, 0)) == 4


def test_sglang_never_frees_before_the_first_decode_batch_nor_mid_prefill_with_prefix_sharing():
    spec = EvictionSpec(policy="sglang", interval=1)
    plain, shared = SGLangEviction(spec, window=4), SGLangEviction(spec, window=4, prefix_sharing=True)
    assert plain.frontier(_req(12, 0, prefilling=False, decoded=0)) == 0  # next batch: its first decode
    assert plain.frontier(_req(12, 0, prefilling=True, decoded=0)) == 9   # chunked prefill frees ...
    assert shared.frontier(_req(12, 0, prefilling=True, decoded=0)) == 0  # ... unless a prefix cache shares it
    assert plain.frontier(_req(12, 0, decoded=1)) == 9


@pytest.mark.parametrize("order, reused", [("lowest", [2, 3, 5]), ("fifo", [2, 5, 3]), ("lifo", [3, 5, 2])])
def test_free_order_decides_which_freed_slot_is_reused_first(order, reused):
    free = FreeList(6, "pool", "size", order=order)
    assert free.take(5) == [1, 2, 3, 4, 5]
    free.give_back([2])
    free.give_back([5])
    free.give_back([3])
    assert free.take(3) == reused


def test_an_interval_out_of_bounds_is_a_problem():
    assert EvictionSpec(interval=0).problems() == ["interval: expected an integer from 1 to 1048576, got 0"]


def test_sglang_frees_chunked_prefill_at_an_interval_of_one_where_decode_waits_for_it():
    # SGLANG_SWA_EVICTION_INTERVAL gates decode batches only (ScheduleBatch.maybe_evict_swa)
    policy = SGLangEviction(EvictionSpec(policy="sglang", interval=8), window=4)
    assert policy.frontier(_req(10, 4, prefilling=True, decoded=0)) == 7
    assert policy.frontier(_req(10, 4, decoded=3)) == 4


def test_sglang_frees_at_batch_build_and_tight_after_every_step():
    assert SGLangEviction.evicts_at_batch_build and not TightEviction.evicts_at_batch_build


@pytest.mark.parametrize("order, reused", [("lowest", [2, 3, 5]), ("fifo", [2, 5, 3]), ("lifo", [2, 5, 3])])
def test_a_group_of_frees_goes_back_in_one_give_back_in_call_order(order, reused):
    # SGLang's free_group_end frees the group's concatenation at once: with pages (lifo) the group heads the
    # free list in call order, where three separate frees would reverse it
    free = FreeList(6, "pool", "size", order=order)
    assert free.take(5) == [1, 2, 3, 4, 5]
    free.hold()
    free.give_back([2])
    free.give_back([5])
    free.give_back([3])
    assert len(free) == 0  # held until the group ends
    free.release_held()
    assert free.take(3) == reused

"""Pages: both pools allocated in lockstep page by page, a request continuing its last page, the dummy page
never handed out, and a page given back only when its last slot is freed."""

from __future__ import annotations

import pytest
import torch

from harness.serving.eviction import RequestWindow, TightEviction
from harness.serving.miniature import MiniatureStack
from harness.serving.pool import PoolSpec
from harness.serving.stack import StackSpec


def _stack(page_size=4, full=32, swa=16, order="lowest") -> MiniatureStack:
    spec = PoolSpec(full_size=full, swa_size=swa, page_size=page_size, free_order=order)
    return MiniatureStack.build(StackSpec(pool=spec, layer_is_swa=(True, False), num_kv_heads=1, head_dim=2))


def test_a_prompt_takes_whole_pages_after_the_dummy_page_in_both_pools():
    stack = _stack()
    slots = stack.alloc_extend(prefix_lens=[0], extend_lens=[6], last_locs=[0])
    assert slots.tolist() == [4, 5, 6, 7, 8, 9]
    assert stack.translate(slots).tolist() == [4, 5, 6, 7, 8, 9]
    assert stack.allocator.available_size() == (32 - 4 - 8, 16 - 4 - 8)


def test_the_next_tokens_continue_the_last_page_then_open_a_new_one_in_lockstep():
    stack = _stack()
    a = stack.alloc_extend(prefix_lens=[0], extend_lens=[3], last_locs=[0])      # page 1
    b = stack.alloc_extend(prefix_lens=[0], extend_lens=[2], last_locs=[0])      # page 2
    more = stack.alloc_extend(prefix_lens=[3, 2], extend_lens=[2, 1], last_locs=[int(a[-1]), int(b[-1])])
    assert more.tolist() == [7, 12, 10]  # a fills page 1, then opens page 3; b continues page 2
    swa = stack.translate(more).tolist()
    assert [s % 4 for s in swa] == [s % 4 for s in more.tolist()], "in-page offsets differ between the pools"
    assert swa[1] // 4 not in (1, 2), "a's new page must be a fresh SWA page"


def test_freeing_any_slot_of_a_page_frees_the_whole_page_as_sglang_does():
    stack = _stack()
    slots = stack.alloc_extend(prefix_lens=[0], extend_lens=[8], last_locs=[0])   # pages 1 and 2
    _, swa_before = stack.allocator.available_size()
    stack.free_swa(slots[:1])
    assert stack.allocator.available_size()[1] == swa_before + 4
    assert {4, 5, 6, 7} <= stack.free_slots()["swa"]
    # the mapping forgets only the slot named: tokens 1 .. 3 now point into a free page, which is why
    # frontiers are floored to a page (the pool invariants name it: free_but_owned)
    assert stack.translate(slots).tolist() == [0, 5, 6, 7, 8, 9, 10, 11]


def test_the_tight_frontier_frees_whole_pages_only():
    policy = TightEviction(window=4, page_size=4)
    assert [policy.frontier(RequestWindow(seq_len=n, swa_evicted=0, prefilling=False, decoded=1))
            for n in (6, 7, 10, 11, 14)] == [0, 4, 4, 8, 8]


def test_the_dummy_page_stays_zero_and_every_other_slot_is_poisoned():
    stack = _stack()
    stack.poison()
    buf = stack.pool.swa_k_buffer[0]
    assert torch.equal(buf[:4], torch.zeros_like(buf[:4]))
    assert torch.isnan(buf[4:]).all()


def test_freed_pages_are_reused_in_the_pools_free_order():
    # pages 1 and 2 freed in that order, then one page taken: the next page is 2 (lowest), 5 (fifo: the
    # never-used pages 4 .. 7 queue first) or 1 (lifo: the last freed was taken)
    for order, expected in (("lowest", 8), ("fifo", 20), ("lifo", 4)):
        stack = _stack(order=order)
        pages = [stack.alloc_extend(prefix_lens=[0], extend_lens=[4], last_locs=[0]) for _ in range(3)]
        stack.free(pages[0])  # page 1
        stack.free(pages[1])  # page 2
        stack.alloc_extend(prefix_lens=[0], extend_lens=[4], last_locs=[0])  # takes one page
        nxt = stack.alloc_extend(prefix_lens=[0], extend_lens=[1], last_locs=[0])
        assert int(nxt[0]) == expected, order


def test_a_pool_that_is_not_a_multiple_of_the_page_hands_out_its_whole_pages_only():
    # SGLang takes any pool size; its allocator has size // page_size pages (the trailing part is no slot)
    from harness.serving.allocator import SWATokenToKVPoolAllocator
    from harness.serving.pool import HybridSWAKVPool, PoolExhausted, PoolSpec

    spec = PoolSpec(full_size=37, swa_size=35, page_size=16)
    assert spec.problems() == []
    allocator = SWATokenToKVPoolAllocator(HybridSWAKVPool(spec=spec, layer_is_swa=(False, True), num_kv_heads=1,
                                                          head_dim=1))
    assert allocator.alloc(16).tolist() == list(range(16, 32))
    with pytest.raises(PoolExhausted):
        allocator.alloc(1)


def test_a_finished_row_is_freed_in_sglangs_two_segments_so_its_live_pages_are_reused_first():
    # free_kv_row_segments: the evicted run (full side only), then the rest; with pages each goes to the head
    from harness.serving.allocator import SWATokenToKVPoolAllocator
    from harness.serving.pool import HybridSWAKVPool

    spec = PoolSpec(full_size=32, swa_size=32, page_size=4, free_order="lifo")
    allocator = SWATokenToKVPoolAllocator(HybridSWAKVPool(spec=spec, layer_is_swa=(False, True), num_kv_heads=1,
                                                          head_dim=1))
    row = allocator.alloc(8)  # full pages 1 and 2
    assert row.tolist() == list(range(4, 12))
    allocator.free_swa(row[:4])  # page 1 left the window
    allocator.free(row)
    assert allocator.alloc(4).tolist() == list(range(8, 12))  # the live page 2 heads the list, then page 1

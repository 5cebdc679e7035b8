"""A finding against SGLang 0.5.23 (docs/findings.md): with pages, SWATokenToKVPoolAllocator.alloc_decode takes
the full pages first and returns None without giving them back when the SWA side has none; alloc_extend checks
both sides before it allocates. A scenario file cannot hold it (the load-time dry run refuses a pool the
timeline exhausts), so it is reproduced here, on the allocator and through SGLang's own schedule."""

import pytest
import torch

from harness.serving.eviction import EvictionSpec
from harness.serving.pool import PoolExhausted, PoolSpec
from harness.serving.registry import eviction_policy
from harness.serving.stack import StackSpec
from harness.serving.timeline import RequestSpec, TimelineSpec

# pages of 4: the full pool has 15 pages past the dummy one, the SWA pool 2
POOL = PoolSpec(full_size=64, swa_size=12, page_size=4, free_order="lifo")


def _stack():
    from harness.sglang.stack import SGLangStack

    return SGLangStack.build(StackSpec(pool=POOL, layer_is_swa=(False, True), num_kv_heads=1, head_dim=1,
                                       poison_freed=False))


def _two_full_pages_prefilled():
    stack = _stack()
    slots = stack.alloc_extend(prefix_lens=[0, 0], extend_lens=[4, 4], last_locs=[0, 0])
    assert stack.allocator.full_available_size() == 52 and stack.allocator.swa_available_size() == 0
    return stack, slots


def test_alloc_decode_keeps_the_full_pages_it_took_when_the_swa_side_has_none():
    stack, slots = _two_full_pages_prefilled()
    seq = torch.tensor([5, 5])
    assert stack.allocator.alloc_decode(seq, seq, torch.tensor([int(slots[3]), int(slots[7])])) is None
    assert stack.allocator.full_available_size() == 44  # two full pages gone, owned by no token


def test_alloc_extend_takes_nothing_when_the_swa_side_is_short():
    stack, slots = _two_full_pages_prefilled()
    pre, seq = torch.tensor([4, 4]), torch.tensor([5, 5])
    assert stack.allocator.alloc_extend(pre, pre, seq, seq, torch.tensor([int(slots[3]), int(slots[7])]), 2) is None
    assert stack.allocator.full_available_size() == 52


def test_sglangs_schedule_reaches_it_and_the_run_names_the_kept_slots():
    from harness.sglang.schedule import SGLangScheduler

    stack = _stack()
    timeline = TimelineSpec(requests=(RequestSpec(rid="a", prompt_len=4, output_len=2),
                                      RequestSpec(rid="b", prompt_len=4, output_len=2)))
    sched = SGLangScheduler(timeline, stack=stack, vocab_size=64,
                            eviction=eviction_policy(EvictionSpec(policy="sglang", interval=1), window=8, page_size=4))
    assert sched.next_step().kind == "extend"
    sched.finish_step()
    with pytest.raises(PoolExhausted, match=r"kept 8 full slots \(full free 52 -> 44, SWA free 0\)"):
        sched.next_step()

"""The SGLang serving stack: the harness's view is the installed pool's memory, and runs go through it."""

import pytest

from harness.check.drive import execute
from harness.check.verdict import judge
from harness.runspec import RunSpec
from harness.serving.eviction import EvictionSpec
from harness.serving.model import model_spec
from harness.serving.pool import PoolSpec
from harness.serving.stack import StackSpec
from harness.serving.timeline import RequestSpec, TimelineSpec
from harness.sglang.library import INSTALLED_EVICTION
from harness.sglang.stack import SGLangStack


def _stack(page_size: int = 1) -> SGLangStack:
    return SGLangStack.build(StackSpec(
        pool=PoolSpec(full_size=32, swa_size=16, page_size=page_size, free_order="fifo" if page_size == 1 else "lifo"),
        layer_is_swa=(True, False, True), num_kv_heads=2, head_dim=4))


def test_the_views_buffers_and_mapping_are_the_installed_pools_own():
    stack = _stack()
    full, swa = stack.kv_pool.full_kv_pool, stack.kv_pool.swa_kv_pool
    assert [b.data_ptr() for b in stack.pool.swa_k_buffer] == [b.data_ptr() for b in swa.k_buffer]
    assert [b.data_ptr() for b in stack.pool.full_v_buffer] == [b.data_ptr() for b in full.v_buffer]
    assert stack.pool.full_to_swa_index_mapping is stack.allocator.full_to_swa_index_mapping
    assert {k: (i, bool(s)) for k, (i, s) in stack.kv_pool.layers_mapping.items()} == stack.pool.layers_mapping
    assert stack.pool.swa_k_buffer[0].shape == (16, 2, 4)  # size_swa + the dummy page: the harness's swa_size


def test_slots_rows_and_frees_are_sglangs_fifo_ones():
    stack = _stack()
    assert [stack.alloc_req_row(), stack.alloc_req_row()] == [16, 15]  # highest free row first
    a = stack.alloc_extend(prefix_lens=[0], extend_lens=[10], last_locs=[0])
    assert a.tolist() == list(range(1, 11))
    stack.free_swa(a[:4])
    b = stack.alloc_extend(prefix_lens=[0], extend_lens=[6], last_locs=[0])
    assert stack.translate(b).tolist() == [11, 12, 13, 14, 15, 1]  # the evicted SWA slots, in eviction order


def test_a_second_eviction_of_the_same_slots_trips_sglangs_invariant_check():
    stack = _stack()
    a = stack.alloc_extend(prefix_lens=[0], extend_lens=[6], last_locs=[0])
    stack.free_swa(a[:2])
    with pytest.raises(RuntimeError, match=r"invariant-check FAILED \[swa\.peer_mapped\]"):
        stack.free_swa(a[:2])


def test_a_finished_row_frees_its_evicted_part_full_side_only():
    stack = _stack(page_size=4)
    a = stack.alloc_extend(prefix_lens=[0], extend_lens=[12], last_locs=[0])
    stack.free_swa(a[:4])
    stack.free(a)  # a plain free would trip swa.peer_mapped on the evicted page
    free_full, free_swa = stack.free_slots()["full"], stack.free_slots()["swa"]
    assert len(free_full) == 28 and len(free_swa) == 12


def test_a_sound_design_matches_its_reference_on_the_installed_pool():
    ms = model_spec("gpt-oss-mini")
    w = ms.window
    spec = RunSpec(model=ms, pool=PoolSpec(full_size=64, swa_size=24, free_order="fifo"),
                   timeline=TimelineSpec(requests=(RequestSpec(rid="a", prompt_len=w + 2, output_len=w + 2),
                                                   RequestSpec(rid="b", arrive=1, prompt_len=3, output_len=w)),
                                         seed=5),
                   serving="sglang", eviction=EvictionSpec(policy=INSTALLED_EVICTION, interval=1), design="translate")
    reference = execute(spec.reference())
    assert reference.error is None, reference.error
    assert any(step.evicted for step in reference.steps), "nothing was evicted: the timeline shows nothing"
    assert judge(execute(spec), reference).outcome == "match"

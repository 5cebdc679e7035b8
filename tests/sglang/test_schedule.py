"""SGLang's own scheduling path under a timeline: real Req objects and ScheduleBatches, SGLang's ForwardBatch."""

from harness.serving.eviction import EvictionSpec
from harness.serving.pool import PoolSpec
from harness.serving.registry import eviction_policy
from harness.serving.stack import StackSpec
from harness.serving.timeline import RequestSpec, TimelineSpec


def _scheduler(timeline, *, full_size=33, swa_size=17):
    from harness.sglang.schedule import SGLangScheduler
    from harness.sglang.stack import SGLangStack

    stack = SGLangStack.build(StackSpec(pool=PoolSpec(full_size=full_size, swa_size=swa_size, free_order="fifo"),
                                        layer_is_swa=(False, True), num_kv_heads=1, head_dim=1, poison_freed=False))
    policy = eviction_policy(EvictionSpec(policy="sglang", interval=1), window=4)
    return stack, SGLangScheduler(timeline, stack=stack, eviction=policy, vocab_size=64)


def test_each_step_is_sglangs_forward_batch_of_a_real_schedule_batch():
    _, sched = _scheduler(TimelineSpec(requests=(RequestSpec(rid="a", prompt_len=5, output_len=2),)))
    from sglang.srt.managers.schedule_batch import Req  # after the stack loaded SGLang (its torchvision stand-in)
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    kinds = []
    while (step := sched.next_step()) is not None:
        fb = sched.forward_batch
        assert isinstance(fb, ForwardBatch) and all(isinstance(r, Req) for r in sched.last_batch.reqs)
        assert step.batch.out_cache_loc.tolist() == fb.out_cache_loc.tolist()
        assert step.batch.positions.tolist() == fb.positions.tolist()
        kinds.append((step.kind, step.batch.positions.tolist()))
        sched.finish_step()
    assert kinds == [("extend", [0, 1, 2, 3, 4]), ("decode", [5]), ("decode", [6])]


def test_finishing_and_aborting_give_every_slot_and_row_back_through_release_kv_cache():
    stack, sched = _scheduler(TimelineSpec(requests=(RequestSpec(rid="a", prompt_len=6, output_len=3),
                                                     RequestSpec(rid="b", prompt_len=4, output_len=9, abort=3))))
    finished, aborted = [], []
    while (step := sched.next_step()) is not None:
        aborted.extend(step.aborted)
        finished.extend(sched.finish_step().finished)
    assert finished == ["a"] and aborted == ["b"]
    assert stack.allocator.full_available_size() == 32 and stack.allocator.swa_available_size() == 16
    assert stack.req_to_token_pool.real.available_size() == stack.req_to_token_pool.real.size


def test_a_chunked_prompt_is_stashed_between_chunks_and_decodes_after_its_last():
    _, sched = _scheduler(TimelineSpec(requests=(RequestSpec(rid="a", prompt_len=10, output_len=1),), chunk_size=4))
    steps = []
    while (step := sched.next_step()) is not None:
        steps.append((step.kind, step.batch.positions.tolist()))
        sched.finish_step()
    assert steps == [("extend", [0, 1, 2, 3]), ("extend", [4, 5, 6, 7]), ("extend", [8, 9]), ("decode", [10])]


def test_with_prefix_sharing_the_real_radix_cache_matches_a_finished_turn_for_the_next():
    """Groundwork for the prefix-cache scenarios (not yet their runs): SGLang's UnifiedRadixCache with full and
    SWA components takes a's prompt and output when a finishes (release_kv_cache), and b, whose stream starts
    with them, is admitted with that prefix matched (match_prefix) and locked, its row on a's full slots."""
    from harness.sglang.schedule import SGLangScheduler
    from harness.sglang.stack import SGLangStack

    stack = SGLangStack.build(StackSpec(pool=PoolSpec(full_size=65, swa_size=33, free_order="fifo"),
                                        layer_is_swa=(False, True), num_kv_heads=1, head_dim=1, poison_freed=False))
    timeline = TimelineSpec(requests=(
        RequestSpec(rid="a", prompt_len=8, output_len=4),
        RequestSpec(rid="b", arrive=6, prompt_len=16, output_len=2, prefix_of="a", shared_len=12)))
    policy = eviction_policy(EvictionSpec(policy="sglang", interval=1, prefix_cache=True), window=4)
    sched = SGLangScheduler(timeline, stack=stack, eviction=policy, vocab_size=64)
    extends = []
    while (step := sched.next_step()) is not None:
        if step.kind == "extend":
            fb = sched.forward_batch
            row = int(fb.req_pool_indices[0])
            extends.append((fb.extend_prefix_lens_cpu, step.batch.out_cache_loc.tolist(),
                            stack.req_to_token_pool.req_to_token[row, :12].tolist()))
        sched.finish_step()
    (_, a_slots, _), (b_prefix, b_slots, b_row) = extends
    assert b_prefix == [12] and b_slots == [13, 14, 15, 16]
    assert b_row == a_slots + [9, 10, 11, 12]  # a's prompt slots, then the slots a decoded into
    assert sched.tree_cache.evictable_size() > 0  # both turns stay cached, unlocked

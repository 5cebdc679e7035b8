"""The target-verify forward after each draft (``timeline.accept_lens``): the slot bookkeeping of the verify plan,
the acceptance rule's validation, the ``leaked`` pool invariant, and the faults that leave rejected slots held."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.runners.dispatch import BatchDescriptor
from harness.scenario import ScenarioError, load_scenario
from harness.serving.batch import ForwardMode
from harness.serving.eviction import EvictionSpec, TightEviction
from harness.serving.invariants import pool_violations
from harness.serving.kv_groups import hybrid_swa_groups
from harness.serving.miniature import MiniatureStack
from harness.serving.pool import PoolSpec
from harness.serving.scheduler import Scheduler
from harness.serving.stack import StackSpec
from harness.serving.timeline import LiveToken, RequestSpec, TimelineSpec

W = 8
TWO = (RequestSpec(rid="a", prompt_len=5, output_len=10), RequestSpec(rid="b", prompt_len=3, output_len=10))


def _scheduler(timeline: TimelineSpec) -> tuple[Scheduler, MiniatureStack]:
    stack = MiniatureStack.build(StackSpec(pool=PoolSpec(full_size=64, swa_size=32), layer_is_swa=(),
                                           num_kv_heads=1, head_dim=1, poison_freed=False))
    return Scheduler(timeline, stack=stack, eviction=TightEviction(EvictionSpec(), window=W, page_size=1),
                     vocab_size=256), stack


def _free(stack: MiniatureStack) -> tuple[int, int]:
    free = stack.free_slots()
    return len(free["full"]), len(free["swa"])


def test_a_verify_reuses_the_drafts_slots_keeps_the_accepted_tokens_and_frees_the_rest_in_both_pools():
    sched, stack = _scheduler(TimelineSpec(requests=TWO, seed=1, draft_steps=3, accept_lens=(1,)))
    sched.next_step()
    sched.finish_step()  # the prefill: a holds 1..5, b 6..8
    before = _free(stack)
    step = sched.next_step()
    batch = step.batch
    assert batch.forward_mode is ForwardMode.DRAFT and batch.verify is not None
    draft = batch.draft_out_cache_loc.t().reshape(-1).tolist()
    verify = batch.verify.build()
    # the draft's slots went back before the verify allocated: its allocation starts with them
    assert verify.forward_mode is ForwardMode.TARGET_VERIFY
    assert verify.out_cache_loc.tolist()[:6] == draft
    assert verify.positions.tolist() == [5, 6, 7, 8, 3, 4, 5, 6]
    assert verify.seq_lens.tolist() == [9, 7] and verify.extend_prefix_lens.tolist() == [5, 3]
    assert torch.equal(verify.out_cache_loc_swa, stack.translate(verify.out_cache_loc))
    a, b = sched.book.running
    assert (a.seq_len, b.seq_len) == (7, 5)  # the last token and one accepted draft
    assert a.slots[5:] == verify.out_cache_loc.tolist()[:2]
    assert stack.req_to_token_pool.req_to_token[a.row, 5:9].tolist() == verify.out_cache_loc.tolist()[:4]
    assert _free(stack) == (before[0] - 8, before[1] - 8)
    batch.verify.release_rejected()
    assert _free(stack) == (before[0] - 4, before[1] - 4)
    # the step's forwards: 3 draft steps of one token per request, then the verify's 4 per request
    assert [len(f) for f in step.forwards] == [2, 2, 2, 8]
    assert stack.invariant_violations(sched.live_tokens()) == []


@pytest.mark.parametrize("full, swa, leaked", [(False, False, {"full", "swa"}), (False, True, {"full"})])
def test_rejected_slots_left_held_are_named_by_the_leaked_invariant(full, swa, leaked):
    sched, stack = _scheduler(TimelineSpec(requests=TWO, seed=1, draft_steps=3, accept_lens=(0,)))
    sched.next_step()
    sched.finish_step()
    batch = sched.next_step().batch
    rejected = set(batch.verify.build().out_cache_loc.view(2, 4)[:, 1:].reshape(-1).tolist())
    batch.verify.release_rejected(full=full, swa=swa)
    found = [v for v in stack.invariant_violations(sched.live_tokens())]
    assert {v.invariant for v in found} == {"leaked"}
    assert {v.pool for v in found} == leaked
    assert {v.slot for v in found if v.pool == "full"} == rejected


def test_the_stack_frees_full_slots_only_with_their_swa_slots():
    sched, _ = _scheduler(TimelineSpec(requests=TWO, seed=1, draft_steps=3, accept_lens=(0,)))
    sched.next_step()
    sched.finish_step()
    batch = sched.next_step().batch
    batch.verify.build()
    with pytest.raises(ValueError, match="together with their SWA slots"):
        batch.verify.release_rejected(full=True, swa=False)


def test_a_whole_verified_timeline_runs_to_the_end_and_each_iteration_takes_its_acceptance():
    sched, stack = _scheduler(TimelineSpec(requests=TWO, seed=1, draft_steps=3, accept_lens=(2, 0, 3)))
    grown = []
    while (step := sched.next_step()) is not None:
        if step.batch.verify is not None:
            before = [r.seq_len - step.batch.draft_steps for r in sched.book.running]
            step.batch.verify.build()
            step.batch.verify.release_rejected()
            grown.append([r.seq_len - b for r, b in zip(sched.book.running, before)])
        assert stack.invariant_violations(sched.live_tokens()) == []
        sched.finish_step()
        assert stack.invariant_violations(sched.live_tokens()) == []
    # 1 + accepted per iteration, the list cycling; the fourth draft is one step (b is two tokens from its
    # end, and the verify writes one past the draft), so its acceptance of 2 is capped at 1
    assert grown == [[3, 3], [1, 1], [4, 4], [2, 2]]
    assert _free(stack) == (63, 31)  # everything back but the dummy slot


def test_without_accept_lens_drafts_are_kept_unverified():
    sched, _ = _scheduler(TimelineSpec(requests=TWO, seed=1, draft_steps=3))
    sched.next_step()
    sched.finish_step()
    step = sched.next_step()
    assert step.batch.verify is None and [len(f) for f in step.forwards] == [2, 2, 2]
    assert [r.seq_len for r in sched.book.running] == [8, 6]


def test_a_verify_batch_is_keyed_as_a_target_verify_of_its_tokens_per_request():
    sched, _ = _scheduler(TimelineSpec(requests=TWO, seed=1, draft_steps=3, accept_lens=(1,)))
    sched.next_step()
    sched.finish_step()
    verify = sched.next_step().batch.verify.build()
    key = BatchDescriptor.of(verify)
    assert (key.forward_mode, key.tokens_per_request, key.num_tokens) == (ForwardMode.TARGET_VERIFY, 4, 8)


@pytest.mark.parametrize("timeline, message", [
    (TimelineSpec(requests=TWO, accept_lens=(1,)), "accept_lens: a verify needs drafts to accept"),
    (TimelineSpec(requests=TWO, draft_steps=2, accept_lens=(1, 3)),
     "accept_lens[1]: expected an integer from 0 to draft_steps (2), got 3"),
    (TimelineSpec(requests=TWO, draft_steps=2, accept_lens=(-1,)), "accept_lens[0]: expected an integer from 0"),
])
def test_bad_acceptance_rules_are_named(timeline, message):
    assert any(p.startswith(message) for p in timeline.problems()), timeline.problems()


_FILE = ('description = "d"\n[model]\npreset = "gpt-oss-mini"\n[pool]\nfull_size = 64\nswa_size = 32\n{pool}'
         '[graphs]\nmodes = ["eager"]\n[timeline]\ndraft_steps = 2\naccept_lens = {accept}\n'
         '[[timeline.requests]]\nprompt_len = 4\noutput_len = 4\n[run]\ndesigns = ["translate"]\n{faults}'
         '[expect.translate]\nverdict = "match"\nwhy = "w"\n')


@pytest.mark.parametrize("pool, accept, faults, problem", [
    ("", '"one"', "", 'timeline.accept_lens: expected an array'),
    ("", "[3]", "", "timeline.accept_lens[0]: expected an integer from 0 to draft_steps (2), got 3"),
    ("page_size = 4\n", "[1]", "", "timeline.accept_lens: a target verify runs with pages of one token only"),
    ("", "[]", 'faults = ["skip_free_rejected"]\n',
     "run.faults[0]: skip_free_rejected acts only in a run that verifies its drafts"),
])
def test_a_bad_acceptance_rule_in_a_file_names_the_file_and_key(tmp_path: Path, pool, accept, faults, problem):
    path = tmp_path / "s.toml"
    path.write_text(_FILE.format(pool=pool, accept=accept, faults=faults))
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert any(p.startswith(f"{path}: {problem}") for p in err.value.problems), err.value.problems


def test_the_leaked_invariant_counts_whole_pages_and_the_cache_as_owners():
    groups = hybrid_swa_groups(layer_is_swa=(True, False), layer_windows=(4, None), full_size=16, swa_size=16,
                               page_size=4, kv_dtype="float32", num_kv_heads=1, head_dim=1)
    live = [LiveToken(rid="a", pos=0, slots=(5, 9), in_window=True)]  # owns full page 1 and SWA page 2
    free = {"full": set(range(8, 16)), "swa": set(range(4, 8)) | set(range(12, 16))}
    assert pool_violations(live, groups=groups, free=free) == []
    held = {"full": set(range(12, 16)), "swa": set(range(4, 8))}  # full page 2 and SWA page 3 handed out, unowned
    found = {(v.invariant, v.pool, v.slot) for v in pool_violations(live, groups=groups, free=held)}
    assert found == {("leaked", "full", 8), ("leaked", "swa", 12)}


def test_a_verify_is_built_once():
    sched, _ = _scheduler(TimelineSpec(requests=TWO, seed=1, draft_steps=3, accept_lens=(1,)))
    sched.next_step()
    sched.finish_step()
    batch = sched.next_step().batch
    batch.verify.build()
    with pytest.raises(RuntimeError, match="built already"):
        batch.verify.build()

"""Tree drafts (``timeline.draft_topk`` > 1): SGLang's EAGLE slot layout for ``topk`` branches, each branch's
keys (its request's tokens, then its own branch), the tree-masked verify, acceptance along one branch with
every other slot freed, and the untranslated tree table of the ``draft_tree_swa_untranslated`` fault."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.backends.page_table import tree_slot_table, tree_swa_slot_table
from harness.scenario import ScenarioError, load_scenario
from harness.serving.batch import ForwardMode
from harness.serving.draft_tree import request_order, tree_order, verify_tree
from harness.serving.eviction import EvictionSpec, TightEviction
from harness.serving.miniature import MiniatureStack
from harness.serving.pool import PoolSpec
from harness.serving.scheduler import Scheduler
from harness.serving.stack import StackSpec
from harness.serving.timeline import RequestSpec, TimelineSpec, TokenKey

W = 8
TWO = (RequestSpec(rid="a", prompt_len=5, output_len=10), RequestSpec(rid="b", prompt_len=3, output_len=10))


def _scheduler(timeline: TimelineSpec) -> tuple[Scheduler, MiniatureStack]:
    stack = MiniatureStack.build(StackSpec(pool=PoolSpec(full_size=64, swa_size=32), layer_is_swa=(),
                                           num_kv_heads=1, head_dim=1, poison_freed=False))
    return Scheduler(timeline, stack=stack, eviction=TightEviction(EvictionSpec(), window=W, page_size=1),
                     vocab_size=256), stack


def _first_draft(accept=(1,), topk=2, steps=3):
    sched, stack = _scheduler(TimelineSpec(requests=TWO, seed=1, draft_steps=steps, draft_topk=topk,
                                           accept_lens=accept))
    sched.next_step()
    sched.finish_step()  # the prefill: a holds positions 0..4, b 0..2
    return sched, stack, sched.next_step()


def test_a_tree_draft_allocates_every_branch_and_step_at_once_and_reads_one_row_of_bs_times_topk_per_step():
    sched, stack, step = _first_draft()
    batch = step.batch
    a, b = sched.book.running
    table = stack.req_to_token_pool.req_to_token
    # assign_draft_cache_locs: each request's 2 x 3 slots after its tokens, branch after branch
    flat = torch.cat([table[a.row, 5:11], table[b.row, 3:9]])
    assert batch.forward_mode is ForwardMode.DRAFT and batch.draft_topk == 2
    assert batch.batch_size == 4 and batch.num_requests == 2
    assert torch.equal(batch.draft_out_cache_loc, flat.view(2, 2, 3).permute(2, 0, 1).reshape(3, -1))
    assert torch.equal(request_order(batch.draft_out_cache_loc, topk=2), flat)
    # SGLang translates the whole allocation at batch creation, request-major
    assert torch.equal(batch.out_cache_loc_swa, stack.translate(flat))
    assert batch.positions.tolist() == [5, 5, 3, 3]
    assert batch.req_pool_indices.tolist() == [a.row, a.row, b.row, b.row]
    assert batch.draft_tree.shift.tolist() == [0, 3, 0, 3] and batch.draft_tree.prefix.tolist() == [5, 5, 3, 3]
    # the step's forwards: 4 rows (2 requests x 2 branches) per step, then 7 tokens per request in the verify
    assert [len(f) for f in step.forwards] == [4, 4, 4, 14]
    assert len(set(flat.tolist())) == 12


def test_each_branch_reads_its_requests_tokens_then_its_own_branch_only():
    sched, stack, step = _first_draft()
    batch = step.batch
    a, _ = sched.book.running
    table = stack.req_to_token_pool.req_to_token
    width = table.shape[1]
    kv_lens = batch.seq_lens + 2  # draft step 2: three draft tokens after the request's own
    slots = tree_slot_table(table, batch.req_pool_indices, batch.draft_tree, kv_lens, width)
    own = table[a.row, :5].tolist()
    assert slots[0, :8].tolist() == own + table[a.row, 5:8].tolist()   # a, branch 0
    assert slots[1, :8].tolist() == own + table[a.row, 8:11].tolist()  # a, branch 1: never branch 0's slots
    assert slots[1, 8:].eq(0).all()


def test_a_tree_verify_attends_each_token_to_its_ancestors_only():
    sched, stack, step = _first_draft()
    verify = step.batch.verify.build()
    a, _ = sched.book.running
    # the root, then each branch's run, at depths 0, 1 2 3, 1 2 3
    assert verify.positions.tolist()[:7] == [5, 6, 7, 8, 6, 7, 8]
    assert verify.num_tokens == 14 and verify.draft_tree.kv_lens.tolist()[:7] == [6, 7, 8, 9, 7, 8, 9]
    table = stack.req_to_token_pool.req_to_token
    nodes = verify.out_cache_loc[:7].tolist()
    assert table[a.row, 5:12].tolist() == nodes
    rows = verify.req_pool_indices.repeat_interleave(7)
    slots = tree_slot_table(table, rows, verify.draft_tree, verify.draft_tree.kv_lens, table.shape[1])
    own = table[a.row, :5].tolist()
    root, b0, b1 = nodes[0], nodes[1:4], nodes[4:7]
    assert slots[0, :6].tolist() == own + [root]
    assert slots[3, :9].tolist() == own + [root, *b0]        # branch 0's deepest token
    assert slots[5, :8].tolist() == own + [root, *b1[:2]]    # branch 1's second: no branch 0 slot
    assert not set(slots[4:7].reshape(-1).tolist()) & set(b0)


def test_the_verify_keeps_the_root_and_the_accepted_branch_and_frees_every_other_slot_in_both_pools():
    sched, stack = _scheduler(TimelineSpec(requests=TWO, seed=1, draft_steps=3, draft_topk=2, accept_lens=(2,)))
    sched.next_step()
    sched.finish_step()
    free0 = stack.free_slots()
    for iteration in range(2):  # iteration 0 accepts along branch 0, iteration 1 along branch 1
        step = sched.next_step()
        a, b = sched.book.running
        pre = a.seq_len - 3
        verify = step.batch.verify.build()
        nodes = verify.out_cache_loc.view(2, 7)
        kept = [0, *(1 + 3 * iteration + i for i in range(2))]
        assert a.slots[pre:] == nodes[0, kept].tolist() and a.seq_len == pre + 3
        step.batch.verify.accept()
        assert stack.req_to_token_pool.req_to_token[a.row, pre : pre + 3].tolist() == nodes[0, kept].tolist()
        step.batch.verify.release_rejected()
        assert stack.invariant_violations(sched.live_tokens()) == []
        sched.finish_step()
    free = stack.free_slots()
    # two iterations of 3 kept tokens per request: 12 slots held in each pool beyond the prefill's (minus eviction)
    assert len(free0["full"]) - len(free["full"]) == 12
    assert stack.invariant_violations(sched.live_tokens()) == []


def test_a_whole_tree_timeline_runs_to_the_end_and_gives_every_slot_back():
    sched, stack = _scheduler(TimelineSpec(requests=TWO, seed=1, draft_steps=3, draft_topk=2, accept_lens=(1, 3, 0)))
    while (step := sched.next_step()) is not None:
        if step.batch.verify is not None:
            step.batch.verify.build()
            step.batch.verify.accept()
            step.batch.verify.release_rejected()
        assert stack.invariant_violations(sched.live_tokens()) == []
        sched.finish_step()
    free = stack.free_slots()
    assert (len(free["full"]), len(free["swa"])) == (63, 31)


def test_the_untranslated_fault_keeps_full_ids_on_the_branch_part_only():
    tree = verify_tree(torch.tensor([2]), topk=2, steps=1)  # root, b0, b1 after 2 committed tokens
    full = torch.tensor([[10, 11, 12, 13], [10, 11, 12, 14], [10, 11, 12, 15]])
    swa = full - 9
    assert torch.equal(tree_swa_slot_table(full, swa, tree, untranslated=False), swa)
    wrong = tree_swa_slot_table(full, swa, tree, untranslated=True)
    assert wrong[:, :2].tolist() == [[1, 2]] * 3 and torch.equal(wrong[:, 2:], full[:, 2:])


def test_tree_order_is_sglangs_permute_of_the_allocation():
    by_request = torch.arange(12).view(2, 6)  # 2 requests, 2 branches, 3 steps
    rows = tree_order(by_request, topk=2, steps=3)
    assert rows.tolist() == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]
    assert torch.equal(request_order(rows, topk=2), by_request.reshape(-1))


@pytest.mark.parametrize("timeline, message", [
    (TimelineSpec(requests=TWO, draft_steps=2, draft_topk=2), "draft_topk: a tree of drafts needs draft_steps and"),
    (TimelineSpec(requests=TWO, draft_topk=0), "draft_topk: expected an integer from 1 to 64, got 0"),
])
def test_bad_tree_settings_are_named(timeline, message):
    assert any(p.startswith(message) for p in timeline.problems()), timeline.problems()


_FILE = ('description = "d"\n[model]\npreset = "gpt-oss-mini"\n[pool]\nfull_size = 64\nswa_size = 32\n'
         'max_context_len = {width}\n[graphs]\nmodes = ["eager"]\n[timeline]\ndraft_steps = 2\ndraft_topk = {topk}\n'
         'accept_lens = [1]\n[[timeline.requests]]\nprompt_len = 4\noutput_len = 4\n[run]\ndesigns = ["translate"]\n'
         '{faults}[expect.translate]\nverdict = "match"\nwhy = "w"\n')


@pytest.mark.parametrize("width, topk, faults, problem", [
    (9, 2, "", "timeline.requests[0]: a tree draft needs 10 req_to_token columns"),
    (64, 1, 'faults = ["draft_tree_swa_untranslated"]\n',
     "run.faults[0]: draft_tree_swa_untranslated acts only in a run that drafts trees; timeline.draft_topk is 1"),
    (64, "2.5", "", "timeline.draft_topk: expected an integer"),
])
def test_a_bad_tree_in_a_file_names_the_file_and_key(tmp_path: Path, width, topk, faults, problem):
    path = tmp_path / "s.toml"
    path.write_text(_FILE.format(width=width, topk=topk, faults=faults))
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert any(p.startswith(f"{path}: {problem}") for p in err.value.problems), err.value.problems


def test_the_rejected_branches_draft_other_tokens_and_their_rows_are_owned_by_their_branch():
    sched, _, step = _first_draft()  # iteration 0 accepts along branch 0
    a, b = sched.book.running
    ids = step.batch.draft_input_ids
    assert torch.equal(ids[:, 0], a.tokens[5:8]) and torch.equal(ids[:, 2], b.tokens[3:6])
    assert torch.equal(ids[:, 1], (a.tokens[5:8] + 2) % 256)  # branch 1: shifted by 1 + branch
    assert step.forwards[0] == (TokenKey("a", 5), TokenKey("a", 5, branch=1), TokenKey("b", 3),
                                TokenKey("b", 3, branch=1))
    verify = step.batch.verify.build()
    assert torch.equal(verify.input_ids[:4], a.tokens[5:9])  # the root and the accepted branch
    assert torch.equal(verify.input_ids[4:7], (a.tokens[6:9] + 2) % 256)
    assert [k.branch for k in step.forwards[-1][:7]] == [None, None, None, None, 1, 1, 1]

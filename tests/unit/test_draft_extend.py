"""The draft-extend forward after each target forward (``timeline.draft_extend``): what it covers after a prefill
and after a verify, where the speculative worker runs it (after the rejected drafts went back), the draft of one
forward fewer that follows it, and the rules that refuse a timeline or fault it cannot act in."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.runners.speculative import SpeculativeWorker
from harness.scenario import ScenarioError, load_scenario
from harness.serving.batch import ForwardBatch, ForwardMode
from harness.serving.eviction import EvictionSpec, TightEviction
from harness.serving.miniature import MiniatureStack
from harness.serving.pool import PoolSpec
from harness.serving.scheduler import Scheduler
from harness.serving.stack import StackSpec
from harness.serving.timeline import RequestSpec, TimelineSpec

TWO = (RequestSpec(rid="a", prompt_len=5, output_len=10), RequestSpec(rid="b", prompt_len=3, output_len=10))


def _scheduler(accept_lens: tuple[int, ...], draft_extend: bool | str = True) -> tuple[Scheduler, MiniatureStack]:
    stack = MiniatureStack.build(StackSpec(pool=PoolSpec(full_size=64, swa_size=32), layer_is_swa=(),
                                           num_kv_heads=1, head_dim=1, poison_freed=False))
    timeline = TimelineSpec(requests=TWO, seed=1, draft_steps=3, accept_lens=accept_lens, draft_extend=draft_extend)
    return Scheduler(timeline, stack=stack, eviction=TightEviction(EvictionSpec(), window=8, page_size=1),
                     vocab_size=256), stack


class _Recorder:
    """A runner that records each forward it is handed and the slots free in each pool at that moment."""

    def __init__(self, stack: MiniatureStack) -> None:
        self.stack = stack
        self.seen: list[tuple[ForwardBatch, tuple[int, int]]] = []
        self.free_full = []
        """the full pool's free slots at each forward"""
        self.swa_at = []
        """the SWA slots the pool maps each forward's ``out_cache_loc`` to, at that forward"""

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        free = self.stack.free_slots()
        self.seen.append((batch, (len(free["full"]), len(free["swa"]))))
        self.free_full.append(free["full"])
        self.swa_at.append(self.stack.translate(batch.out_cache_loc))
        return torch.zeros(batch.num_tokens, 4)


def test_a_prefill_is_followed_by_a_draft_extend_over_the_same_tokens_and_slots():
    sched, stack = _scheduler((1,))
    step = sched.next_step()
    assert step.batch.forward_mode is ForwardMode.EXTEND and [len(f) for f in step.forwards] == [8, 8]
    extend = step.batch.draft_extend.build()
    assert extend.forward_mode is ForwardMode.DRAFT_EXTEND
    assert torch.equal(extend.out_cache_loc, step.batch.out_cache_loc)
    assert torch.equal(extend.positions, step.batch.positions)
    assert extend.seq_lens.tolist() == [5, 3] and extend.extend_prefix_lens.tolist() == [0, 0]
    # built afresh: its own SWA translation, not the target batch's tensor
    assert extend.out_cache_loc_swa is not step.batch.out_cache_loc_swa
    assert torch.equal(extend.out_cache_loc_swa, stack.translate(extend.out_cache_loc))


def test_after_a_verify_the_draft_extend_covers_the_kept_tokens_once_the_rejected_ones_went_back():
    sched, stack = _scheduler((1,))
    worker = SpeculativeWorker(recorder := _Recorder(stack))
    worker.run(sched.next_step().batch)
    sched.finish_step()
    step = sched.next_step()
    assert step.batch.draft_steps == 3 and step.batch.draft_forwards == 2
    # two draft forwards, the verify's 4 tokens per request, the draft-extend's 1 + 1 accepted
    assert [len(f) for f in step.forwards] == [2, 2, 8, 4]
    mark = len(recorder.seen)
    outs = worker.run(step.batch)
    ran = recorder.seen[mark:]
    assert [b.forward_mode for b, _ in ran] == [ForwardMode.DRAFT, ForwardMode.DRAFT, ForwardMode.TARGET_VERIFY,
                                                ForwardMode.DRAFT_EXTEND]
    assert [o.shape[0] for o in outs] == [len(f) for f in step.forwards]
    (verify, at_verify), (extend, at_extend) = ran[2], ran[3]
    kept = verify.out_cache_loc.view(2, 4)[:, :2].reshape(-1)
    assert torch.equal(extend.out_cache_loc, kept)
    assert extend.positions.tolist() == [5, 6, 3, 4]
    assert extend.seq_lens.tolist() == [7, 5] and extend.extend_prefix_lens.tolist() == [5, 3]
    assert torch.equal(extend.out_cache_loc_swa, stack.translate(kept))
    assert at_extend == (at_verify[0] + 4, at_verify[1] + 4)  # the 2 rejected drafts of each request went back


def test_a_one_step_draft_after_a_draft_extend_runs_no_forward_and_goes_straight_to_its_verify():
    sched, stack = _scheduler((3,))
    worker = SpeculativeWorker(recorder := _Recorder(stack))
    while (step := sched.next_step()) is not None:
        mark = len(recorder.seen)
        worker.run(step.batch)
        modes = [b.forward_mode for b, _ in recorder.seen[mark:]]
        if step.batch.forward_mode is ForwardMode.DRAFT and step.batch.draft_steps == 1:
            assert modes == [ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND]
            break
        sched.finish_step()
    else:
        pytest.fail("no one-step draft in the timeline")


@pytest.mark.parametrize("draft_extend", [True, "v2"])
def test_after_a_prefill_both_forms_run_the_draft_extend_over_the_chunk(draft_extend):
    sched, stack = _scheduler((1,), draft_extend)
    step = sched.next_step()
    extend = step.batch.draft_extend.build()
    assert not step.batch.draft_extend.before_frees
    assert torch.equal(extend.out_cache_loc, step.batch.out_cache_loc)
    assert torch.equal(extend.input_ids, step.batch.input_ids) and torch.equal(extend.positions, step.batch.positions)


@pytest.mark.parametrize("accept_lens", [(0,), (1,), (3,)])
def test_a_v2_draft_extend_covers_the_verify_window_at_its_slots_before_the_rejected_ones_go_back(accept_lens):
    sched, stack = _scheduler(accept_lens, "v2")
    worker = SpeculativeWorker(recorder := _Recorder(stack))
    worker.run(sched.next_step().batch)
    sched.finish_step()
    step = sched.next_step()
    accepted = accept_lens[0]
    # two draft forwards, the verify's 4 tokens per request, the draft-extend's same 4: the whole window
    assert [len(f) for f in step.forwards] == [2, 2, 8, 8]
    assert step.forwards[3] == step.forwards[2]
    mark = len(recorder.seen)
    outs = worker.run(step.batch)
    ran, free_full, swa_at = recorder.seen[mark:], recorder.free_full[mark:], recorder.swa_at[mark:]
    assert [b.forward_mode for b, _ in ran] == [ForwardMode.DRAFT, ForwardMode.DRAFT, ForwardMode.TARGET_VERIFY,
                                                ForwardMode.DRAFT_EXTEND]
    assert [o.shape[0] for o in outs] == [len(f) for f in step.forwards]
    (verify, at_verify), (extend, at_extend) = ran[2], ran[3]
    assert torch.equal(extend.input_ids, verify.input_ids)
    assert extend.positions.tolist() == [5, 6, 7, 8, 3, 4, 5, 6] == verify.positions.tolist()
    assert torch.equal(extend.out_cache_loc, verify.out_cache_loc)  # every verify slot, the rejected ones too
    assert extend.seq_lens.tolist() == [9, 7] and extend.extend_prefix_lens.tolist() == [5, 3]
    assert extend.extend_seq_lens_cpu == (4, 4)
    # built afresh: its own SWA translation, taken while the rejected slots still hold their SWA slots (after the
    # frees they map to none)
    assert extend.out_cache_loc_swa is not verify.out_cache_loc_swa
    assert torch.equal(extend.out_cache_loc_swa, swa_at[3]) and bool((swa_at[3] > 0).all())
    assert torch.equal(extend.out_cache_loc_swa, verify.out_cache_loc_swa)
    rejected = set(torch.cat(step.batch.verify.rejected).tolist())
    assert len(rejected) == 2 * (3 - accepted)
    # nothing freed between the verify and the draft-extend: the rejected drafts are held while it writes them
    assert at_extend == at_verify and not rejected & free_full[3]
    free = stack.free_slots()
    assert rejected <= free["full"]  # ... and given back in both pools once it ran
    assert (len(free["full"]), len(free["swa"])) == (at_extend[0] + len(rejected), at_extend[1] + len(rejected))
    assert [r.seq_len for r in sched.book.running] == [5 + 1 + accepted, 3 + 1 + accepted]


def test_a_v2_draft_extend_built_after_the_rejected_slots_went_back_is_refused():
    sched, stack = _scheduler((1,), "v2")
    worker = SpeculativeWorker(_Recorder(stack))
    worker.run(sched.next_step().batch)
    sched.finish_step()
    plan = sched.next_step().batch.verify
    verify = plan.build()
    plan.release_rejected()
    with pytest.raises(RuntimeError, match="before the verify's rejected slots are freed"):
        verify.draft_extend.build()


@pytest.mark.parametrize("timeline, message", [
    (TimelineSpec(requests=TWO, draft_steps=3, accept_lens=(1,), draft_extend="v3"),
     'draft_extend: expected true, false or "v2"'),
    (TimelineSpec(requests=TWO, draft_steps=3, draft_extend="v2"), "draft_extend: a draft-extend runs over the tokens"),
    (TimelineSpec(requests=TWO, draft_steps=3, draft_extend=True), "draft_extend: a draft-extend runs over the tokens"),
    (TimelineSpec(requests=TWO, draft_steps=1, accept_lens=(1,), draft_extend=True),
     "draft_extend: expected draft_steps of 2 or more, got 1"),
])
def test_a_draft_extend_it_cannot_run_is_named(timeline, message):
    assert any(p.startswith(message) for p in timeline.problems()), timeline.problems()


_FILE = ('description = "d"\n[model]\npreset = "gpt-oss-mini"\n[pool]\nfull_size = 64\nswa_size = 32\n'
         '[graphs]\nmodes = ["eager"]\n[timeline]\ndraft_steps = 2\naccept_lens = [1]\n{extend}'
         '[[timeline.requests]]\nprompt_len = 4\noutput_len = 4\n[run]\ndesigns = ["translate"]\n'
         'faults = ["draft_extend_without_swa_window"]\n[expect.translate]\nverdict = "match"\nwhy = "w"\n')


@pytest.mark.parametrize("extend, problem", [
    ("", "run.faults[0]: draft_extend_without_swa_window acts only in a run with draft-extend forwards"),
    ('draft_extend = "yes"\n', 'timeline.draft_extend: expected true, false or "v2"'),
    ('draft_extend = 2\n', 'timeline.draft_extend: expected true, false or "v2"'),
])
def test_a_bad_draft_extend_in_a_file_names_the_file_and_key(tmp_path: Path, extend, problem):
    path = tmp_path / "s.toml"
    path.write_text(_FILE.format(extend=extend))
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert any(p.startswith(f"{path}: {problem}") for p in err.value.problems), err.value.problems

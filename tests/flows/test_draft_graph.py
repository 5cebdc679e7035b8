"""The draft graph runner: the whole multi-step draft loop as one graph per bucket, over SGLang's EAGLE slot
layout (every step's slots allocated at once, one row view per step, positions advanced in place)."""

import pytest
import torch

from harness.backends.base import GraphSupport
from harness.check.run.assemble import assemble
from harness.runners.dispatch import BatchDescriptor, GraphCover
from harness.runners.draft_graph import DraftGraphRunner
from harness.serving.batch import ForwardMode
from workloads import draft_after_prefill, heterogeneous_drafts

from harness.runspec import GraphSpec

from ._flows import graph_equals_eager_bitwise, replace, spec_for


def _spec(timeline_fn, mode, buckets=(2, 4), **kw):
    """Few buckets: every draft graph is captured at startup, and each capture records the whole loop."""
    return replace(spec_for("gpt-oss-mini", timeline_fn, mode, **kw), graphs=GraphSpec(decode_buckets=buckets))


def _draft_runner(session) -> DraftGraphRunner:
    (runner,) = [r for r in session.runner.runners if isinstance(r, DraftGraphRunner)]
    return runner


def _steps_of(spec):
    """(scheduled step, graph names of its forwards) of every step of a run."""
    session = assemble(spec)
    out = []
    while (step := session.scheduler.next_step()) is not None:
        mark = len(session.runner.forward_log())
        session.run_batch(step.batch)
        out.append((step, [f.graph for f in session.runner.forward_log()[mark:]]))
        session.scheduler.finish_step()
    return session, out


@pytest.mark.parametrize("backend", ["torch_native", "torch_gather"])
def test_draft_graph_replays_equal_eager_draft_steps_bitwise(backend):
    spec = _spec(heterogeneous_drafts, "full", backend=backend)
    graph_equals_eager_bitwise(spec)


def test_a_whole_draft_is_one_replay_and_a_shorter_draft_is_stepped_on_decode_graphs():
    spec = _spec(heterogeneous_drafts, "full")
    session, steps = _steps_of(spec)
    drafts = [(s, graphs) for s, graphs in steps if s.batch.forward_mode is ForwardMode.DRAFT]
    whole = [graphs for s, graphs in drafts if s.batch.draft_steps == spec.timeline.draft_steps]
    short = [graphs for s, graphs in drafts if s.batch.draft_steps < spec.timeline.draft_steps]
    assert {tuple(g) for g in whole} == {("draft/bs4x2",), ("draft/bs2x2",)}
    assert short and all(g and all(name.startswith("decode/") for name in g) for g in short)
    runner = _draft_runner(session)
    assert runner.log.captures == len(runner.buckets)
    assert runner.log.padded_replays >= 2  # three requests in the bucket of four, one in the bucket of two


def test_draft_slots_are_allocated_at_once_and_read_one_row_per_step():
    session = assemble(_spec(heterogeneous_drafts, "eager"))
    while (step := session.scheduler.next_step()).batch.forward_mode is not ForwardMode.DRAFT:
        session.run_batch(step.batch)
        session.scheduler.finish_step()
    batch = step.batch
    rows = batch.draft_out_cache_loc
    assert rows.shape == (batch.draft_steps, batch.batch_size)
    # one row view per step over one tensor, as draft_forward's out_cache_loc[i]
    assert all(rows[i].untyped_storage().data_ptr() == rows.untyped_storage().data_ptr() for i in range(len(rows)))
    assert batch.out_cache_loc.data_ptr() == rows[0].data_ptr()
    req_to_token = session.req_to_token_pool.req_to_token
    for b in range(batch.batch_size):
        row, start = int(batch.req_pool_indices[b]), int(batch.seq_lens[b]) - 1
        # each request's run of slots where its next positions live (assign_draft_cache_locs)
        assert req_to_token[row, start : start + batch.draft_steps].tolist() == rows[:, b].tolist()
    # a fresh pool hands out consecutive slots: one allocation, request-major
    flat = rows.t().reshape(-1)
    assert flat.tolist() == list(range(int(flat[0]), int(flat[0]) + flat.numel()))


def test_each_draft_step_reads_metadata_of_its_own_length_and_positions_advance_in_place():
    session = assemble(_spec(draft_after_prefill, "full", buckets=(1,)))
    runner = _draft_runner(session)
    while (step := session.scheduler.next_step()).batch.forward_mode is not ForwardMode.DRAFT:
        session.run_batch(step.batch)
        session.scheduler.finish_step()
    batch = step.batch
    base_positions, base_lens = batch.positions.clone(), batch.seq_lens.clone()
    session.run_batch(batch)
    bs = batch.batch_size
    for i, backend in enumerate(runner.backends):
        assert backend.forward_metadata.token_kv_lens[:bs].tolist() == (base_lens + i).tolist()
    assert len({id(b.forward_metadata) for b in runner.backends}) == runner.steps
    # the replay itself moved the static positions on: += 1 before every step but the first
    assert runner.positions[:bs].tolist() == (base_positions + runner.steps - 1).tolist()


def test_a_run_that_does_not_speculate_registers_no_draft_graphs():
    session = assemble(_spec(lambda w: replace(heterogeneous_drafts(w), draft_steps=0), "full"))
    assert not [r for r in session.runner.runners if isinstance(r, DraftGraphRunner)]


def test_the_draft_runner_refuses_a_batch_it_has_no_graph_for():
    session = assemble(_spec(draft_after_prefill, "full", buckets=(1,)))
    runner = _draft_runner(session)
    step = session.scheduler.next_step()
    with pytest.raises(ValueError, match="takes whole 3-step drafts, got a batch of mode extend"):
        runner.forward(step.batch)
    assert torch.is_tensor(session.run_batch(step.batch)[0])


def test_a_whole_draft_is_described_by_its_steps_and_a_stepped_one_as_a_decode():
    session = assemble(_spec(heterogeneous_drafts, "full"))
    while (step := session.scheduler.next_step()).batch.forward_mode is not ForwardMode.DRAFT:
        session.run_batch(step.batch)
        session.scheduler.finish_step()
    batch = step.batch
    whole = BatchDescriptor.of(batch)
    assert (whole.forward_mode, whole.tokens_per_request, whole.num_reqs, whole.num_tokens) == (
        ForwardMode.DRAFT, 2, 3, 6)
    assert session.runner.dispatch(batch).key.name == "draft/bs4x2"
    batch.draft_step = 1  # the worker stepped into the loop: each step is a decode forward
    stepped = BatchDescriptor.of(batch)
    assert (stepped.forward_mode, stepped.tokens_per_request) == (ForwardMode.DECODE, 1)
    assert session.runner.dispatch(batch).key.name == "decode/bs4"


def test_a_draft_cover_is_kept_over_a_decode_only_backend():
    # each step of a draft graph is a one-token-per-request forward, whatever the draft's steps
    cover = GraphCover(forward_mode=ForwardMode.DRAFT, tokens_per_request=3, buckets=(1, 2))
    assert cover.attention_tokens == 1 and GraphSupport.DECODE_ONLY.covers_shape(cover.attention_tokens)
    assert GraphCover(forward_mode=ForwardMode.DECODE, tokens_per_request=3, buckets=(1,)).attention_tokens == 3

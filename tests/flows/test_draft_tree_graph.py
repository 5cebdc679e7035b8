"""Tree drafts (top-k > 1) through the draft graph runner: the whole loop over ``bs * topk`` rows per step as
one graph per bucket of requests, bitwise equal to the stepped draft, and a backend that reads no trees
refusing one by name."""

import pytest

from harness.backends.torch_native import TorchNativeBackend
from harness.check.run.assemble import assemble
from harness.runners.draft_graph import DraftGraphRunner
from harness.runspec import GraphSpec
from harness.serving.batch import ForwardMode
from harness.serving.timeline import RequestSpec, TimelineSpec

from ._flows import graph_equals_eager_bitwise, replace, spec_for


def tree_drafts(window: int) -> TimelineSpec:
    """Three requests in 2-branch, 2-step trees: draft batches of 3, 2 and 1 (padded buckets), accepting 0, 1 and
    2 tokens in turn, the last draft of a request shorter (stepped on the decode graphs)."""
    return TimelineSpec(
        requests=(
            RequestSpec(rid="a", prompt_len=window + 3, output_len=9),
            RequestSpec(rid="b", prompt_len=2, output_len=4),
            RequestSpec(rid="c", prompt_len=window - 1, output_len=6),
        ),
        draft_steps=2, draft_topk=2, accept_lens=(0, 1, 2), seed=29,
    )


def _spec(mode, **kw):
    return replace(spec_for("gpt-oss-mini", tree_drafts, mode, **kw), graphs=GraphSpec(decode_buckets=(2, 4, 8)))


@pytest.mark.parametrize("backend", ["torch_native", "torch_gather"])
def test_tree_draft_graph_replays_equal_stepped_tree_drafts_bitwise(backend):
    spec = _spec("full", backend=backend)
    graph_equals_eager_bitwise(spec)


def test_a_tree_draft_is_one_replay_bucketed_by_requests():
    session = assemble(_spec("full"))
    (runner,) = [r for r in session.runner.runners if isinstance(r, DraftGraphRunner)]
    assert runner.topk == 2 and runner.out_cache_loc.numel() == 8 * 2 * 2  # the largest bucket's rows x steps
    names = set()
    while (step := session.scheduler.next_step()) is not None:
        mark = len(session.runner.forward_log())
        session.run_batch(step.batch)
        graphs = [f.graph for f in session.runner.forward_log()[mark:]]
        if step.batch.forward_mode is ForwardMode.DRAFT and step.batch.draft_steps == 2:
            assert graphs[0].startswith("draft/") and graphs[1:] == ["eager"]  # the whole tree, then its verify
            names.add(graphs[0])
        session.scheduler.finish_step()
    assert names == {"draft/bs4x2", "draft/bs2x2"}  # 3 requests (6 rows) in the bucket of 4, then 2, and 1


class _NoTrees(TorchNativeBackend):
    name = "no_trees"
    draft_trees = False


def test_a_backend_that_reads_no_trees_refuses_a_tree_draft_by_name():
    session = assemble(_spec("eager"))
    backend = session.runner.eager.backend
    refusing = _NoTrees(**backend._made_with)
    while (step := session.scheduler.next_step()) is not None:
        if step.batch.forward_mode is ForwardMode.DRAFT:
            step.batch.draft_step = 0
            with pytest.raises(NotImplementedError, match="backend no_trees does not read a tree of drafts"):
                refusing.init_forward_metadata(step.batch)
            return
        session.run_batch(step.batch)
        session.scheduler.finish_step()
    pytest.fail("the timeline drafted no tree")


def test_a_tree_verify_is_never_replayed_on_a_chain_verify_graph():
    # near a request's end a tree of 2 branches drafts 1 step: its verify adds 1 + 2 * 1 = 3 tokens per request,
    # a 2-step chain verify's count, which the verify graphs were captured for without the tree mask
    from harness.runners.dispatch import BatchDescriptor, GraphCover

    cover = GraphCover(forward_mode=ForwardMode.TARGET_VERIFY, tokens_per_request=3, buckets=(2, 4))
    chain = BatchDescriptor(forward_mode=ForwardMode.TARGET_VERIFY, tokens_per_request=3, num_reqs=1, num_tokens=3)
    tree = BatchDescriptor(forward_mode=ForwardMode.TARGET_VERIFY, tokens_per_request=3, num_reqs=1, num_tokens=3,
                           tree_mask=True)
    assert cover.key_for(chain) is not None and cover.key_for(tree) is None

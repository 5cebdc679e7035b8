"""The target-verify graph runner: the verify of 1 + draft steps tokens per request as one full graph per bucket,
over a backend whose graphs capture uniform batches (torch_native), bitwise equal to the eager verify."""

import dataclasses

import pytest

from harness.check.run.assemble import assemble
from harness.runners.verify_graph import VerifyGraphRunner
from harness.runspec import GraphSpec
from harness.serving.batch import ForwardMode
from workloads import heterogeneous_drafts

from ._flows import graph_equals_eager_bitwise, replace, spec_for


def _verified(window: int, draft_extend: bool | str = False):
    return dataclasses.replace(heterogeneous_drafts(window), accept_lens=(1, 0, 2), draft_extend=draft_extend)


def _spec(mode, backend="torch_native", draft_extend=False, design="forward_batch"):
    spec = spec_for("gpt-oss-mini", lambda w: _verified(w, draft_extend), mode, design=design, backend=backend)
    return replace(spec, graphs=GraphSpec(decode_buckets=(2, 4)))


def _verify_runner(session) -> VerifyGraphRunner:
    (runner,) = [r for r in session.runner.runners if isinstance(r, VerifyGraphRunner)]
    return runner


@pytest.mark.parametrize("backend", ["torch_native", "torch_gather"])
@pytest.mark.parametrize("draft_extend", [False, True, "v2"])
def test_verify_graph_replays_equal_the_eager_verify_bitwise(draft_extend, backend):
    graph_equals_eager_bitwise(_spec("full", backend=backend, draft_extend=draft_extend))


def test_whole_verifies_replay_their_bucket_padded_ones_too_and_shorter_ones_run_eagerly():
    session = assemble(_spec("full", design="metadata"))
    verifies = []
    while (step := session.scheduler.next_step()) is not None:
        session.run_batch(step.batch)
        if step.batch.verify is not None:
            verifies.append((step.batch.draft_steps, step.batch.batch_size, session.runner.forward_log()[-1].graph))
        session.scheduler.finish_step()
    whole = {(bs, graph) for steps, bs, graph in verifies if steps == 2}
    # three requests in the bucket of four, then one in the bucket of two: both padded
    assert whole == {(3, "target_verify/bs4x3"), (1, "target_verify/bs2x3")}
    assert {graph for steps, _, graph in verifies if steps < 2} == {"eager"}
    runner = _verify_runner(session)
    assert runner.log.captures == 2 and runner.log.padded_replays >= 2
    assert session.runner.observations().findings == ()


@pytest.mark.parametrize("backend, verifies", [("torch_gather", True), ("torch_native", False)])
def test_no_verify_graphs_where_the_backend_cannot_capture_them_or_nothing_verifies(backend, verifies, monkeypatch):
    if verifies:
        # a backend whose graphs take decode batches only (flashinfer's and trtllm_mha's declaration)
        from harness.backends.base import GraphSupport
        from harness.backends.torch_gather import TorchGatherBackend

        monkeypatch.setattr(TorchGatherBackend, "graph_support", GraphSupport.DECODE_ONLY)
    spec = _spec("full", backend=backend)
    if not verifies:
        spec = replace(spec, timeline=heterogeneous_drafts(spec.model.window))
    session = assemble(spec)
    # the runner covers nothing, so the dispatcher keeps none of it
    assert not [r for r in session.runner.runners if isinstance(r, VerifyGraphRunner)]
    step = session.scheduler.next_step()
    while step.batch.forward_mode is not ForwardMode.DRAFT:
        session.run_batch(step.batch)
        session.scheduler.finish_step()
        step = session.scheduler.next_step()
    session.run_batch(step.batch)
    assert "target_verify" not in " ".join(f.graph or "" for f in session.runner.forward_log())


def test_each_draft_extend_after_a_verify_replays_the_graphs_of_its_length_and_the_prefills_run_eagerly():
    session = assemble(_spec("full", draft_extend=True))
    runner = _verify_runner(session)
    seen = []
    while (step := session.scheduler.next_step()) is not None:
        mark = len(session.runner.forward_log())
        session.run_batch(step.batch)
        ran = session.runner.forward_log()[mark:]
        if step.batch.verify is not None:
            accepted = step.batch.verify.accepted
            seen.append((1 + accepted, step.batch.batch_size, ran[-1].graph))
        else:
            assert ran[-1].graph == "eager" or step.batch.forward_mode is not ForwardMode.EXTEND
        session.scheduler.finish_step()
    assert runner.covers and seen
    for n, bs, graph in seen:
        bucket = 2 if bs <= 2 else 4
        assert graph == f"draft_extend/bs{bucket}" + (f"x{n}" if n > 1 else ""), (n, bs, graph)


def test_each_v2_draft_extend_replays_the_graph_of_the_verify_window_whatever_was_accepted():
    spec = _spec("full", draft_extend="v2")
    # whole verifies that accept none and all of their 2 drafts
    session = assemble(replace(spec, timeline=dataclasses.replace(spec.timeline, accept_lens=(0, 2, 1))))
    seen = []
    while (step := session.scheduler.next_step()) is not None:
        mark = len(session.runner.forward_log())
        session.run_batch(step.batch)
        ran = session.runner.forward_log()[mark:]
        if step.batch.verify is not None:
            # the verify, then the draft-extend over its window (both before the next step's batch)
            seen.append((step.batch.draft_steps, step.batch.verify.accepted, step.batch.batch_size,
                         ran[-2].graph, ran[-1].graph))
        session.scheduler.finish_step()
    whole = [(accepted, bs, graph) for steps, accepted, bs, _, graph in seen if steps == 2]
    assert {accepted for accepted, _, _ in whole} == {0, 2}
    for accepted, bs, graph in whole:
        assert graph == f"draft_extend/bs{2 if bs <= 2 else 4}x3", (accepted, bs, graph)
    # a request drafting up to its end verifies (and draft-extends) fewer tokens: eagerly, as its verify runs
    assert {(verify, graph) for steps, _, _, verify, graph in seen if steps < 2} == {("eager", "eager")}

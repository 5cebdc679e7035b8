"""SGLang's EAGLE target verify (top-k 1 chains) through its TRT-LLM MHA backend on the CPU: the verify input from
SGLang's chain-tree kernel, the ``TARGET_VERIFY`` ForwardBatch, the backend's eager verify metadata and its
target-verify graph metadata under SGLang's decode graph runner captured for ``TARGET_VERIFY``
(``harness/sglang/target_verify.py``). Each run is certified by the dense oracle, the replayed run is diffed slot
by slot against the eager one, and a fault of the verify graph's SWA metadata is flagged at the first replayed
verify."""

import dataclasses
import re
from pathlib import Path

import pytest

from harness.graphs import get_engine

ROOT = Path(__file__).resolve().parents[2]
VERIFY = [ROOT / "scenarios" / f"swa_spec_verify_accept_{name}.toml" for name in ("some", "all", "none")]
"""the library's chain verifies without a draft-extend: 3-step drafts of two requests, eviction on"""
TRTLLM = "trtllm_mha"


@pytest.fixture(scope="module", params=VERIFY, ids=lambda p: p.stem.removeprefix("swa_spec_verify_"))
def verify_runs(request, clean_spec, graph_runner, observed_trtllm_run):
    """``(spec, eager, graph)``: a verify scenario eagerly and under the TARGET_VERIFY graph runner, both observed
    and certified."""
    spec = clean_spec(request.param)
    return (spec, observed_trtllm_run(spec, None),
            observed_trtllm_run(spec, get_engine("tape")))


def test_the_eager_and_the_replayed_verifies_are_certified_by_the_dense_oracle(verify_runs):
    _, eager, graph = verify_runs
    assert eager.certification.ok, eager.certification.problems
    assert graph.certification.ok, graph.certification.problems
    assert eager.verifies, "the timeline ran no target verify"


def test_the_replayed_run_leaves_both_pools_as_the_eager_run_does(verify_runs, graph_runner):
    _, eager, graph = verify_runs
    assert graph_runner.kv_differences(eager, graph) == []


def test_sglangs_runner_captures_target_verify_of_the_drafts_width(verify_runs):
    spec, eager, graph = verify_runs
    assert graph.capture_mode == "target_verify"
    assert graph.captured == tuple(spec.graphs.decode_buckets)
    # the fused metadata kernel (cache_seqlens with seqlen_offset 1 + steps, page tables, SWA ids) is in-graph
    assert graph.rerun_ops == ("harness_sglang::trtllm_mha_graph_metadata",)
    width = 1 + spec.timeline.draft_steps
    assert [v.step for v in eager.verifies] == [v.step for v in graph.verifies]
    for v in graph.verifies:
        # can_run_graph: a verify of another width (a request's last, shorter draft) runs eagerly
        expected = min(b for b in graph.captured if b >= v.raw_bs) if v.tokens_per_req == width else None
        assert v.bucket == expected, v
    assert any(v.bucket is not None for v in graph.verifies)
    assert all(v.bucket is None for v in eager.verifies)


def test_every_verify_writes_its_swa_layers_at_its_own_translated_ids(verify_runs):
    """The verify's SWA window metadata (issue 22679, PR 29858): eagerly ``init_forward_metadata``'s write ids from
    the plan, in a graph the fused kernel's, each the translation of the verify's own out_cache_loc."""
    _, eager, graph = verify_runs
    for run in (eager, graph):
        for v in run.verifies:
            assert v.swa_out_cache_loc == v.planned_swa_out_cache_loc, v
            assert len(v.swa_out_cache_loc) == v.raw_bs * v.tokens_per_req
    assert [v.seq_lens for v in eager.verifies] == [v.seq_lens for v in graph.verifies]


def test_a_padded_verify_bucket_replays_to_the_eager_pools(clean_spec, graph_runner, observed_trtllm_run):
    """Verifies of two requests replayed in the graph of bucket 4: two padded requests of four tokens each, at the
    dummy slot and row."""
    spec = clean_spec(VERIFY[0])
    spec = dataclasses.replace(spec, graphs=dataclasses.replace(spec.graphs, decode_buckets=(4,)))
    eager = graph_runner.run_timeline(spec, engine=None, attention=TRTLLM)
    graph = observed_trtllm_run(spec, get_engine("tape"))
    assert {v.bucket for v in graph.verifies} - {None} == {4}
    assert all(v.raw_bs < 4 for v in graph.verifies)
    assert graph.certification.ok, graph.certification.problems
    assert graph_runner.kv_differences(eager, graph) == []


def test_verifies_of_three_requests_of_mixed_lengths_replay_padded_to_the_eager_pools(clean_spec, graph_runner,
                                                                                     observed_trtllm_run):
    """swa_spec_verify_graph_padded_buckets without its draft-extends (which the adapter refuses): verifies of three
    requests of different committed lengths in bucket 4 (one padded request), then of two and one in bucket 2,
    while eviction frees SWA slots; the shorter last verifies run eagerly."""
    spec = clean_spec(ROOT / "scenarios" / "swa_spec_verify_graph_padded_buckets.toml")
    spec = dataclasses.replace(spec, timeline=dataclasses.replace(spec.timeline, draft_extend=False))
    eager = graph_runner.run_timeline(spec, engine=None, attention=TRTLLM)
    graph = observed_trtllm_run(spec, get_engine("tape"))
    assert (3, 4) in {(v.raw_bs, v.bucket) for v in graph.verifies}
    assert any(v.bucket is None for v in graph.verifies)
    assert graph.certification.ok, graph.certification.problems
    assert graph_runner.kv_differences(eager, graph) == []


def test_the_verify_graphs_swa_metadata_not_refreshed_is_flagged_at_the_first_replayed_verify(
        clean_spec, graph_runner, observed_trtllm_run):
    from harness.sglang import trtllm_faults

    spec = clean_spec(VERIFY[0])
    eager = graph_runner.run_timeline(spec, engine=None, attention=TRTLLM)
    with trtllm_faults.verify_graph_swa_metadata_not_refreshed():
        faulty = observed_trtllm_run(spec, get_engine("tape"))
    replayed = [v for v in faulty.verifies if v.bucket is not None]
    assert replayed
    # the replays wrote their SWA layers at the capture batch's ids (the dummy slot), not the plan's
    assert all(set(v.swa_out_cache_loc) == {0} != set(v.planned_swa_out_cache_loc) for v in replayed)
    assert {d.pool for d in graph_runner.kv_differences(eager, faulty)} >= {"swa"}
    found = faulty.certification
    assert not found.ok
    first = int(re.match(r"step (\d+) ", found.problems[0]).group(1))
    assert first == replayed[0].step, found.problems[0]
    # the draft steps before it (plain decodes) and every eager forward are untouched: the fault-off run
    # matches (test_the_replayed_run_leaves_both_pools_as_the_eager_run_does)


def test_an_eager_verify_whose_swa_page_table_misses_the_draft_is_flagged_at_the_first_verify(
        clean_spec, graph_runner, observed_trtllm_run):
    """The dense oracle certifies the eager verify path itself: with the SWA page table built over the committed
    tokens only, every SWA layer of the first verify reads the dummy page for its draft tokens' keys."""
    from harness.sglang import trtllm_faults

    spec = clean_spec(VERIFY[0])
    with trtllm_faults.verify_swa_page_table_without_draft_tokens():
        faulty = observed_trtllm_run(spec, None)
    found = faulty.certification
    assert not found.ok and found.max_hidden_error > 0, found
    first = int(re.match(r"step (\d+) ", found.problems[0]).group(1))
    assert first == faulty.verifies[0].step, found.problems[0]
    # its write ids are untouched: only the read of the SWA layers went astray
    assert all(v.swa_out_cache_loc == v.planned_swa_out_cache_loc for v in faulty.verifies)


@pytest.mark.parametrize("scenario, refused", [
    ("swa_spec_draft_extend_accept_some", "draft-extend"),
    ("swa_spec_tree_accept_some", "top-k 1"),
    ("swa_spec_draft_after_prefill", "without a verify"),
], ids=["draft-extend-v1", "tree", "unverified"])  # ids without scenario names: -k <family> selects scenarios only
def test_speculative_timelines_the_adapter_does_not_drive_are_refused_by_name(clean_spec, graph_runner, scenario,
                                                                             refused):
    with pytest.raises(ValueError, match=refused):
        graph_runner.run_timeline(clean_spec(ROOT / "scenarios" / f"{scenario}.toml"), attention=TRTLLM)

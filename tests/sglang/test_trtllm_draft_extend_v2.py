"""SGLang's ``DRAFT_EXTEND_V2`` (the draft-extend of its 0.5.23 EAGLE worker) through its TRT-LLM MHA backend on the
CPU, eagerly, after each target verify (``timeline.draft_extend = "v2"``): the batch from SGLang's draft-extend
layout kernel over the verify's window, the backend's eager ``init_forward_metadata`` and ``forward_extend``'s
decode-kernel path, run before the verify's rejected slots are freed (``harness/sglang/target_verify.py``,
``graph_runner._draft_extend_v2``). Each run is certified by the dense oracle, the run whose verifies replay
SGLang's TARGET_VERIFY graphs is diffed slot by slot against the eager one, and a fault of the draft-extend's SWA
page table is flagged at the first draft-extend."""

import re
from pathlib import Path

import pytest
import torch

from harness.graphs import get_engine

ROOT = Path(__file__).resolve().parents[2]
V2 = ROOT / "scenarios" / "swa_spec_draft_extend_v2_accept_mixed.toml"
"""3-step drafts of two requests, verifies accepting 0, 2 and 3 drafts, eviction on, an SWA pool of 32"""
TRTLLM = "trtllm_mha"


@pytest.fixture(scope="module")
def v2_runs(clean_spec, graph_runner, observed_trtllm_run):
    """``(spec, eager, graph)``: the V2 scenario eagerly and with its verifies under the TARGET_VERIFY graph runner
    (the draft-extends eager in both), observed and certified."""
    spec = clean_spec(V2)
    return (spec, observed_trtllm_run(spec, None),
            observed_trtllm_run(spec, get_engine("tape")))


def test_sglangs_layout_kernel_lays_the_draft_extend_over_the_verify_window():
    from harness.sglang.target_verify import draft_extend_layout

    prefix, extend, post, positions, starts = draft_extend_layout(torch.tensor([5, 3]), 4)
    assert prefix.tolist() == [5, 3] and extend.tolist() == [4, 4] and post.tolist() == [9, 7]
    assert positions.tolist() == [5, 6, 7, 8, 3, 4, 5, 6] and starts.tolist() == [0, 4]


def test_the_eager_and_the_replayed_runs_are_certified_by_the_dense_oracle(v2_runs):
    _, eager, graph = v2_runs
    assert eager.certification.ok, eager.certification.problems
    assert graph.certification.ok, graph.certification.problems


def test_each_verify_is_followed_by_a_draft_extend_over_its_window_before_the_frees(v2_runs):
    spec, eager, graph = v2_runs
    for run in (eager, graph):
        assert [d.step for d in run.draft_extends] == [v.step for v in run.verifies] != []
        for verify, extend in zip(run.verifies, run.draft_extends, strict=True):
            # the verify's whole window (its 1 + steps tokens per request), whatever it accepted
            assert extend.tokens_per_req == verify.tokens_per_req and extend.raw_bs == verify.raw_bs
            # cache_seqlens: committed length plus the window, as the verify's
            assert extend.seq_lens == verify.seq_lens
            # written at the verify's SWA ids, translated while every verify slot was still held
            assert extend.swa_out_cache_loc == extend.planned_swa_out_cache_loc == verify.planned_swa_out_cache_loc
            assert extend.rejected_held, extend
        whole = {d.accepted for d in run.draft_extends if d.tokens_per_req == 1 + spec.timeline.draft_steps}
        assert whole == {0, 2, 3}


def test_the_run_with_replayed_verifies_leaves_both_pools_as_the_eager_run_does(v2_runs, graph_runner):
    _, eager, graph = v2_runs
    assert any(v.bucket is not None for v in graph.verifies)
    assert graph_runner.kv_differences(eager, graph) == []


def test_a_draft_extend_whose_swa_page_table_misses_the_window_is_flagged_at_the_first_draft_extend(
        clean_spec, graph_runner, observed_trtllm_run):
    from harness.sglang import trtllm_faults

    spec = clean_spec(V2)
    with trtllm_faults.draft_extend_v2_swa_page_table_without_window():
        faulty = observed_trtllm_run(spec, None)
    found = faulty.certification
    assert not found.ok, found
    first = int(re.match(r"step (\d+) ", found.problems[0]).group(1))
    assert first == faulty.draft_extends[0].step, found.problems[0]
    # only the read of its SWA layers went astray: its writes and the verifies' are where they were planned
    assert all(d.swa_out_cache_loc == d.planned_swa_out_cache_loc for d in faulty.draft_extends)
    assert all(v.swa_out_cache_loc == v.planned_swa_out_cache_loc for v in faulty.verifies)

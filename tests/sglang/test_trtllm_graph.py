"""SGLang's TRTLLMHAAttnBackend under SGLang's DecodeCudaGraphRunner on the tape: its own graph state, capture and
replay metadata (SGLang's Triton kernels in Triton's interpreter), page tables and SWA page tables, its KV
writes; both pools diffed slot by slot against an eager run of the same SGLang code; the re-created faults
flagged where they act."""

import contextlib
from pathlib import Path

import pytest

from harness.graphs import get_engine
from harness.sglang import differential

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = sorted((ROOT / "scenarios").glob("*.toml"))
DECODE_LIBRARY = [p for p in LIBRARY if '"decode"' in p.read_text()]
"""the library's decode scenarios (tagged so); all of them the SGLang target can express replay to the eager
pools through the TRT-LLM backend (measured: docs/sglang-graphs.md)"""

TRTLLM = "trtllm_mha"


@pytest.fixture(scope="module")
def faults():
    from harness.sglang import trtllm_faults

    return trtllm_faults


@pytest.fixture(scope="module")
def padded(trtllm_runs):
    """swa_decode_padded_buckets (buckets 1, 2, 4; decode batches of 4, 3, 2 and 1) through the TRT-LLM backend:
    eager, and replayed."""
    return trtllm_runs(ROOT / "scenarios" / "swa_decode_padded_buckets.toml")


def test_the_eager_reference_is_certified_by_the_dense_oracle(padded):
    _, eager, _ = padded
    assert eager.certification.ok, eager.certification.problems


def test_the_dense_oracle_flags_an_eager_run_whose_swa_writes_went_astray(padded, graph_runner, oracle_certifier):
    # the installed translator serving the previous iteration's SWA ids: the TRT-LLM backend writes its SWA
    # layers where the plan of the iteration before said, so live tokens' SWA slots do not hold their K/V
    from harness.sglang import faults as sglang_faults

    spec, _, _ = padded
    observe, certification = oracle_certifier(spec)
    with sglang_faults.reuse_previous_plan():
        graph_runner.run_timeline(spec, engine=None, attention=TRTLLM, observe=observe)
    found = certification()
    assert not found.ok and found.max_kv_error > 0, found


def _faulty(graph_runner, spec, fault):
    with fault():
        return graph_runner.run_timeline(spec, engine=get_engine("tape"), attention=TRTLLM)


def test_the_runner_captures_every_bucket_over_the_trtllm_backend(padded):
    spec, _, graph = padded
    assert graph.captured == tuple(spec.graphs.decode_buckets) == (1, 2, 4)
    assert graph.regions == 3
    assert graph.backend == "FullCudaGraphBackend"
    assert graph.attention == "TRTLLMHAAttnBackend"


def test_sglangs_metadata_kernel_is_recorded_in_every_graph_and_rerun_at_replay(padded):
    _, eager, graph = padded
    # the fused metadata kernel (cache_seqlens, page tables, SWA write ids) is the in-graph hook's work
    assert graph.rerun_ops == ("harness_sglang::trtllm_mha_graph_metadata",)
    assert eager.rerun_ops == ()


def test_each_batch_replays_the_smallest_bucket_with_sglangs_padding(padded):
    _, _, graph = padded
    assert sorted({d.raw_bs for d in graph.decodes}) == [1, 2, 3, 4]
    for d in graph.decodes:
        assert d.bucket == min(b for b in graph.captured if b >= d.raw_bs)
        assert d.padded_out_cache_loc[d.raw_bs:] == (0,) * (d.bucket - d.raw_bs)
        # the TRT-LLM backend's fill value for padded rows' seq_lens
        assert d.padded_seq_lens[d.raw_bs:] == (1,) * (d.bucket - d.raw_bs)
        assert d.padded_req_pool_indices[d.raw_bs:] == (0,) * (d.bucket - d.raw_bs)


def test_the_replayed_run_leaves_both_pools_as_the_eager_run_does(padded, graph_runner):
    _, eager, graph = padded
    assert graph_runner.kv_differences(eager, graph) == []
    written = eager.stack.kv_buffers()
    assert all(bool(t[1:].abs().sum() > 0) for group in written.buffers for t in group.k), "nothing was written"


def test_the_eager_trtllm_run_agrees_with_the_torch_native_backend(padded, graph_runner):
    """Two SGLang backends over the same pools, one reading through page tables and the FlashInfer stand-ins,
    the other through req_to_token: the same K/V in every slot, so the stand-in attention is not what matches."""
    spec, eager, _ = padded
    torch_native = graph_runner.run_timeline(spec, engine=None)
    assert graph_runner.kv_differences(eager, torch_native, atol=1e-4) == []


def test_metadata_not_refreshed_on_replay_is_flagged_in_both_pools(padded, graph_runner, faults):
    spec, eager, _ = padded
    faulty = _faulty(graph_runner, spec, faults.metadata_not_refreshed_on_replay)
    pools = {d.pool for d in graph_runner.kv_differences(eager, faulty)}
    # every replay writes the SWA layers at the capture batch's ids and reads the capture batch's lengths
    assert pools == {"full", "swa"}
    assert faulty.rerun_ops == ()  # nothing of the metadata is in the graphs


def test_the_padded_tail_of_the_static_swa_ids_left_stale_is_flagged_in_the_swa_pool(padded, graph_runner, faults):
    """PR 24743: the first batch of 3 in bucket 4 pads its SWA write ids with the batch of 4's fourth id."""
    spec, eager, _ = padded
    faulty = _faulty(graph_runner, spec, faults.swa_pad_tail_left_stale)
    differences = graph_runner.kv_differences(eager, faulty)
    assert any(d.pool == "swa" for d in differences)
    # with the tail zeroed (the fault off) the same timeline matches: test_the_replayed_run_leaves_both_pools...


def test_the_swa_location_not_preset_before_capture_is_refused_by_the_pool_at_capture(padded, graph_runner, faults):
    """PR 23552: the captured forward has no SWA write location; 0.5.23's SWAKVPool asserts one for SWA layers."""
    spec, _, _ = padded
    with pytest.raises(AssertionError) as info:
        _faulty(graph_runner, spec, faults.swa_loc_not_preset_before_capture)
    assert info.traceback[-1].path.name == "swa_memory_pool.py"


def test_a_padded_out_cache_loc_row_left_at_a_live_slot_is_flagged_in_both_pools(padded, graph_runner):
    spec, eager, _ = padded
    faulty = _faulty(graph_runner, spec, graph_runner.padded_out_cache_loc_left_stale)
    stale = {s for d in faulty.decodes for s in d.padded_out_cache_loc[d.raw_bs:] if s != 0}
    assert stale
    differences = graph_runner.kv_differences(eager, faulty)
    assert stale <= {d.slot for d in differences if d.pool == "full"}
    assert any(d.pool == "swa" for d in differences)  # the kernel translates the live slot: its SWA slot too


def test_the_pre_fix_layer_cache_loc_matches_in_a_synchronous_run(padded, graph_runner, faults, monkeypatch):
    """The seed's per-layer translation of out_cache_loc reads the live mapping where 0.5.23 reads the planned
    ids; on one thread nothing changes the mapping between the plan and the forward, so the pools match (the
    race it loses needs the overlap scheduler's ordering, where test_overlap.py flags it)."""
    from harness.sglang.installed import load

    spec, eager, _ = padded
    pool_cls = load().SWAKVPool
    calls = []
    translate = pool_cls.translate_loc_from_full_to_swa
    monkeypatch.setattr(pool_cls, "translate_loc_from_full_to_swa",
                        lambda self, loc: calls.append(1) or translate(self, loc))
    clean = _faulty(graph_runner, spec, contextlib.nullcontext)
    clean_calls = len(calls)
    faulty = _faulty(graph_runner, spec, faults.prefix_layer_cache_loc)
    # the fault acts: every SWA layer's write translated again (eager forwards and captures; replays run no Python)
    sw_layers = sum(1 for w in spec.model.layer_is_swa if w)
    assert len(calls) - clean_calls >= sw_layers * (len(faulty.captured) + 1)
    assert graph_runner.kv_differences(eager, faulty) == graph_runner.kv_differences(eager, clean) == []


PREFILL_TOKENS = (4, 16, 64)
"""the library's extend batches (3 to 37 tokens) each fit one within SGLang's padding factor of 2"""


@pytest.mark.parametrize("name", ["swa_decode_padded_buckets", "swa_mixed_decode_prefill_decode"],
                         ids=lambda n: n.replace("_", "-"))  # hyphens: -k <family> keeps to scenario items
def test_the_prefill_runner_replays_every_extend_batch_to_the_eager_pools(name, graph_runner, trtllm_runs):
    """SGLang's PrefillCudaGraphRunner over its breakable backend (graph segments between eager attention calls),
    the TRT-LLM backend's extend path at each break, and the decode runner for the decode batches."""
    spec, eager, _ = trtllm_runs(ROOT / "scenarios" / f"{name}.toml")
    graph = graph_runner.run_timeline(spec, engine=get_engine("tape"), attention=TRTLLM,
                                      prefill_tokens=PREFILL_TOKENS)
    assert graph.prefill_captured == PREFILL_TOKENS
    assert graph.prefills and all(p.replayed for p in graph.prefills)
    # one region per bucket, and per prefill shape one segment per stretch between attention calls
    assert graph.regions > len(graph.captured) + len(PREFILL_TOKENS)
    assert graph_runner.kv_differences(eager, graph) == []


def test_the_prefill_runner_is_refused_over_the_torch_native_subclass(graph_runner, padded):
    spec, _, _ = padded
    with pytest.raises(ValueError, match="trtllm_mha backend only"):
        graph_runner.run_timeline(spec, engine=get_engine("tape"), prefill_tokens=PREFILL_TOKENS)


@pytest.mark.parametrize("path", DECODE_LIBRARY, ids=lambda p: p.stem.replace("_", "-"))
def test_every_library_decode_timeline_replays_through_trtllm_to_the_eager_pools(path, graph_runner, trtllm_runs,
                                                                                 clean_spec):
    spec = clean_spec(path)
    reason = differential.not_expressible(spec)
    if reason is not None:
        pytest.skip(f"not expressible against SGLang 0.5.23: {reason}")
    if spec.timeline.draft_steps:
        pytest.skip("draft (speculative) batches: the decode runner's TARGET_VERIFY / draft paths are not adapted")
    _, eager, graph = trtllm_runs(path)
    # the eager run of SGLang's code is the reference, so the dense oracle certifies it first
    assert eager.certification.ok, eager.certification.problems
    assert graph.captured == tuple(sorted(spec.graphs.decode_buckets))
    assert all((d.bucket is None) == (d.raw_bs > max(graph.captured)) for d in graph.decodes)
    assert any(d.bucket is not None for d in graph.decodes)
    assert graph_runner.kv_differences(eager, graph) == []

"""SGLang's own DecodeCudaGraphRunner on the tape: constructed over the stand-in model runner, capturing every
bucket through its unchanged FullCudaGraphBackend, replaying each decode batch with its own padding, and
leaving both pools as an eager run of the same SGLang code leaves them."""

from pathlib import Path

import pytest
import torch

from harness.graphs import CaptureError, get_engine
from harness.sglang import differential

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = sorted((ROOT / "scenarios").glob("**/*.toml"))

# the installed torch-native backend's extend read indexes an SWA layer's buffer with full-pool ids
# (torch_native_read.py): once the mapping leaves the identity with a full id past the SWA pool, the eager
# prefill itself raises, in both runs
EAGER_EXTEND_RAISES = {"swa_mixed_continuous_batching", "swa_evict_skipped_mid_prefill",
                       "swa_decode_pad_tail_not_zeroed",
                       # prefix-cache timelines (SGLang's radix tree since it runs them): a full id past the
                       # SWA pool reaches an extend's read the same way
                       "swa_prefix_branch_tail_evicted", "swa_prefix_match_len_not_reset",
                       "swa_prefix_sglang_pages_of_4"}


def _path(name: str):
    return next(p for p in LIBRARY if p.stem == name)


@pytest.fixture(scope="module")
def padded(graph_runner, clean_spec):
    """swa_decode_padded_buckets (buckets 1, 2, 4; decode batches of 4, 3, 2 and 1): eager and replayed."""
    spec = clean_spec(_path("swa_decode_padded_buckets"))
    tape = get_engine("tape")
    return spec, graph_runner.run_timeline(spec, engine=None), graph_runner.run_timeline(spec, engine=tape)


def test_the_runner_captures_every_bucket_of_the_scenario_as_one_region_each(padded):
    spec, _, graph = padded
    assert graph.captured == tuple(spec.graphs.decode_buckets) == (1, 2, 4)
    assert graph.regions == 3
    assert graph.backend == "FullCudaGraphBackend"


def test_each_decode_batch_replays_the_smallest_bucket_that_holds_it_with_padded_rows_at_the_dummy_slot(padded):
    _, eager, graph = padded
    assert graph.decodes and all(d.bucket is not None for d in graph.decodes)
    raw = sorted({d.raw_bs for d in graph.decodes})
    assert raw == [1, 2, 3, 4]
    for d in graph.decodes:
        assert d.bucket == min(b for b in graph.captured if b >= d.raw_bs)
        assert len(d.padded_out_cache_loc) == d.bucket
        # SGLang's registry pads out_cache_loc with the dummy slot 0; the real rows are the batch's own slots
        assert d.padded_out_cache_loc[d.raw_bs:] == (0,) * (d.bucket - d.raw_bs)
        assert 0 not in d.padded_out_cache_loc[: d.raw_bs]
        # padded rows: seq_len the backend's fill value (1), request row 0
        assert d.padded_seq_lens[d.raw_bs:] == (1,) * (d.bucket - d.raw_bs)
        assert d.padded_req_pool_indices[d.raw_bs:] == (0,) * (d.bucket - d.raw_bs)
        assert all(n > 1 for n in d.padded_seq_lens[: d.raw_bs])
    assert eager.decodes == [] and eager.regions == 0


def test_the_replayed_run_leaves_both_pools_as_the_eager_run_does(padded, graph_runner):
    _, eager, graph = padded
    assert graph_runner.kv_differences(eager, graph) == []
    written = eager.stack.kv_buffers()
    assert all(bool(t[1:].abs().sum() > 0) for group in written.buffers for t in group.k), "nothing was written"


def test_swa_ids_left_at_their_capture_values_are_flagged_in_the_swa_pool(padded, graph_runner):
    spec, eager, _ = padded
    with graph_runner.swa_ids_filled_at_capture_only():
        faulty = graph_runner.run_timeline(spec, engine=get_engine("tape"))
    differences = graph_runner.kv_differences(eager, faulty)
    assert any(d.pool == "swa" for d in differences)
    # the capture batch's SWA ids are the runner's dummy rows: every replay wrote its SWA layers at slot 0,
    # which no eager forward writes
    assert bool(faulty.stack.kv_buffers()["swa"].k[0][0].abs().sum() > 0)
    assert bool(eager.stack.kv_buffers()["swa"].k[0][0].abs().sum() == 0)


def test_a_padded_out_cache_loc_row_left_at_a_live_slot_is_flagged_where_it_wrote(padded, graph_runner):
    spec, eager, _ = padded
    with graph_runner.padded_out_cache_loc_left_stale():
        faulty = graph_runner.run_timeline(spec, engine=get_engine("tape"))
    stale = {s for d in faulty.decodes for s in d.padded_out_cache_loc[d.raw_bs:] if s != 0}
    assert stale, "no padded row kept an earlier batch's slot"
    differences = graph_runner.kv_differences(eager, faulty)
    assert stale <= {d.slot for d in differences if d.pool == "full"}


def test_the_installed_torch_native_backend_has_no_graph_state(graph_runner, clean_spec):
    from harness.serving.model import SyntheticModel
    from harness.sglang.graph_runner import _stack
    from harness.sglang.installed import load
    from harness.sglang.model_runner import harness_model_runner

    spec = differential.comparable_spec(clean_spec(_path("swa_decode_padded_buckets")))
    runner = harness_model_runner(stack=_stack(spec), model=SyntheticModel(spec.model),
                                  attn_backend_cls=load().TorchNativeAttnBackend)
    with pytest.raises(NotImplementedError):
        runner.attn_backend.init_cuda_graph_state(4, 4)
    with pytest.raises(NotImplementedError):
        runner.attn_backend.get_cuda_graph_seq_len_fill_value()


def test_the_installed_torch_native_decode_read_is_refused_in_capture(graph_runner):
    """Its own _run_sdpa_forward_decode slices req_to_token by a device length: a host sync."""
    from harness.sglang.installed import load

    api = load()
    backend = object.__new__(graph_runner._graph_torch_native_class())
    read = api.TorchNativeAttnBackend._run_sdpa_forward_decode
    q, out = torch.zeros(1, 1, 4), torch.zeros(1, 1, 4)
    cache = torch.zeros(4, 1, 4)
    with get_engine("tape").run():
        with pytest.raises(CaptureError, match="_local_scalar_dense"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                read(backend, q, out, cache, cache, torch.zeros(1, 4, dtype=torch.int32),
                     torch.zeros(1, dtype=torch.int64), torch.ones(1, dtype=torch.int64), scaling=1.0)


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: p.stem.replace("_", "-"))
def test_every_library_decode_timeline_replays_to_the_eager_pools(path, graph_runner, clean_spec):
    spec = clean_spec(path)
    reason = differential.not_expressible(spec)
    if reason is not None:
        pytest.skip(f"not expressible against SGLang 0.5.23: {reason}")
    if spec.timeline.draft_steps:
        pytest.skip("speculative timelines run over trtllm_mha only (test_trtllm_verify.py), not this backend")
    if path.stem in EAGER_EXTEND_RAISES:
        with pytest.raises(IndexError):
            graph_runner.run_timeline(spec, engine=None)
        return
    eager = graph_runner.run_timeline(spec, engine=None)
    graph = graph_runner.run_timeline(spec, engine=get_engine("tape"))
    if not graph.decodes:
        pytest.skip("the timeline has no decode batch")
    # a batch larger than every bucket runs eagerly (can_run_graph says no); every other one replays
    assert all((d.bucket is None) == (d.raw_bs > max(graph.captured)) for d in graph.decodes)
    assert any(d.bucket is not None for d in graph.decodes)
    assert graph_runner.kv_differences(eager, graph) == []

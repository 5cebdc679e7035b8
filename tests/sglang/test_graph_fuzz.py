"""The graph-runner fuzz property: generated decode timelines through SGLang's own DecodeCudaGraphRunner over its
TRT-LLM MHA backend, replayed on the tape, against the eager run of the same code (certified by the dense oracle).

A short clean search finds nothing; each re-created fault of SGLang's graph path that the search is pointed at is
found, shrunk to a readable timeline, written once as a scenario file, and the file replays it (with its fault it
fails the same way, without it it holds). The false alarm the search found first is kept as a seed."""

import dataclasses

import pytest

from harness.cli import main
from harness.runspec import GraphSpec, Mode, RunSpec
from harness.scenario.loader import load_scenario
from harness.serving.eviction import EvictionSpec
from harness.serving.model_spec import model_spec
from harness.serving.pool_spec import PoolSpec
from harness.serving.timeline import RequestSpec, TimelineSpec
from harness.sglang import graph_fuzz


@pytest.mark.slow
def test_a_short_clean_search_finds_nothing():
    report = graph_fuzz.fuzz_graph_runner(budget_s=600, seed=0, database=None, max_examples=8)
    assert report.tried >= 8
    assert report.findings == (), "\n".join(f.describe() for f in report.findings)


def _one_request_alone_in_bucket_2(fault=None) -> graph_fuzz.GraphCase:
    # the first false alarm: one request decoding alone, padded to bucket 2 (no bucket of 1), once another finished
    requests = (RequestSpec(rid="a", prompt_len=1, output_len=12), RequestSpec(rid="b", arrive=3, prompt_len=2,
                                                                               output_len=5))
    spec = RunSpec(model=model_spec("gpt-oss-mini"), pool=PoolSpec(full_size=24, swa_size=24, free_order="fifo"),
                   timeline=TimelineSpec(requests=requests), design="forward_batch", mode=Mode.FULL,
                   graphs=GraphSpec(decode_buckets=(2,)), eviction=EvictionSpec(policy="sglang", interval=1))
    return graph_fuzz.GraphCase(spec=spec, fault=fault)


def test_a_batch_of_one_in_a_padded_bucket_replays_to_the_eager_pools():
    # the TRT-LLM stand-in's einsum took another GEMM path for one request than for the bucket's two rows
    assert graph_fuzz.judge(_one_request_alone_in_bucket_2()) is None


def test_sglangs_radix_attention_reads_a_window_of_one_token_as_no_window():
    # the finding the first clean search made (docs/findings.md): RadixAttention keeps `sliding_window_size or -1`,
    # so a layer that attends to its own token alone (SGLang's sliding_window_size 0) attends to every key; the
    # eager run of SGLang's code then disagrees with the dense oracle from the first prefill. A fixed SGLang fails
    # this test, and the property's filter (graph_fuzz.one_token_window) can go.
    from harness.sglang.installed import load

    load()
    from sglang.srt.layers.radix_attention import RadixAttention

    assert RadixAttention(4, 16, scaling=0.25, num_kv_heads=2, layer_id=0, sliding_window_size=0).sliding_window_size == -1
    case = _one_request_alone_in_bucket_2()
    narrow = dataclasses.replace(case.spec.model, layer_windows=(1, None, 1, None))
    case = dataclasses.replace(case, spec=dataclasses.replace(case.spec, model=narrow))
    assert graph_fuzz.one_token_window(case.spec) is not None
    failure = graph_fuzz.judge(case)
    assert failure is not None and failure.kind == "the reference is not certified", failure
    # the first token with a key besides its own, which it must not read: a@1 (a prompt of one token)
    assert failure.message.startswith("step 1 ") and "(a@1)" in failure.message.split(";")[0], failure.message


def test_a_stale_padded_tail_of_the_static_swa_ids_fails_that_case():
    failure = graph_fuzz.judge(_one_request_alone_in_bucket_2("swa_pad_tail_left_stale"))
    assert failure is not None and failure.signature == "the replay differs in the swa pool", failure


def _a_verified_draft(fault=None) -> graph_fuzz.GraphCase:
    # the verify-graph fault's first shrunk finding (seed 0): one-step drafts, none accepted, three requests in a
    # bucket of one, so every verify of the width replays the TARGET_VERIFY graph
    requests = (RequestSpec(rid="r0", prompt_len=1), RequestSpec(rid="r1", prompt_len=1, output_len=2),
                RequestSpec(rid="r2", prompt_len=1))
    spec = RunSpec(model=model_spec("gpt-oss-mini"), pool=PoolSpec(full_size=4, swa_size=4, free_order="fifo"),
                   timeline=TimelineSpec(requests=requests, draft_steps=1, accept_lens=(0,)), design="forward_batch",
                   mode=Mode.FULL, graphs=GraphSpec(decode_buckets=(1,)),
                   eviction=EvictionSpec(policy="sglang", interval=1))
    return graph_fuzz.GraphCase(spec=spec, fault=fault)


def test_a_drawn_chain_draft_is_verified_through_sglangs_verify_graph_and_holds():
    case = _a_verified_draft()
    assert graph_fuzz.judge(case) is None


def test_the_verify_graphs_stale_swa_metadata_fails_a_verified_draft_and_names_the_verify_buckets():
    failure = graph_fuzz.judge(_a_verified_draft("verify_graph_swa_metadata_not_refreshed"))
    assert failure is not None and failure.kind == "the replay differs", failure
    assert "verify buckets replayed: [1]" in failure.message, failure.message


def test_the_property_keeps_a_verified_chain_and_drops_what_the_verify_path_refuses():
    base = _a_verified_draft().spec
    requests = base.timeline.requests

    def timeline_of(**kwargs):
        return graph_fuzz.runnable(dataclasses.replace(base, timeline=TimelineSpec(requests=requests, **kwargs))).timeline

    kept = timeline_of(draft_steps=3, accept_lens=(0, 2))
    assert (kept.draft_steps, kept.accept_lens, kept.draft_topk) == (3, (0, 2), 1)
    tree = timeline_of(draft_steps=2, draft_topk=2, accept_lens=(1,))
    assert (tree.draft_steps, tree.draft_topk, tree.accept_lens) == (2, 1, (1,))
    extended = timeline_of(draft_steps=3, accept_lens=(1,), draft_extend=True)
    assert (extended.draft_steps, extended.draft_extend) == (3, False)
    v2 = timeline_of(draft_steps=3, accept_lens=(1,), draft_extend="v2")
    assert (v2.draft_steps, v2.draft_extend) == (3, "v2")
    unverified = timeline_of(draft_steps=3)
    assert (unverified.draft_steps, unverified.accept_lens) == (0, ())
    assert graph_fuzz.runnable(base).eviction == EvictionSpec(policy="sglang", interval=1)


@pytest.mark.slow
@pytest.mark.parametrize("fault, signature", [
    ("metadata_not_refreshed_on_replay", "the replay differs in the full and swa pools"),
    ("swa_loc_not_preset_before_capture", "raised: the replayed run raised AssertionError: "),
])
def test_a_fault_of_sglangs_graph_path_is_found_shrunk_written_once_and_replayed(fault, signature, tmp_path):
    report = graph_fuzz.fuzz_graph_runner(budget_s=600, fault=fault, seed=0, database=None, multiple=False,
                                          max_examples=30, shrink_examples=40)
    assert report.first_failure is not None, f"nothing found in {report.tried} examples"
    (finding,) = report.findings
    assert finding.signature == signature, finding.describe()
    shrunk = finding.case.spec.timeline
    assert len(shrunk.requests) <= 2 and all(r.prompt_len <= 4 and r.output_len <= 4 for r in shrunk.requests), \
        finding.describe()
    path = graph_fuzz.write_finding(finding, folder=tmp_path, command=graph_fuzz.command(seed=0, fault=fault))
    assert path is not None and graph_fuzz.write_finding(finding, folder=tmp_path, command="again") is None
    case = graph_fuzz.case_of(load_scenario(path))
    assert case.fault == fault
    again = graph_fuzz.judge(case)
    assert again is not None and again.signature == signature
    assert graph_fuzz.judge(dataclasses.replace(case, fault=None)) is None


@pytest.mark.parametrize("argv, error", [
    (["--target", "sglang-graph", "--fault", "no_such_fault"], "is not a fault of SGLang's graph path"),
    (["--target", "sglang-graph", "--fault", "swa_pad_tail_left_stale", "--fault", "swa_pad_tail_left_stale"],
     "one --fault at a time"),
    (["--target", "sglang-differential", "--fault", "swa_pad_tail_left_stale"], "takes no --fault"),
])
def test_bad_graph_fuzz_options_are_one_line_errors(argv, error, capsys):
    try:
        rc = main(["fuzz", "--budget", "1", *argv])
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and error in err, err

"""SGLang's overlap-scheduler ordering under its decode graph runner over the TRT-LLM backend: the next iteration's
scheduler work (frees, the next batch's allocation) runs inside the replay, where the runner's in-graph read-done
marker sits (the backend's ``shared_read_ends`` for decode: ``IN_REPLAY``), and every forward's write locations are
audited against what its batch was built with. The seed's pre-fix ``_get_layer_cache_loc`` (a per-layer gather of
the live mapping) is flagged there and nowhere else (docs/sglang-graphs.md, "The overlap scheduler's ordering")."""

from pathlib import Path

import pytest
import torch

from harness.graphs import get_engine

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
REALLOCATED = HERE / "overlap_scenarios" / "swa_trtllm_overlap_slot_reallocated.toml"
ABORTED = HERE / "overlap_scenarios" / "swa_trtllm_overlap_abort.toml"
TRTLLM = "trtllm_mha"


@pytest.fixture(scope="module")
def reallocated(clean_spec, graph_runner):
    """The full-pool timeline (a and b finish in step 3's replay; c's prefill takes their slots): the eager
    reference, and replayed under the overlap ordering with the fault off and on, and on in the synchronous
    ordering; each replayed run audited."""
    from harness.sglang import trtllm_faults

    spec = clean_spec(REALLOCATED)
    tape = get_engine("tape")
    eager = graph_runner.run_timeline(spec, attention=TRTLLM)
    clean = graph_runner.run_timeline(spec, engine=tape, attention=TRTLLM, overlap=True, audit_writes=True)
    with trtllm_faults.prefix_layer_cache_loc():
        faulty = graph_runner.run_timeline(spec, engine=tape, attention=TRTLLM, overlap=True, audit_writes=True)
        synchronous = graph_runner.run_timeline(spec, engine=tape, attention=TRTLLM, audit_writes=True)
    return spec, eager, clean, faulty, synchronous


def test_the_scheduler_work_runs_inside_each_replay_at_the_runners_read_done_marker(reallocated):
    _, _, clean, _, synchronous = reallocated
    assert clean.decodes and all(d.fenced_in_replay == (d.bucket is not None) for d in clean.decodes)
    assert not any(d.fenced_in_replay for d in synchronous.decodes)
    # the marker is one op of every captured graph, called again at every replay, as a CUDA event node is
    assert "harness_sglang_overlap::shared_read_done" in clean.rerun_ops
    assert "harness_sglang_overlap::shared_read_done" not in synchronous.rerun_ops


def test_sglangs_planned_swa_ids_write_where_the_batch_was_built_under_overlap(reallocated, graph_runner):
    """0.5.23's code: the SWA write ids are the in-graph kernel's snapshot of the plan, taken before the fence."""
    _, eager, clean, _, _ = reallocated
    assert clean.audited and clean.misplaced_writes == []
    assert graph_runner.kv_differences(eager, clean) == []


def test_the_pre_fix_layer_cache_loc_is_flagged_where_the_released_slot_was_reallocated(reallocated):
    """Step 3's replay: after the marker a and b are released and c's prefill is allocated a@6's full slot 12 with
    a fresh SWA slot; every SWA layer then gathers the live mapping and writes a@6's K/V at the slot c@6 holds,
    and b@5's at the dummy slot (its full slot 13 was freed, mapping 0)."""
    spec, _, _, faulty, _ = reallocated
    swa_layers = {i for i, swa in enumerate(spec.model.layer_is_swa) if swa}
    misplaced = faulty.misplaced_writes
    assert {(m.step, m.rid, m.pos) for m in misplaced if m.step == 3} == {(3, "a", 6), (3, "b", 5)}
    assert all(m.pool == "swa" for m in misplaced) and {m.layer for m in misplaced if m.step == 3} == swa_layers
    a6 = {m.holder for m in misplaced if (m.step, m.rid) == (3, "a")}
    assert a6 == {"c@6"}, [str(m) for m in misplaced]
    assert {m.holder for m in misplaced if (m.step, m.rid) == (3, "b")} == {"dummy"}
    # only rows whose request was released behind the fence, its last forward in flight, move
    last = {r.rid: r.prompt_len + r.output_len - 1 for r in spec.timeline.requests}
    assert all(m.pos == last[m.rid] for m in misplaced)


def test_what_the_kv_diff_sees_of_it_is_on_released_slots_only(reallocated, graph_runner):
    """c@6's slot is written again by c's own prefill (the next forward, ordered after this one), so no slot a
    live request holds differs. What differs is the released rows' own slots: their planned SWA slots, never
    written, and (c@12's, whose full slot nobody takes again) the full slot its full layers wrote from a hidden
    state that read its own unwritten SWA key. SGLang discards that row: it is the overshoot step of a finished
    request."""
    _, eager, _, faulty, _ = reallocated
    differences = graph_runner.kv_differences(eager, faulty)
    by_step = {d.step: d for d in faulty.decodes}
    own = {("swa", m.planned) for m in faulty.misplaced_writes}
    own |= {("full", by_step[m.step].padded_out_cache_loc[m.row]) for m in faulty.misplaced_writes}
    assert differences and {(d.pool, d.slot) for d in differences} <= own


def test_the_pre_fix_layer_cache_loc_writes_where_planned_without_overlap(reallocated, graph_runner):
    """The synchronous ordering: the frees and the next allocation run after the forward, so the live mapping a
    per-layer gather reads is the one the plan read, and the same fault writes every row where its batch was
    built."""
    _, eager, _, _, synchronous = reallocated
    assert synchronous.audited and synchronous.misplaced_writes == []
    assert graph_runner.kv_differences(eager, synchronous) == []


def test_an_abort_released_behind_the_fence_is_flagged_at_the_aborted_requests_in_flight_token(clean_spec,
                                                                                             graph_runner):
    """b is aborted at step 3: its release runs in the build of step 3, inside step 2's replay, while b@4 is being
    written; a's finish at step 6 moves its last row the same way."""
    from harness.sglang import trtllm_faults

    with trtllm_faults.prefix_layer_cache_loc():
        run = graph_runner.run_timeline(clean_spec(ABORTED), engine=get_engine("tape"), attention=TRTLLM,
                                        overlap=True, audit_writes=True)
    assert all(d.fenced_in_replay for d in run.decodes)
    assert {(m.step, m.rid, m.pos, m.holder) for m in run.misplaced_writes} == {(2, "b", 4, "dummy"),
                                                                                (6, "a", 10, "dummy")}


def test_overlap_gives_no_false_alarm_on_a_library_timeline(trtllm_runs, graph_runner):
    """swa_decode_padded_buckets: five requests finish in replayed batches of 4, 3, 2 and 1, each released behind
    the marker of its last forward; SGLang's code writes every row where planned and leaves the eager pools."""
    spec, eager, _ = trtllm_runs(ROOT / "scenarios" / "swa_decode_padded_buckets.toml")
    run = graph_runner.run_timeline(spec, engine=get_engine("tape"), attention=TRTLLM, overlap=True,
                                    audit_writes=True)
    assert sum(d.fenced_in_replay for d in run.decodes) == len(run.decodes)
    assert run.misplaced_writes == []
    assert graph_runner.kv_differences(eager, run) == []


def test_overlap_is_refused_over_the_torch_native_subclass(clean_spec, graph_runner):
    with pytest.raises(ValueError, match="trtllm_mha backend only"):
        graph_runner.run_timeline(clean_spec(REALLOCATED), engine=get_engine("tape"), overlap=True)



def test_a_marker_recorded_in_capture_runs_armed_work_at_that_point_of_every_replay():
    """The tape calls the marker's op again between the ops around it: work armed for a replay changes what the ops
    after the marker read, never the ones before it; unarmed, a replay runs nothing."""
    from harness.sglang.overlap import ReadDoneMarker

    mapping, before, after = torch.zeros(3), torch.zeros(3), torch.zeros(3)
    marker = ReadDoneMarker()

    def forward():
        before.copy_(mapping + 1)
        marker.record()
        after.copy_(mapping + 1)

    graph = get_engine("tape").capture(forward, label="marker", roots={}, static_inputs=(mapping,))
    assert "harness_sglang_overlap::shared_read_done" in graph.audit.rerun_ops
    graph.replay()
    assert before.tolist() == after.tolist() == [1.0] * 3
    marker.arm(lambda: mapping.fill_(5))
    graph.replay()
    assert before.tolist() == [1.0] * 3 and after.tolist() == [6.0] * 3
    assert not marker.disarm()  # the replay ran it, once
    graph.replay()
    assert before.tolist() == after.tolist() == [6.0] * 3

"""What every metadata builder is handed: one ``AttentionBatch`` per forward, whose host-side lengths, sums
and counts describe exactly the device rows it carries (padding included), in eager, capture and replay."""

import pytest
import torch

from harness.backends.registry import backend_class
from harness.runners.base import swa_out_cache_loc
from harness.serving.batch import ForwardMode
from workloads import draft_after_prefill

from harness.check.assemble import assemble

from ._flows import drive, heterogeneous_decode, heterogeneous_prefill, spec_for

ENTRY_POINTS = ("build", "build_for_graph_capture", "refresh_for_graph_replay")


@pytest.fixture
def handed(monkeypatch):
    """(entry point, batch, the batch's device rows as lists at the moment of the call) of every builder call."""
    seen = []
    builder_cls = backend_class("torch_native").builder_cls
    for entry in ENTRY_POINTS:
        def spy(self, batch, _entry=entry, _original=getattr(builder_cls, entry)):
            # the static buffers change after the call: read the rows now
            rows = {name: getattr(batch, name).tolist() for name in ("seq_lens", "req_pool_indices", "out_cache_loc")}
            if batch.extend_seq_lens is not None:
                rows["extend_seq_lens"] = batch.extend_seq_lens.tolist()
            seen.append((_entry, batch, rows))
            return _original(self, batch)

        monkeypatch.setattr(builder_cls, entry, spy)
    return seen


def _assert_describes_its_rows(batch, rows) -> None:
    assert batch.seq_lens_cpu == tuple(rows["seq_lens"])
    assert batch.seq_lens_sum == sum(rows["seq_lens"])
    assert batch.bs == len(rows["seq_lens"]) == len(rows["req_pool_indices"])
    assert batch.num_tokens == len(rows["out_cache_loc"])
    assert 0 < batch.num_real <= batch.bs
    assert batch.page_size == 1
    if batch.forward_mode is ForwardMode.EXTEND:
        assert batch.extend_seq_lens_cpu == tuple(rows["extend_seq_lens"])
        assert batch.num_tokens == sum(batch.extend_seq_lens_cpu)
    else:
        assert batch.extend_seq_lens is None and batch.num_tokens == batch.bs


def test_graph_batches_carry_host_lengths_of_their_padded_rows(handed):
    _, _, runner = drive(spec_for("gpt-oss-mini", heterogeneous_decode, "full"))
    assert runner.log.padded_replays >= 1
    entries = {entry for entry, _, _ in handed}
    assert entries == set(ENTRY_POINTS)
    for _, batch, rows in handed:
        _assert_describes_its_rows(batch, rows)
    replays = [(b, rows) for entry, b, rows in handed if entry == "refresh_for_graph_replay"]
    padded = [(b, rows) for b, rows in replays if b.num_real < b.bs]
    assert padded, "a replay of a padded bucket must reach the builder"
    for batch, rows in padded:
        # the padding rows the runner filled (seq_len 1) are part of what the host-side lengths describe
        assert batch.seq_lens_cpu[batch.num_real:] == (1,) * (batch.bs - batch.num_real)
    captures = [b for entry, b, _ in handed if entry == "build_for_graph_capture"]
    assert all(b.seq_lens_cpu == (1,) * b.bs and b.num_real == b.bs for b in captures)


@pytest.mark.parametrize("mode", ["eager", "piecewise"])
def test_eager_batches_carry_host_lengths_and_extend_lengths(handed, mode):
    drive(spec_for("gpt-oss-mini", heterogeneous_prefill, mode))
    assert {entry for entry, _, _ in handed} == {"build"}
    assert any(b.forward_mode is ForwardMode.EXTEND and b.bs > 1 for _, b, _ in handed)
    for _, batch, rows in handed:
        _assert_describes_its_rows(batch, rows)


@pytest.mark.parametrize("mode", ["eager", "full"])
def test_draft_steps_reach_the_builder_as_speculative_information(handed, mode):
    spec = spec_for("gpt-oss-mini", draft_after_prefill, mode)
    drive(spec)
    drafts = [b for entry, b, _ in handed if b.forward_mode is ForwardMode.DRAFT]
    assert drafts
    assert all(b.spec_info is not None and b.spec_info.draft_steps == spec.timeline.draft_steps for b in drafts)
    assert all(b.spec_info is None for _, b, _ in handed if b.forward_mode is not ForwardMode.DRAFT)
    for _, batch, rows in handed:
        _assert_describes_its_rows(batch, rows)


def test_graph_runners_translate_the_swa_locations_a_draft_step_dropped():
    session = assemble(spec_for("gpt-oss-mini", draft_after_prefill, "eager"))
    step = session.scheduler.next_step()
    batch = step.batch
    assert swa_out_cache_loc(batch, session.pool) is batch.out_cache_loc_swa  # precomputed: used as it is
    draft_locs = batch.out_cache_loc.flip(0)
    swa_slots = torch.arange(draft_locs.numel(), dtype=torch.int32) + 5
    session.pool.full_to_swa_index_mapping[draft_locs] = swa_slots.long()  # where their SWA slots are
    batch.reassign_out_cache_loc(draft_locs)
    assert batch.out_cache_loc_swa is None
    assert torch.equal(swa_out_cache_loc(batch, session.pool), swa_slots)

"""The draft model's own KV pool (SGLang's EAGLE draft worker's): addressed by the target's full-pool slot ids, so
sized at least the full pool (SGLang PR 17630); sized before the hybrid SWA adjustment, the first draft token given
a full slot past it fails the write at that draft."""

from pathlib import Path

from harness.check.run.assemble import assemble
from harness.check.run.drive import execute
from harness.scenario import load_scenario
from harness.serving.batch import ForwardMode
from harness.serving.pool import PoolSpec, draft_pool_size

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "faults" / "swa_spec_draft_pool_below_full_pool.toml"


def test_the_draft_pool_holds_the_full_pool_and_before_the_fix_the_swa_adjusted_memory_count():
    spec = PoolSpec(full_size=64, swa_size=32)
    hybrid = (True, False, True, False)
    assert draft_pool_size(spec, hybrid) == 64
    assert draft_pool_size(spec, hybrid, before_swa_adjustment=True) == 48  # (64 * 2 + 32 * 2) / 4
    assert draft_pool_size(PoolSpec(full_size=64, swa_size=64), hybrid, before_swa_adjustment=True) == 64
    assert draft_pool_size(PoolSpec(full_size=64, swa_size=32, page_size=16), hybrid, before_swa_adjustment=True) == 48


def _spec(mode: str, faults: bool):
    return load_scenario(SCENARIO).run_spec(design="forward_batch", mode=mode, backend="torch_native",
                                            with_faults=faults)


def test_draft_forwards_write_the_draft_pool_at_their_full_slots_and_no_other_forward_does():
    session = assemble(_spec("eager", faults=False))
    draft = session.pool.draft
    assert draft is not None and draft.size == 64
    written: set[int] = set()
    while (step := session.scheduler.next_step()) is not None:
        before = [b.clone() for b in draft.k_buffer]
        session.run_batch(step.batch)
        changed = {int(s) for b, old in zip(draft.k_buffer, before) for s in (b != old).any(-1).any(-1).nonzero()}
        if step.batch.forward_mode is ForwardMode.DRAFT:
            slots = {int(s) for s in step.batch.draft_out_cache_loc.reshape(-1)}
            assert changed <= slots and changed, step.index
            written |= changed
        else:
            assert not changed, step.index
        session.scheduler.finish_step()
    assert max(written) >= 48  # past the pool the fault sizes


def test_a_draft_pool_sized_before_the_swa_adjustment_fails_at_the_first_draft_past_it():
    session = assemble(_spec("eager", faults=False))
    first = None
    while first is None and (step := session.scheduler.next_step()) is not None:
        if step.batch.forward_mode is ForwardMode.DRAFT and int(step.batch.draft_out_cache_loc.max()) >= 48:
            first = step.index
        session.run_batch(step.batch)
        session.scheduler.finish_step()
    assert first is not None
    for mode in ("eager", "full"):  # piecewise steps its drafts as eager does; the scenario runs it
        result = execute(_spec(mode, faults=True))
        assert result.error is not None, mode
        assert "out-of-bounds index into the draft KV pool (48 slots)" in result.error.message, mode
        assert result.error.step == first, (mode, result.error.step, first)

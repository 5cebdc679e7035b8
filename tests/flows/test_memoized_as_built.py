"""The memoized design as SGLang PR 25824 built it: one memo entry for the write path and the read path (the
backend's SWA page table), dropped per forward, before every metadata init and by the allocator; and the two
faults of the graph paths, each first diverging where it acts."""

from pathlib import Path

import torch

from harness.check.matrix.verdict import judge
from harness.check.run.assemble import assemble
from harness.check.run.drive import execute
from harness.runners.draft_graph import DraftGraphRunner
from harness.scenario import load_scenario

FAULTS_DIR = Path(__file__).resolve().parents[2] / "scenarios" / "faults"


def _run(scenario: str, design: str, *, faults: bool = True):
    spec = load_scenario(FAULTS_DIR / f"{scenario}.toml").run_spec(design=design, mode="full",
                                                                   backend="torch_native", with_faults=faults)
    return spec, judge(execute(spec), execute(spec.reference()))


def test_a_replay_that_skips_the_invalidation_is_served_the_previous_replays_page_table():
    spec, verdict = _run("swa_spec_memo_stale_after_replay", "memoized")
    assert verdict.outcome == "diverge", verdict
    # the stepped draft (step 2), its second decode replay: a's token at position 10; the SWA layer 0 reads
    # wrong keys, so the next layer's K/V (full pool, layer 1) is the first to differ
    assert (verdict.first.step, verdict.first.pool, verdict.first.layer, verdict.first.rid, verdict.first.pos) == (2, "full", 1, "a", 10)
    assert _run("swa_spec_memo_stale_after_replay", "memoized", faults=False)[1].outcome == "match"


def test_step_page_tables_of_one_buffer_collide_without_an_invalidation_before_each_refresh():
    spec, verdict = _run("swa_spec_memo_step_page_tables_collide", "memoized")
    assert verdict.outcome == "diverge", verdict
    # the first draft (step 1), draft step 1's token of a (position 7): step 0's SWA page table ends before it
    assert (verdict.first.step, verdict.first.pool, verdict.first.layer, verdict.first.rid, verdict.first.pos) == (1, "full", 1, "a", 7)
    assert _run("swa_spec_memo_step_page_tables_collide", "memoized", faults=False)[1].outcome == "match"


def test_the_draft_step_backends_page_tables_are_rows_of_one_buffer_and_only_memoized_reads_share_the_memo():
    spec = load_scenario(FAULTS_DIR / "swa_spec_memo_step_page_tables_collide.toml").run_spec(
        design="memoized", mode="full", backend="torch_native", with_faults=False)
    session = assemble(spec)
    assert session.pool.memoize_reads
    (runner,) = [r for r in session.runner.runners if isinstance(r, DraftGraphRunner)]
    tables = [b.builder._cg_page_table for b in runner.backends]
    assert len({t.untyped_storage().data_ptr() for t in tables}) == 1
    assert len({t.numel() for t in tables}) == 1 and len({t.data_ptr() for t in tables}) == len(tables)
    other = assemble(load_scenario(FAULTS_DIR / "swa_spec_memo_step_page_tables_collide.toml").run_spec(
        design="translate", mode="eager", backend="torch_native", with_faults=False))
    assert not other.pool.memoize_reads
    assert torch.equal(other.pool.translate_for_read(torch.tensor([0, 1])), torch.tensor([0, 0], dtype=torch.int32))

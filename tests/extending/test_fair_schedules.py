"""Issue 26 section 3: the schedule is not part of the answer. A stack of one's own (``own_engine/stacks.py``)
that gives a finished request's pages back newest first is judged against the built-in miniature on the same
timeline; where the free order makes it reuse other pages, every live token's K/V is compared where its own run
keeps it, and the other schedule is a note, not a divergence. A fault that changes the schedule too still
diverges, naming the first token whose K/V differs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.check.matrix.case import Selection, cases
from harness.check.matrix.matrix import run_case
from harness.check.matrix.verdict import judge
from harness.check.run.drive import execute
from harness.report.build import case_view
from harness.report.text import summary
from harness.scenario import load_scenario

LIBRARY = Path(__file__).resolve().parents[2] / "scenarios"
NEWEST_FIRST = "tests.extending.own_engine.stacks:NewestFirstFree"


def _scenario(name: str, free_order: str):
    spec = load_scenario(LIBRARY / f"{name}.toml")
    return dataclasses.replace(spec, serving=NEWEST_FIRST, pool=dataclasses.replace(spec.pool, free_order=free_order))


# pages of 16: since the miniature gives a finished row back in SGLang's segments (``allocator.free``), the newest-
# first order leads to the same pages next on this timeline under every free order; pages of 1 (fifo_reuse) do not
@pytest.mark.parametrize(("name", "free_order", "reschedules"), [
    ("swa_paged_sglang_pages_of_16", "lifo", False),
    ("swa_paged_sglang_pages_of_16", "fifo", False),
    ("swa_paged_sglang_pages_of_16", "lowest", False),
    ("swa_evict_sglang_policy_fifo_reuse", "lifo", True),
    ("swa_evict_sglang_policy_fifo_reuse", "fifo", False),
    ("swa_prefix_sglang_pages_of_4", "lifo", False),
], ids=lambda v: str(v).replace("_", "-"))
def test_a_newest_first_free_order_matches_the_built_in_stack_whatever_the_pool_free_order(name, free_order,
                                                                                             reschedules):
    spec = _scenario(name, free_order)
    (case,) = cases(spec, Selection(designs=["translate"], modes=["eager"], backends=["torch_native"]))
    view = case_view(run_case(case))
    assert (view.expected, view.verdict) == ("match", "match"), summary(view)
    # where the plug-in hands out other pages the schedules differ, and that is said, never counted
    assert (view.schedule_note is not None) == reschedules, view.schedule_note
    if reschedules:
        assert "another schedule than the reference's from step" in summary(view)
        assert view.to_record()["schedule_note"] == view.schedule_note
    assert view.judged_by.endswith(
        f"on serving stack miniature (the built-in serving stack of the kind of {NEWEST_FIRST}) with eviction "
        f"policy {spec.eviction.policy}, certified against the dense oracle")


def test_a_scheduler_fault_under_another_schedule_diverges_naming_the_first_token():
    spec = _scenario("faults/swa_decode_stale_plan_reused", "lifo")
    subject = spec.run_spec(design="plan", mode="eager", backend="torch_native", with_faults=True)
    reference = subject.reference()
    assert (reference.serving, reference.faults) == ("miniature", frozenset())
    verdict = judge(execute(subject), execute(reference))
    assert verdict.diff.schedule_note is not None  # the schedules do differ: another free order
    assert str(verdict.outcome) == "diverge" and verdict.error is None
    first = verdict.first
    assert (first.step, first.classification, first.holder) == (2, "overwritten", "a@10")
    assert (first.rid, first.pos) != ("-", 0) and first.classification != "schedule"


BATCHING = "tests.extending.own_engine.policies:FreesInBatches"


@pytest.mark.parametrize("name", ["swa_paged_decode_pages_of_4", "swa_prefix_multi_turn"],
                         ids=lambda v: v.replace("_", "-"))
def test_a_policy_of_ones_own_is_judged_against_the_built_in_policy_of_its_kind(name):
    spec = load_scenario(LIBRARY / f"{name}.toml")
    spec = dataclasses.replace(spec, eviction=dataclasses.replace(spec.eviction, policy=BATCHING, interval=5))
    (case,) = cases(spec, Selection(designs=[spec.designs[0]], modes=["eager"], backends=["torch_native"]))
    assert case.run_spec().reference().eviction.policy == "tight"
    view = case_view(run_case(case))
    assert view.verdict == "match", summary(view)
    # it keeps pages longer than tight: out-of-window tokens still hold SWA slots, which are reused later
    assert view.schedule_note is not None and "(out of the window)" in view.schedule_note
    assert view.judged_by.endswith(f"with eviction policy tight (the built-in eviction policy of the kind of "
                                   f"{BATCHING}), certified against the dense oracle")

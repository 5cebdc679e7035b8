"""A serving stack of its own KV layout, three groups (full attention, window 8, window 32), plugged in by
import path (``window_groups/``): it runs end to end, sound runs match, and the diff, the invariants, the
results records and the report name its groups, with no harness file edited for it."""

from __future__ import annotations

import dataclasses
import json

import torch

from harness.check.matrix.case import Case, CaseResult, judgement_of
from harness.check.run.drive import execute
from harness.check.matrix.verdict import judge
from harness.report.build import case_view
from harness.report.html import render_scenario
from harness.report.records import read_results, write_results
from harness.report.scenario_page import run_anchors, scenario_page
from harness.report.slots import first_divergence_sentence
from harness.report.views import CaseView
from harness.runspec import Outcome
from harness.scenario.loader import load_scenario
from harness.serving.stack import stack_spec

from .window_groups.model import BACKEND, STACK, THREE_WINDOWS, TIMELINE, run_spec
from .window_groups.stack import WindowGroupsStack


class MisroutedStack(WindowGroupsStack):
    """Window-32 layers write at their tokens' window-8 slots: one group's mapping used for another's."""

    def layer_cache_loc(self, layer_id, out_cache_loc):
        if self.groups.of_layer(layer_id).name == "w32":
            return self.group_slots(out_cache_loc)[self.groups.index("w8")]
        return super().layer_cache_loc(layer_id, out_cache_loc)


class LeakyStack(WindowGroupsStack):
    """Eviction forgets the window-8 group: its slots outlive the window."""

    def free_swa(self, full_slots):
        mapping = self.pool.mappings[self.groups.index("w8")]
        kept = mapping[full_slots.long()].clone()
        super().free_swa(full_slots)
        mapping[full_slots.long()] = kept
        self.held[self.groups.index("w8")].update(s for s in kept.tolist() if s > 0)
        free = self.free_lists[self.groups.index("w8")]
        free._free = [s for s in free._free if s not in set(kept.tolist())]


def test_the_stack_declares_one_group_per_window_and_hands_out_distinct_slots_in_each():
    groups = WindowGroupsStack.kv_groups(stack_spec(THREE_WINDOWS, run_spec().pool))
    assert [(g.name, g.layer_ids, g.window) for g in groups] == [("full", (1,), None), ("w8", (0, 3), 8),
                                                                  ("w32", (2,), 32)]
    stack = WindowGroupsStack.build(stack_spec(THREE_WINDOWS, run_spec().pool))
    ids = stack.alloc_extend(prefix_lens=[0], extend_lens=[4], last_locs=[0])
    slots = stack.group_slots(ids)
    assert slots[0].tolist() == ids.tolist() and slots[1].tolist() != slots[2].tolist()
    assert torch.equal(stack.layer_cache_loc(0, ids), slots[1]) and torch.equal(stack.layer_cache_loc(2, ids), slots[2])
    stack.free_swa(ids[:2])
    assert stack.group_slots(ids)[1:, :2].tolist() == [[0, 0], [0, 0]]
    # no token owns what was handed out: the pages still held in each group, and only those, are leaked
    held = {("full", s) for s in ids.tolist()} | {(g, s) for g, row in (("w8", slots[1]), ("w32", slots[2]))
                                                 for s in row[2:].tolist()}
    assert {(v.invariant, v.pool, v.slot) for v in stack.invariant_violations([])} == {("leaked", *h) for h in held}


def test_three_groups_run_end_to_end_and_a_sound_run_matches_its_reference():
    result = execute(run_spec())
    assert result.error is None and result.breach is None, result.error or result.breach
    assert result.snapshots[0].groups.names == ("full", "w8", "w32")
    assert any(s.evicted for s in result.steps), "no token left the window: the window groups were not exercised"
    assert all(len(t.slots) == 3 for s in result.snapshots for t in s.live)
    verdict = judge(result, execute(run_spec().reference()))
    assert verdict.outcome == Outcome.MATCH and verdict.diff.steps_compared == len(result.snapshots)


def test_a_write_through_the_wrong_groups_mapping_is_a_mismatch_naming_that_group():
    reference = execute(run_spec().reference())
    verdict = judge(execute(run_spec(serving=f"{__name__}:MisroutedStack")), reference)
    assert verdict.outcome == Outcome.DIVERGE
    first = verdict.diff.mismatches[0]
    assert (first.pool, first.layer) == ("w32", 2), first
    assert {c.pool for c in verdict.diff.counts} <= {"w8", "w32", "full", "hidden"}


def test_a_windowed_group_that_outlives_its_window_breaks_an_invariant_naming_it():
    result = execute(run_spec(serving=f"{__name__}:LeakyStack"))
    assert result.breach is not None, "the leak went unnoticed"
    assert {(v.invariant, v.pool) for v in result.breach.violations} == {("retained", "w8")}


def _case_view(serving: str, backend: str = BACKEND) -> CaseView:
    """The view of one eager run of the three-window timeline on ``serving``, judged against the sound stack's."""
    base = load_scenario("scenarios/swa_mixed_continuous_batching.toml")
    scenario = dataclasses.replace(base, name="three_windows", model=THREE_WINDOWS, pool=run_spec().pool,
                                   timeline=TIMELINE, serving=serving, backends=(backend,), designs=("translate",),
                                   expectations=tuple(e for e in base.expectations if e.design == "translate"),
                                   faults=())
    case = Case(scenario=scenario, design="translate", mode="eager", backend=backend,
                judgement=judgement_of(scenario, design="translate", mode="eager", backend=backend, with_faults=True))
    subject = execute(scenario.run_spec(design="translate", mode="eager", backend=backend))
    sound = serving if serving == "miniature" else STACK
    reference = execute(dataclasses.replace(scenario, serving=sound).run_spec(
        design="translate", mode="eager", backend=backend).reference())
    return case_view(CaseResult(case=case, verdict=judge(subject, reference)))


def test_the_records_and_the_report_name_the_three_groups(tmp_path):
    view = _case_view(f"{__name__}:MisroutedStack")
    setup = view.setup
    assert [(g.name, g.label, g.window, g.layers) for g in setup.groups] == [
        ("full", "full", None, (1,)), ("w8", "window-8", 8, (0, 3)), ("w32", "window-32", 32, (2,))]
    assert setup.layers == ("w8", "full", "w32", "w8")
    assert all(len(t.slots) == 3 for s in view.steps for t in s.written)
    assert view.first.pool == "w32"
    assert first_divergence_sentence(view).startswith(f"step {view.first.step}: window-32 layer 2 slot ")
    # the record round-trips through a results file, its schema checked on reading
    write_results(tmp_path / "r.json", [view])
    record = json.loads((tmp_path / "r.json").read_text())["records"][0]
    assert [g["name"] for g in record["setup"]["groups"]] == ["full", "w8", "w32"]
    (back,), _ = read_results(tmp_path / "r.json")
    assert back == dataclasses.replace(view, duration_s=back.duration_s)
    page = scenario_page([view], index_href="index.html", anchors=run_anchors([view]))
    html = render_scenario(page)
    for label in ("window-8 pool", "window-32 pool", "full pool", "window-8/window-32 evicted"):
        assert label in html, label


def test_a_sglang_shaped_record_keeps_its_shape(tmp_path):
    view = _case_view("miniature", backend="torch_native")
    assert view.setup.groups == () and view.setup.layers == tuple(THREE_WINDOWS.layer_pattern)
    write_results(tmp_path / "r.json", [view])
    record = json.loads((tmp_path / "r.json").read_text())["records"][0]
    assert "groups" not in record["setup"]
    assert all(len(row) == 4 for step in record["steps"] for row in step["written"])

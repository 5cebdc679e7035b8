"""The KV-group description a stack declares, and the diff and the invariants keyed on its groups: SGLang's
two pools are two groups, and a layout of three (full, window 8, window 32) is checked the same way."""

from __future__ import annotations

import pytest
import torch

from harness.check.diff.diff import diff_runs
from harness.check.diff.snapshot import WholePool, WholeStep, snapshots_of
from harness.serving.invariants import pool_violations
from harness.serving.kv_groups import KVGroup, KVGroups, hybrid_swa_groups
from harness.serving.model import ModelSpec
from harness.serving.pool import poison_
from harness.serving.timeline import LiveToken, TokenKey

SIZE, H, D = 16, 1, 2


def _group(name, layers, window, size=SIZE, **kw):
    return KVGroup(name=name, layer_ids=layers, window=window, size=size, num_kv_heads=H, head_dim=D, **kw)


THREE = KVGroups((_group("full", (1,), None), _group("w8", (0, 3), 8, label="window-8"),
                  _group("w32", (2,), 32, label="window-32")))


def test_groups_are_found_by_name_and_by_layer_and_listed_as_the_report_shows_them():
    assert THREE.names == ("full", "w8", "w32") and THREE.index("w32") == 2
    assert THREE.of_layer(3).name == "w8" and THREE["w8"].title == "window-8" and THREE["full"].title == "full"
    assert [g.name for g in THREE.windowed()] == ["w8", "w32"]
    assert [g.name for g in THREE.shown()] == ["w8", "w32", "full"]  # narrowest window first, full last
    with pytest.raises(KeyError, match="no KV group 'swa'; the stack's groups are full, w8, w32"):
        THREE.index("swa")
    with pytest.raises(KeyError, match="no KV group holds layer 9"):
        THREE.of_layer(9)


@pytest.mark.parametrize("groups, said", [
    ((_group("full", (0,), None), _group("full", (1,), 4)), "full: two groups have this name"),
    ((_group("full", (0, 1), None), _group("swa", (1,), 4)), "swa: layer 1 is already in group full"),
    ((_group("hidden", (0,), None),), "name: expected an identifier other than 'hidden'"),
    ((_group("full", (1, 0), None),), "layer_ids: expected distinct ascending layer ids"),
    ((_group("full", (0,), None, size=6, page_size=4),), "size: expected a multiple of page_size (4), got 6"),
    ((), "expected at least one KV group"),
])
def test_a_bad_declaration_is_refused_naming_the_group_and_field(groups, said):
    with pytest.raises(ValueError, match=f"^KV groups: .*{said.replace('(', '.').replace(')', '.')}"):
        KVGroups(groups)


def test_sglangs_layout_is_two_groups_full_then_swa():
    groups = hybrid_swa_groups(layer_is_swa=(True, False, True), layer_windows=(8, None, 8), full_size=64,
                               swa_size=32, page_size=4, kv_dtype="bfloat16", num_kv_heads=2, head_dim=16)
    assert [(g.name, g.layer_ids, g.window, g.size, g.title) for g in groups] == [
        ("full", (1,), None, 64, "full"), ("swa", (0, 2), 8, 32, "SWA")]


def test_a_model_may_give_each_sliding_layer_its_own_window():
    spec = ModelSpec(name="m", layer_pattern=("swa", "full", "swa"), window=32, layer_windows=(8, None, 32))
    assert [spec.layer_window(i) for i in range(3)] == [8, None, 32] and spec.problems() == []
    plain = ModelSpec(name="m", layer_pattern=("swa", "full"), window=6)
    assert [plain.layer_window(i) for i in range(2)] == [6, None]
    bad = ModelSpec(name="m", layer_pattern=("swa", "full", "swa"), window=8, layer_windows=(4, 2, 16))
    assert bad.problems() == ["layer_windows[1]: a full layer has no window (None), got 2",
                              "layer_windows[2]: expected an integer from 1 to window (8), got 16"]
    short = ModelSpec(name="m", layer_pattern=("swa", "full"), window=8, layer_windows=(4,))
    assert short.problems() == ["layer_windows: expected one entry per layer (2), got 1"]


# ---- the diff over three groups ----------------------------------------------------------------------

def _pools(fill: dict[str, dict[int, float]]):
    out = []
    for g in THREE:
        k = torch.empty(len(g.layer_ids), SIZE, H, D)
        poison_(k)
        k[:, 0] = 0
        for slot, value in fill.get(g.name, {}).items():
            k[:, slot] = value
        out.append(WholePool(k=k, v=k.clone()))
    return tuple(out)


def _step(live, fill):
    return WholeStep(step=0, kind="decode", live=tuple(live), groups=THREE, pools=_pools(fill),
                     hidden=torch.zeros(1, 4), hidden_owners=(TokenKey("a", 1),))


def _tok(pos, full, w8, w32, in_window=True):
    return LiveToken(rid="a", pos=pos, slots=(full, w8, w32), in_window=in_window)


LIVE = [_tok(0, 1, 9, 4, in_window=False), _tok(1, 2, 8, 5)]
FILL = {"full": {1: 1.0, 2: 2.0}, "w8": {8: 3.0}, "w32": {5: 4.0}}


def test_the_diff_compares_each_group_at_its_own_slots_and_names_the_group():
    reference = snapshots_of([_step(LIVE, FILL)])
    assert diff_runs(snapshots_of([_step(LIVE, FILL)]), reference).total == 0
    bad = {**FILL, "w32": {5: 4.5}}
    found = diff_runs(snapshots_of([_step(LIVE, bad)]), reference)
    assert [(m.pool, m.layer, m.slot, m.rid, m.pos, m.classification) for m in found.mismatches] == [
        ("w32", 2, 5, "a", 1, "drift")]
    assert [(c.pool, c.layer, c.count) for c in found.counts] == [("w32", 2, 1)]
    # a token outside the window is not compared in a windowed group: its slots there may be evicted
    outside = {**FILL, "w8": {8: 3.0, 9: 7.0}}
    assert diff_runs(snapshots_of([_step(LIVE, outside)]), snapshots_of([_step(LIVE, FILL)])).total == 0


def test_another_slot_in_a_windowed_group_is_compared_where_each_run_keeps_the_token():
    moved = [LIVE[0], _tok(1, 2, 7, 5)]
    # a@1's window-8 K/V moved with it to slot 7: the same K/V, another schedule, a note
    same = diff_runs(snapshots_of([_step(moved, {**FILL, "w8": {7: 3.0}})]), snapshots_of([_step(LIVE, FILL)]))
    assert same.total == 0
    assert same.schedule_note == "step 0: the subject keeps a@1 in window-8 slot 7, the reference in window-8 slot 8"
    # slot 7 left as poison: a@1's K/V is missing where the subject keeps it
    found = diff_runs(snapshots_of([_step(moved, FILL)]), snapshots_of([_step(LIVE, FILL)]))
    assert {(m.pool, m.slot, m.rid, m.pos, m.classification) for m in found.mismatches} == {
        ("w8", 7, "a", 1, "unwritten")}


def test_schedules_that_part_in_a_windowed_group_name_it():
    # a@0 inside the window in one run, outside it in the other: the live tokens differ, the schedules part
    inside = [_tok(0, 1, 9, 4), LIVE[1]]
    found = diff_runs(snapshots_of([_step(inside, FILL)]), snapshots_of([_step(LIVE, FILL)]))
    (m,) = found.mismatches
    assert (m.pool, m.slot, m.classification) == ("w8", 9, "schedule")
    assert m.detail == ("the schedules part: the subject keeps a@0 in window-8 slot 9, the reference in window-8 "
                        "slot 9 (out of the window)")


# ---- the invariants over three groups ----------------------------------------------------------------

def _free(**over):
    """Every slot LIVE does not own, but the dummy: sound accounting, nothing handed out and left unowned."""
    return {"full": set(range(3, SIZE)), "w8": set(range(1, 8)) | set(range(10, SIZE)),
            "w32": {1, 2, 3} | set(range(6, SIZE)), **over}


def test_sound_accounting_over_three_groups_breaks_nothing():
    assert pool_violations(LIVE, groups=THREE, free=_free()) == []


def test_each_invariant_names_the_group_whose_slot_broke_it():
    live = [_tok(0, 1, 9, 4), _tok(1, 2, 9, 0), _tok(2, 3, 0, 6)]
    live += [LiveToken(rid="b", pos=0, slots=(4, 10, 7), in_window=False, past_frontier=True)]
    RETAINED = "b@0 is below what its request may retain (the window, the page floor, the declared eviction interval) " \
               "but still holds it"
    # ``leaked`` (slots these tokens leave neither free nor owned) is tested in test_target_verify.py
    found = [(v.invariant, v.pool, v.slot, v.detail) for v in pool_violations(live, groups=THREE,
                                                                               free={"full": set(range(5, SIZE)),
                                                                                     "w8": {0, 1},
                                                                                     "w32": set(range(6, SIZE))})
             if v.invariant != "leaked"]
    assert found == [
        ("dummy", "w8", 0, "the dummy page is on the free list"),
        ("window", "full", 2, "a@1 is inside its window but holds no window-32 slot"),
        ("owned_twice", "w8", 9, "owned by a@0 and a@1"),
        ("window", "full", 3, "a@2 is inside its window but holds no window-8 slot"),
        ("free_but_owned", "w32", 6, "a@2 owns it, and it is on the free list"),
        ("retained", "w8", 10, RETAINED),
        ("retained", "w32", 7, RETAINED),
        ("free_but_owned", "w32", 7, "b@0 owns it, and it is on the free list"),
    ]


def test_both_sglang_stacks_declare_its_two_groups_and_ask_the_swa_location_designs():
    from harness.serving.miniature import MiniatureStack
    from harness.serving.model import model_spec
    from harness.serving.pool import PoolSpec
    from harness.serving.stack import ServingStack, stack_spec
    from harness.sglang.stack import SGLangStack

    spec = stack_spec(model_spec("gemma-mini"), PoolSpec(full_size=64, swa_size=32))
    assert SGLangStack.kv_groups(spec) == MiniatureStack.kv_groups(spec)
    assert [(g.name, g.layer_ids, g.window) for g in MiniatureStack.kv_groups(spec)] == [
        ("full", (5,), None), ("swa", (0, 1, 2, 3, 4), 6)]
    assert SGLangStack.asks_swa_design and MiniatureStack.asks_swa_design and not ServingStack.asks_swa_design

"""The slot-by-slot diff classifies each bad slot by where its contents came from."""

import pytest
import torch

from harness.check.diff import hashjoin
from harness.check.diff.diff import diff_runs as diff_snapshots
from harness.check.diff.rules import RULES, Finding, Rule, fixed
from harness.check.diff.snapshot import SnapshotRecorder, hybrid_step, snapshots_of
from harness.serving.kv_groups import GroupBuffers, KVBuffers, hybrid_swa_groups
from harness.serving.pool import HybridSWAKVPool, PoolSpec, is_poison, poison_
from harness.serving.timeline import LiveToken, TokenKey


def diff_runs(subject, reference, **kw):
    """The diff of two runs given step by step with their pools whole."""
    return diff_snapshots(snapshots_of(subject), snapshots_of(reference), **kw)

SLOTS, H, D = 8, 1, 2
SWA = (True,)  # one SWA layer: pool "swa"


def tok(rid, pos, slot):
    return LiveToken(rid=rid, pos=pos, slots=(slot, slot), in_window=True)


def snap(step, rows: dict[int, float], live, written=(), poisoned=(), log: dict[int, int] | None = None):
    """One step of a one-layer SWA pool; ``log`` (slot -> step that last wrote it) is its write log, inferred
    from the changes when None."""
    k = torch.zeros(1, SLOTS, H, D)
    for slot, value in rows.items():
        k[0, slot] = value
    for slot in poisoned:
        poison_(k[0, slot])
    v = k.clone()
    empty = torch.zeros(0, SLOTS, H, D)
    swa_log = None
    if log is not None:
        swa_log = torch.full((1, SLOTS), -1, dtype=torch.int32)
        for slot, at in log.items():
            swa_log[0, slot] = at
    return hybrid_step(step=step, kind="decode", live=tuple(live), layer_is_swa=SWA, full_k=empty, full_v=empty,
                       swa_k=k, swa_v=v, hidden=torch.zeros(len(written), 4),
                       hidden_owners=tuple(TokenKey(r, p) for r, p in written), swa_log=swa_log)


def classes(sub, ref):
    d = diff_runs(tuple(sub), tuple(ref))
    return [(m.step, m.slot, m.classification) for m in d.mismatches], d


def test_identical_runs_match():
    live = [tok("a", 0, 1)]
    found, d = classes([snap(0, {1: 1.0}, live, [("a", 0)])], [snap(0, {1: 1.0}, live, [("a", 0)])])
    assert found == [] and d.total == 0


def test_poisoned_live_slot_is_unwritten():
    live = [tok("a", 0, 1)]
    found, _ = classes([snap(0, {}, live, [("a", 0)], poisoned=[1])], [snap(0, {1: 1.0}, live, [("a", 0)])])
    assert found == [(0, 1, "unwritten")]


def test_slot_holding_another_live_tokens_row_is_overwritten_and_names_it():
    live = [tok("a", 0, 1), tok("b", 0, 2)]
    ref = snap(0, {1: 1.0, 2: 2.0}, live, [("a", 0), ("b", 0)])
    sub = snap(0, {1: 2.0, 2: 2.0}, live, [("a", 0), ("b", 0)])
    _, d = classes([sub], [ref])
    assert d.mismatches[0].classification == "overwritten"
    assert "b@0" in d.mismatches[0].detail


def test_expected_row_in_another_slot_is_misplaced():
    live = [tok("a", 0, 1)]
    ref = snap(0, {1: 1.0}, live, [("a", 0)])
    sub = snap(0, {1: 5.0, 6: 1.0}, live, [("a", 0)])
    found, d = classes([sub], [ref])
    assert found == [(0, 1, "misplaced")] and "slot 6" in d.mismatches[0].detail


def test_slot_changed_in_a_step_that_did_not_write_its_owner_is_overwritten():
    live = [tok("a", 0, 1)]
    ref = [snap(0, {1: 1.0}, live, [("a", 0)]), snap(1, {1: 1.0}, live, [])]
    sub = [snap(0, {1: 1.0}, live, [("a", 0)]), snap(1, {1: 9.0}, live, [])]
    found, _ = classes(sub, ref)
    assert found == [(1, 1, "overwritten")]


def test_token_written_this_step_whose_slot_kept_old_bytes_is_unwritten():
    before = [tok("a", 0, 1)]
    after = [tok("a", 0, 1), tok("a", 1, 2)]
    ref = [snap(0, {1: 1.0, 2: 7.0}, before, [("a", 0)]), snap(1, {1: 1.0, 2: 3.0}, after, [("a", 1)])]
    sub = [snap(0, {1: 1.0, 2: 7.0}, before, [("a", 0)]), snap(1, {1: 1.0, 2: 7.0}, after, [("a", 1)])]
    found, _ = classes(sub, ref)
    assert found == [(1, 2, "unwritten")]


def test_slot_written_with_poisons_bits_is_written_garbage_not_unwritten():
    # a@0's K/V computed from poisoned reads keep the poison's exact bits (NaN payloads survive arithmetic);
    # the write log says the step wrote slot 1 and nothing wrote slot 2
    live = [tok("a", 0, 1), tok("b", 0, 2)]
    ref = [snap(0, {1: 1.0, 2: 2.0}, live, [("a", 0), ("b", 0)], log={1: 0, 2: 0})]
    sub = [snap(0, {}, live, [("a", 0), ("b", 0)], poisoned=[1, 2], log={1: 0})]
    found, d = classes(sub, ref)
    assert found == [(0, 1, "drift"), (0, 2, "unwritten")]
    assert [m.detail for m in d.mismatches] == ["computed NaN", "slot still holds poison"]


def test_slot_written_in_an_earlier_step_with_poisons_bits_stays_written():
    live = [tok("a", 0, 1)]
    ref = [snap(0, {1: 1.0}, live, [("a", 0)], log={1: 0}), snap(1, {1: 1.0}, live, [], log={1: 0})]
    sub = [snap(0, {}, live, [("a", 0)], poisoned=[1], log={1: 0}), snap(1, {}, live, [], poisoned=[1], log={1: 0})]
    found, _ = classes(sub, ref)
    assert found == [(0, 1, "drift"), (1, 1, "drift")]


class _Step:
    index, kind, forwards = 0, "extend", ((TokenKey("a", 0), TokenKey("b", 0)),)


def test_a_write_computed_from_a_poisoned_read_is_logged_by_the_pool_and_classified_written():
    live = [LiveToken(rid=r, pos=0, slots=(s, 0), in_window=False) for r, s in (("a", 1), ("b", 2))]
    runs = []
    for value in (None, 1.0):
        pool = HybridSWAKVPool(spec=PoolSpec(full_size=8, swa_size=8), layer_is_swa=(False,), num_kv_heads=1,
                               head_dim=2)
        pool.poison()
        pool.begin_step(0)
        if value is None:
            # slot 5 was never written: reading it is the bug, and what it computes keeps the poison's bits
            read, _ = pool.read_kv(0, torch.tensor([5]), torch.float32)
            row = (read.view(1, 2) @ torch.randn(2, 2)) * 2 + 1
            assert is_poison(row)
        else:
            row = torch.full((1, 2), value)
            pool.set_kv_buffer(0, torch.tensor([2]), row.view(1, 1, 2), row.view(1, 1, 2))
        pool.set_kv_buffer(0, torch.tensor([1]), row.view(1, 1, 2), row.view(1, 1, 2))  # b@0's write is skipped
        groups = hybrid_swa_groups(layer_is_swa=(False,), layer_windows=(None,), full_size=8, swa_size=8, page_size=1,
                                   kv_dtype="float32", num_kv_heads=1, head_dim=2)
        buffers = KVBuffers(groups=groups, buffers=(
            GroupBuffers(k=pool.full_k_buffer, v=pool.full_v_buffer, log=pool.full_last_write),
            GroupBuffers(k=[], v=[], log=pool.swa_last_write)))
        runs.append((SnapshotRecorder().take(buffers, _Step(), live, [torch.zeros(2, 4)]),))
    d = diff_snapshots(*runs)
    assert [(m.slot, m.classification, m.detail) for m in d.mismatches] == [
        (1, "drift", "computed NaN"), (2, "unwritten", "slot still holds poison")]


def test_without_a_write_log_poison_is_read_as_never_written():
    live = [tok("a", 0, 1)]
    found, _ = classes([snap(0, {}, live, [("a", 0)], poisoned=[1])], [snap(0, {1: 1.0}, live, [("a", 0)])])
    assert found == [(0, 1, "unwritten")]


def test_slot_the_log_says_was_written_is_not_kept_old_though_its_bytes_did_not_change():
    before = [tok("a", 0, 1)]
    after = [tok("a", 0, 1), tok("a", 1, 2)]
    ref = [snap(0, {1: 1.0, 2: 7.0}, before, [("a", 0)]), snap(1, {1: 1.0, 2: 3.0}, after, [("a", 1)])]
    wrote = [snap(0, {1: 1.0, 2: 7.0}, before, [("a", 0)], log={1: 0, 2: 0}),
             snap(1, {1: 1.0, 2: 7.0}, after, [("a", 1)], log={1: 0, 2: 1})]
    skipped = [wrote[0], snap(1, {1: 1.0, 2: 7.0}, after, [("a", 1)], log={1: 0, 2: 0})]
    assert classes(wrote, ref)[0] == [(1, 2, "drift")]
    assert classes(skipped, ref)[0] == [(1, 2, "unwritten")]


def test_live_tokens_sharing_a_slot_through_the_prefix_cache_are_one_owner():
    cached = [LiveToken(rid=r, pos=0, slots=(1, 1), in_window=True, shared=True) for r in ("a", "b")]
    ref = [snap(0, {1: 1.0}, cached, [("a", 0)])]
    sub = [snap(0, {1: 5.0}, cached, [("a", 0)])]
    _, d = classes(sub, ref)
    assert [(m.slot, m.rid, m.classification) for m in d.mismatches] == [(1, "a", "drift")] and d.total == 1
    # without the cache, two tokens in one slot are two owners, each compared
    twice = [tok("a", 0, 1), tok("b", 0, 1)]
    _, d = classes([snap(0, {1: 5.0}, twice, [("a", 0)])], [snap(0, {1: 1.0}, twice, [("a", 0)])])
    assert d.total == 2


def test_a_shared_slot_is_written_when_any_of_its_owners_was():
    # b matched a's cached prefix: the step wrote a@1 (slot 2), and b@1 reads the same slot
    before = [tok("a", 0, 1)]
    shared = [LiveToken(rid=r, pos=p, slots=(s, s), in_window=True, shared=True)
              for r in ("a", "b") for p, s in ((0, 1), (1, 2))]
    ref = [snap(0, {1: 1.0, 2: 7.0}, before, [("a", 0)]), snap(1, {1: 1.0, 2: 3.0}, shared, [("a", 1)])]
    sub = [snap(0, {1: 1.0, 2: 7.0}, before, [("a", 0)]), snap(1, {1: 1.0, 2: 7.0}, shared, [("a", 1)])]
    found, d = classes(sub, ref)
    assert found == [(1, 2, "unwritten")] and d.mismatches[0].rid == "a"


def test_schedules_that_part_are_one_mismatch_where_they_part_after_the_steps_that_agree():
    a0, a1, b0 = tok("a", 0, 1), tok("a", 1, 2), tok("b", 0, 3)
    ref = [snap(0, {1: 1.0}, [a0], [("a", 0)]), snap(1, {1: 1.0, 2: 2.0}, [a0, a1], [("a", 1)]),
           snap(2, {1: 1.0, 2: 2.0}, [a0, a1], [])]
    sub = [snap(0, {1: 1.5}, [a0], [("a", 0)]), snap(1, {1: 1.5, 3: 2.0}, [a0, b0], [("b", 0)]),
           snap(2, {1: 1.5, 3: 2.0}, [a0, b0], [])]
    found, d = classes(sub, ref)
    assert found == [(0, 1, "drift"), (1, 3, "schedule")]
    assert d.mismatches[1].detail == "the schedules part: b@0 is live in the subject (full slot 3), not in the reference"
    assert (d.steps_compared, d.total, d.classes) == (1, 2, (("drift", 1), ("schedule", 1)))
    assert d.schedule_note is None


def test_the_same_tokens_in_other_slots_are_compared_token_by_token_and_the_schedule_is_a_note():
    # another free order: a@1 is given slot 3 instead of 2, and holds the same K/V there
    a0, a1 = tok("a", 0, 1), tok("a", 1, 2)
    ref = [snap(0, {1: 1.0}, [a0], [("a", 0)]), snap(1, {1: 1.0, 2: 2.0}, [a0, a1], [("a", 1)]),
           snap(2, {1: 1.0, 2: 2.0}, [a0, a1], [])]
    sub = [snap(0, {1: 1.0}, [a0], [("a", 0)]), snap(1, {1: 1.0, 3: 2.0}, [a0, tok("a", 1, 3)], [("a", 1)]),
           snap(2, {1: 1.0, 3: 2.0}, [a0, tok("a", 1, 3)], [])]
    found, d = classes(sub, ref)
    assert found == [] and d.total == 0 and d.steps_compared == 3
    assert d.schedule_note == "step 1: the subject keeps a@1 in full slot 3, the reference in 2"


def test_in_another_schedule_a_token_whose_kv_differs_is_named_where_its_own_run_keeps_it():
    a0, a1 = tok("a", 0, 1), tok("a", 1, 2)
    ref = [snap(0, {1: 1.0, 2: 2.0}, [a0, a1], [("a", 0), ("a", 1)]),
           snap(1, {1: 1.0, 2: 2.0}, [a0, a1], [("a", 1)])]
    moved = [a0, tok("a", 1, 4)]
    # step 0: a@1's slot holds a@0's K/V (overwritten); step 1: its K/V sits in slot 6 (misplaced)
    sub = [snap(0, {1: 1.0, 4: 1.0}, moved, [("a", 0), ("a", 1)]),
           snap(1, {1: 1.0, 4: 9.0, 6: 2.0}, moved, [("a", 1)], log={1: 0, 4: 1, 6: 1})]
    found, d = classes(sub, ref)
    assert found == [(0, 4, "overwritten"), (1, 4, "misplaced")]
    assert [(m.rid, m.pos) for m in d.mismatches] == [("a", 1), ("a", 1)]
    assert d.mismatches[0].holder == "a@0" and d.mismatches[1].found_in == 6
    assert d.schedule_note == "step 0: the subject keeps a@1 in full slot 4, the reference in 2"


def test_in_another_schedule_the_live_tokens_may_be_listed_in_another_order_and_hidden_states_follow_them():
    a0, b0 = tok("a", 0, 1), tok("b", 0, 2)
    ref = snap(0, {1: 1.0, 2: 2.0}, [a0, b0], [("a", 0), ("b", 0)])
    ref = ref.__class__(**{**{f: getattr(ref, f) for f in ref.__dataclass_fields__},
                           "hidden": torch.tensor([[1.0] * 4, [2.0] * 4])})
    sub = snap(0, {3: 2.0, 4: 1.0}, [tok("b", 0, 3), tok("a", 0, 4)], [("b", 0), ("a", 0)])
    sub = sub.__class__(**{**{f: getattr(sub, f) for f in sub.__dataclass_fields__},
                           "hidden": torch.tensor([[2.0] * 4, [1.0] * 4])})
    found, d = classes([sub], [ref])
    assert found == [] and d.schedule_note is not None


def test_a_token_live_in_one_run_only_is_where_the_schedules_part():
    a0, b0 = tok("a", 0, 1), tok("b", 0, 2)
    _, d = classes([snap(0, {1: 1.0}, [a0], [("a", 0)])], [snap(0, {1: 1.0, 2: 2.0}, [a0, b0], [("a", 0), ("b", 0)])])
    assert [(m.step, m.rid, m.pos, m.classification) for m in d.mismatches] == [(0, "b", 0, "schedule")]
    assert "b@0 is live in the reference (full slot 2), not in the subject" in d.mismatches[0].detail


def test_small_numeric_difference_is_drift_with_its_size():
    live = [tok("a", 0, 1)]
    found, d = classes([snap(0, {1: 1.001}, live, [("a", 0)])], [snap(0, {1: 1.0}, live, [("a", 0)])])
    assert found == [(0, 1, "drift")] and "max |diff|" in d.mismatches[0].detail


def test_dummy_slot_is_not_compared_but_its_writes_are_counted():
    live = [tok("a", 0, 1)]
    ref = [snap(0, {1: 1.0}, live, [("a", 0)])]
    sub = [snap(0, {0: 4.0, 1: 1.0}, live, [("a", 0)])]
    found, d = classes(sub, ref)
    assert found == [] and d.dummy_writes == 1


def test_hidden_state_differences_are_reported():
    live = [tok("a", 0, 1)]
    ref = snap(0, {1: 1.0}, live, [("a", 0)])
    sub = snap(0, {1: 1.0}, live, [("a", 0)])
    sub.hidden[0, 0] = float("nan")
    found, d = classes([sub], [ref])
    assert d.total == 1 and d.mismatches[0].pool == "hidden" and "NaN" in d.mismatches[0].detail
    assert [(c.step, c.pool, c.layer, c.count) for c in d.counts] == [(0, "hidden", None, 1)]


def test_tolerance_mode_accepts_small_differences_and_flags_large_ones():
    live = [tok("a", 0, 1)]
    ref = [snap(0, {1: 1.0}, live, [("a", 0)])]
    close = diff_runs((snap(0, {1: 1.0005}, live, [("a", 0)]),), tuple(ref), exact=False,
                      atol=1e-3, rtol=0.0)
    far = diff_runs((snap(0, {1: 1.5}, live, [("a", 0)]),), tuple(ref), exact=False,
                    atol=1e-3, rtol=0.0)
    assert close.total == 0 and far.total == 1


# ---- rules registered beside the built-in ones ----------------------------------------------------------

def _zeroed(bad, todo):
    """K and V hold zero bytes, as the dummy slot does."""
    rows = hashjoin.take(bad.row, todo)
    zero = [~hashjoin.take(part, rows).bool().any(1) for part in bad.sub]
    return zero[0] & zero[1], None


def test_a_registered_rule_classifies_the_rows_it_claims_before_the_rules_after_it():
    live = [tok("a", 0, 1), tok("a", 1, 2), tok("a", 2, 3)]
    ref = snap(0, {1: 1.0, 2: 2.0, 3: 3.0}, live, [("a", 0), ("a", 1), ("a", 2)])
    # slot 1 zeroed, slot 2 drifted, slot 3 holds a@0's row (so a@0's row is misplaced as well as zeroed);
    # the new rule goes before misplaced
    sub = snap(0, {1: 0.0, 2: 2.5, 3: 1.0}, live, [("a", 0), ("a", 1), ("a", 2)])
    rule = Rule(name="zeroed", classification="zeroed", claims=_zeroed,
                describe=lambda rows, sub, ref: [Finding(detail=f"slot {r.slot} holds zeros") for r in rows])
    at = [r.name for r in RULES].index("misplaced")
    RULES.insert(at, rule)
    try:
        d = diff_runs((sub,), (ref,))
    finally:
        RULES.remove(rule)
    assert [(m.slot, m.classification, m.detail) for m in d.mismatches] == [
        (1, "zeroed", "slot 1 holds zeros"), (2, "drift", "max |diff| 0.5"), (3, "overwritten", "holds the K/V of a@0")]
    assert d.classes == (("drift", 1), ("overwritten", 1), ("zeroed", 1))
    assert [m.classification for m in diff_runs((sub,), (ref,)).mismatches] == [
        "misplaced", "drift", "overwritten"]


def test_rules_that_leave_a_bad_row_unclaimed_are_refused():
    live = [tok("a", 0, 1)]
    rules = [Rule(name="never", classification="x", claims=lambda bad, todo: (todo < 0, None), describe=fixed("x"))]
    with pytest.raises(ValueError, match="no rule claims 1 bad rows"):
        diff_runs((snap(0, {1: 2.0}, live),), (snap(0, {1: 1.0}, live),), rules=rules)


# ---- at scale: many slots, many differences --------------------------------------------------------------

def big_snap(step, k, v, live, written=()):
    """One SWA layer pool ``k``, ``v`` [1, slots, H, D]; no full layer."""
    empty = k.new_zeros((0, *k.shape[1:]))
    return hybrid_step(step=step, kind="decode", live=tuple(live), layer_is_swa=SWA, full_k=empty, full_v=empty,
                       swa_k=k, swa_v=v, hidden=torch.zeros(len(written), 4),
                       hidden_owners=tuple(TokenKey(r, p) for r, p in written))


def big_pool(slots, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(1, slots, 2, 8, generator=gen).to(dtype)
    return k, torch.randn(1, slots, 2, 8, generator=gen).to(dtype)


def test_identical_large_caches_have_no_mismatches():
    k, v = big_pool(20_000)
    live = [tok(f"r{i % 7}", i, i) for i in range(1, 20_000)]
    d = diff_runs((big_snap(0, k, v, live),), (big_snap(0, k.clone(), v.clone(), live),))
    assert (d.total, d.mismatched_slots, d.mismatches, d.classes) == (0, 0, (), ())


def test_misplaced_row_is_found_among_many_slots():
    k, v = big_pool(50_000)
    live = [tok("a", i, i) for i in range(1, 40_000)]
    sub_k, sub_v = k.clone(), v.clone()
    sub_k[0, 45_678], sub_v[0, 45_678] = k[0, 123], v[0, 123]  # a free slot got token 123's row
    sub_k[0, 123] += 1.0
    _, d = classes([big_snap(0, sub_k, sub_v, live)], [big_snap(0, k, v, live)])
    assert [(m.slot, m.classification, m.detail) for m in d.mismatches] == [
        (123, "misplaced", "expected row found in slot 45678")
    ]


def test_overwritten_names_the_right_owner_when_many_slots_differ():
    k, v = big_pool(5_000)
    live = [tok("a", i, i) for i in range(1, 5_000)]
    gen = torch.Generator().manual_seed(1)
    victims = torch.randperm(4_999, generator=gen)[:1_500] + 1
    sources = torch.randperm(4_999, generator=gen)[:1_500] + 1
    sub_k, sub_v = k.clone(), v.clone()
    sub_k[0, victims], sub_v[0, victims] = k[0, sources], v[0, sources]
    expect = {int(s): f"holds the K/V of a@{int(src)}" for s, src in zip(victims, sources) if s != src}
    d = diff_runs((big_snap(0, sub_k, sub_v, live),), (big_snap(0, k, v, live),), limit=10_000)
    assert {m.slot: m.detail for m in d.mismatches} == expect
    assert d.classes == (("overwritten", len(expect)),) and d.mismatched_slots == len(expect)


def test_hash_collisions_are_resolved_by_comparing_bytes(monkeypatch):
    import harness.check.diff.hashjoin as hashjoin

    k, v = big_pool(300)
    live = [tok("a", i, i) for i in range(1, 300)]
    sub_k, sub_v = k.clone(), v.clone()
    sub_k[0, 7], sub_v[0, 7] = k[0, 9], v[0, 9]      # holds a@9's row
    sub_k[0, 8] += 0.5                                 # a new row: collides with every row, equals none
    sub_k[0, 20] += 0.25                               # a@20's row went ...
    sub_k[0, 150], sub_v[0, 150] = k[0, 20], v[0, 20]  # ... here, over a@150's
    sub_k[0, 299] = k[0, 20]                           # and its K alone here: not the row
    sub, ref = (big_snap(0, sub_k, sub_v, live),), (big_snap(0, k, v, live),)
    want = [(7, "kv", "overwritten", "holds the K/V of a@9"), (8, "k", "drift", "max |diff| 0.5"),
            (20, "k", "misplaced", "expected row found in slot 150"), (150, "kv", "overwritten", "holds the K/V of a@20"),
            (299, "k", "drift", "max |diff|")]

    def rows(d):
        return [(m.slot, m.what, m.classification, m.detail[:10] if m.slot == 299 else m.detail) for m in d.mismatches]

    assert rows(diff_runs(sub, ref)) == want
    # Every row now hashes alike, by line and whole: only the byte comparison tells them apart.
    monkeypatch.setattr(hashjoin, "line_hash", lambda words, rows=None: torch.zeros(
        words.shape[0] if rows is None else rows.numel(), dtype=torch.int64))
    assert rows(diff_runs(sub, ref)) == want
    monkeypatch.setattr(hashjoin, "row_hash", lambda words: torch.zeros(words.shape[0], dtype=torch.int64))
    assert rows(diff_runs(sub, ref)) == want


def test_rows_alike_in_their_first_line_send_lookups_to_whole_row_hashes(monkeypatch):
    import harness.check.diff.hashjoin as hashjoin

    # 600 live rows that all begin with the same cache line (zeros) and differ after it, as a model with a
    # dead first head would write them; a hundred slots hold another live token's row.
    gen = torch.Generator().manual_seed(3)
    k, v = torch.randn(1, 601, 2, 32, generator=gen), torch.randn(1, 601, 2, 32, generator=gen)
    k[:, :, 0, :16] = 0
    live = [tok("a", i, i) for i in range(1, 601)]
    sub_k, sub_v = k.clone(), v.clone()
    for slot in range(1, 101):
        sub_k[0, slot], sub_v[0, slot] = k[0, slot + 300], v[0, slot + 300]
    strong = []
    real = hashjoin.row_hash
    monkeypatch.setattr(hashjoin, "row_hash", lambda words: strong.append(words.shape[0]) or real(words))
    d = diff_runs((big_snap(0, sub_k, sub_v, live),), (big_snap(0, k, v, live),), limit=1_000)
    assert [(m.slot, m.detail) for m in d.mismatches] == [(s, f"holds the K/V of a@{s + 300}") for s in range(1, 101)]
    assert strong, "the lookup kept the line hashes that nominate every row"


def test_tolerance_mode_on_bf16_flags_only_differences_beyond_tolerance():
    k, v = big_pool(1_000, torch.bfloat16)
    live = [tok("a", i, i) for i in range(1, 1_000)]
    sub_k = k.clone()
    sub_k[0, 10:20] = (k[0, 10:20].float() + 0.01).to(torch.bfloat16)   # rounding-sized: within tolerance
    sub_k[0, 30, 1, 3] = k[0, 30, 1, 3] + 1.0                            # beyond
    sub_k[0, 40, 0, 0] = float("nan")
    sub, ref = (big_snap(0, sub_k, v.clone(), live),), (big_snap(0, k, v, live),)
    loose = diff_runs(sub, ref, exact=False, atol=0.1, rtol=0.05)
    assert [(m.slot, m.what, m.classification) for m in loose.mismatches] == [(30, "k", "drift"), (40, "k", "drift")]
    assert loose.mismatches[1].detail == "computed NaN"
    exact = diff_runs(sub, ref)
    assert exact.mismatched_slots == 12


def test_large_pools_read_from_deltas_compare_another_schedule_token_by_token_too(monkeypatch):
    import harness.check.diff.diff as diff_module

    monkeypatch.setattr(diff_module, "_LARGE_BYTES", 0)  # every pool read from the deltas, as a GiB one is
    test_the_same_tokens_in_other_slots_are_compared_token_by_token_and_the_schedule_is_a_note()
    test_in_another_schedule_a_token_whose_kv_differs_is_named_where_its_own_run_keeps_it()
    test_schedules_that_part_are_one_mismatch_where_they_part_after_the_steps_that_agree()

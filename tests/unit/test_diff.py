"""The slot-by-slot diff classifies each bad slot by where its contents came from."""

import torch

from harness.check.diff import diff_runs
from harness.check.snapshot import KVSnapshot
from harness.serving.pool import poison_
from harness.serving.timeline import LiveToken, TokenKey

SLOTS, H, D = 8, 1, 2
SWA = (True,)  # one SWA layer: pool "swa"


def tok(rid, pos, slot):
    return LiveToken(rid=rid, pos=pos, full_slot=slot, swa_slot=slot, in_window=True)


def snap(step, rows: dict[int, float], live, written=(), poisoned=()):
    k = torch.zeros(1, SLOTS, H, D)
    for slot, value in rows.items():
        k[0, slot] = value
    for slot in poisoned:
        poison_(k[0, slot])
    v = k.clone()
    empty = torch.zeros(0, SLOTS, H, D)
    return KVSnapshot(step=step, kind="decode", live=tuple(live), full_k=empty, full_v=empty,
                      swa_k=k, swa_v=v, hidden=torch.zeros(len(written), 4),
                      hidden_owners=tuple(TokenKey(r, p) for r, p in written))


def classes(sub, ref):
    d = diff_runs(tuple(sub), tuple(ref), layer_is_swa=SWA)
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


def test_tolerance_mode_accepts_small_differences_and_flags_large_ones():
    live = [tok("a", 0, 1)]
    ref = [snap(0, {1: 1.0}, live, [("a", 0)])]
    close = diff_runs((snap(0, {1: 1.0005}, live, [("a", 0)]),), tuple(ref), layer_is_swa=SWA, exact=False,
                      atol=1e-3, rtol=0.0)
    far = diff_runs((snap(0, {1: 1.5}, live, [("a", 0)]),), tuple(ref), layer_is_swa=SWA, exact=False,
                    atol=1e-3, rtol=0.0)
    assert close.total == 0 and far.total == 1

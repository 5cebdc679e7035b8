"""The vectorized diff against a literal, slot-at-a-time reading of the classification rules.

Random small runs with everything the rules care about: poison, rows copied from other live tokens,
rows moved to other slots (live or free) or copied from another layer, rows alike in their first cache
line and unlike after it, stale changes, slots kept from the previous step, NaN, fp8 bytes, duplicate
rows, two live tokens sharing a slot, tolerance mode. Each case is also diffed with line and row hashes
that collide for almost every row, which must change nothing, and with a limit, which must change only
how many records are built (counts per step, pool and layer included). Some cases are diffed with each
rule left out in turn, against the literal reading without it: no rule relies on another having run.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from sweeps import seeds
import torch

import harness.check.diff.hashjoin as hashjoin
from harness.check.diff.diff import diff_runs as diff_snapshots
from harness.check.diff.rules import RULES
from harness.check.diff.snapshot import hybrid_step, snapshots_of
from harness.serving.pool import is_poison, poison_
from harness.serving.timeline import LiveToken, TokenKey


def diff_runs(subject, reference, **kw):
    """The diff of two runs given step by step with their pools whole."""
    return diff_snapshots(snapshots_of(subject), snapshots_of(reference), **kw)


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def literal_diff(subject, reference, *, layer_is_swa, exact=True, atol=0.0, rtol=0.0, skip=()):
    """Every mismatch as (step, pool, layer, slot, rid, pos, what, classification, detail, holder, found_in),
    in report order, the rules named in ``skip`` left out."""
    ids = {"full": [i for i, s in enumerate(layer_is_swa) if not s], "swa": [i for i, s in enumerate(layer_is_swa) if s]}
    found, slots_seen, prev = [], set(), None

    def differs(a, b):
        if exact or a.dtype == torch.uint8:
            return _bytes(a) != _bytes(b)
        return not bool(torch.isclose(a.float(), b.float(), atol=atol, rtol=rtol, equal_nan=True).all())

    for sub, ref in zip(subject, reference):
        written = set(sub.hidden_owners)
        rows = []
        for pool in ("full", "swa"):
            sk, sv = sub.pool(pool).k, sub.pool(pool).v
            rk, rv = ref.pool(pool).k, ref.pool(pool).v
            pk, pv = (prev.pool(pool).k, prev.pool(pool).v) if prev else (None, None)
            tokens = list(sub.live) if pool == "full" else [t for t in sub.live if t.in_window]
            index = sub.groups.index(pool)
            slot_of = (lambda t: t.slots[index])
            for li in range(sk.shape[0]):
                for tok in tokens:
                    s = slot_of(tok)
                    bk, bv = differs(sk[li, s], rk[li, s]), differs(sv[li, s], rv[li, s])
                    if not (bk or bv):
                        continue
                    got_k, got_v, want_k, want_v = sk[li, s], sv[li, s], rk[li, s], rv[li, s]
                    holder = None
                    for other in tokens:
                        o = slot_of(other)
                        if _bytes(rk[li, o]) == _bytes(got_k) and _bytes(rv[li, o]) == _bytes(got_v):
                            holder = other
                    was_written = TokenKey(tok.rid, tok.pos) in written
                    changed = pk is not None and (_bytes(pk[li, s]) != _bytes(got_k) or _bytes(pv[li, s]) != _bytes(got_v))
                    elsewhere = next(
                        (j for j in range(sk.shape[1]) if j != s and _bytes(sk[li, j]) == _bytes(want_k)
                         and _bytes(sv[li, j]) == _bytes(want_v)),
                        None,
                    )
                    nan = bool(torch.isnan(got_k).any() or torch.isnan(got_v).any())
                    size = torch.maximum((got_k.float() - want_k.float()).abs().max(),
                                         (got_v.float() - want_v.float()).abs().max())
                    other_holder = holder is not None and (holder.rid, holder.pos) != (tok.rid, tok.pos)
                    named = f"{holder.rid}@{holder.pos}" if other_holder else None
                    stale = "changed in a step that did not write its owner: a padded row or a stale location"
                    # (name, applies, (classification, detail, holder, found_in)), in precedence order
                    rules = [
                        ("poisoned", is_poison(got_k) and is_poison(got_v),
                         ("unwritten", "slot still holds poison", None, None)),
                        ("holds_live_row", other_holder, ("overwritten", f"holds the K/V of {named}", named, None)),
                        ("changed_unwritten", not was_written and changed, ("overwritten", stale, None, None)),
                        ("misplaced", elsewhere is not None,
                         ("misplaced", f"expected row found in slot {elsewhere}", None, elsewhere)),
                        ("kept_old", was_written and pk is not None and not changed,
                         ("unwritten", "slot kept its previous contents", None, None)),
                        ("quantized", got_k.dtype == torch.uint8, ("drift", "quantized bytes differ", None, None)),
                        ("drift", True, ("drift", "computed NaN" if nan else f"max |diff| {float(size):.3g}", None, None)),
                    ]
                    cls = next(c for name, applies, c in rules if applies and name not in skip)
                    what = "kv" if bk and bv else ("k" if bk else "v")
                    rows.append((sub.step, pool, ids[pool][li], s, tok.rid, tok.pos, what, *cls))
                    slots_seen.add((pool, s))
        rows.sort(key=lambda r: (r[2], r[3]))
        found.extend(rows)
        prev = sub
    return found, len(slots_seen)


DTYPES = (torch.float32, torch.bfloat16, torch.uint8)


def random_runs(seed: int):
    rng = random.Random(seed)
    dtype = rng.choice(DTYPES)
    layer_is_swa = tuple(rng.random() < 0.5 for _ in range(rng.randint(1, 4)))
    heads, dim = rng.choice([(1, 2), (2, 4), (1, 8), (2, 2), (2, 32)])
    sizes = {"full": rng.randint(6, 24), "swa": rng.randint(6, 16)}
    n_layers = {"full": sum(not s for s in layer_is_swa), "swa": sum(layer_is_swa)}
    palette = [torch.randn(heads, dim) for _ in range(4)]

    def row():
        r = rng.choice(palette) if rng.random() < 0.3 else torch.randn(heads, dim)
        if dtype == torch.uint8:
            return (r * 8).to(torch.float8_e4m3fn).view(torch.uint8)
        return r.to(dtype)

    def pool_tensor(pool):
        t = torch.empty(n_layers[pool], sizes[pool], heads, dim, dtype=dtype)
        poison_(t)
        for l in range(t.shape[0]):
            t[l, 0] = 0
            for s in range(1, t.shape[1]):
                if rng.random() < 0.8:
                    t[l, s] = row()
        return t

    steps = rng.randint(1, 3)
    ref_snaps, sub_snaps = [], []
    ref_pools = {p: (pool_tensor(p), pool_tensor(p)) for p in ("full", "swa")}
    sub_pools = {p: (k.clone(), v.clone()) for p, (k, v) in ref_pools.items()}
    for step in range(steps):
        n_live = rng.randint(1, sizes["full"] - 1)
        full_slots = rng.sample(range(1, sizes["full"]), n_live)
        swa_free = list(range(1, sizes["swa"]))
        rng.shuffle(swa_free)
        live = []
        for i, fs in enumerate(full_slots):
            if rng.random() < 0.1 and live:
                fs = rng.choice(live).slots[0]  # two live tokens in one slot: a scheduler bug the diff must survive
            in_window = rng.random() < 0.6 and bool(swa_free)
            live.append(LiveToken(rid=f"r{i % 3}", pos=i, slots=(fs, swa_free.pop() if in_window else 0),
                                  in_window=in_window))
        written = tuple(TokenKey(t.rid, t.pos) for t in live if rng.random() < 0.4)
        for pool in ("full", "swa"):
            for which in range(2):
                ref_t, sub_t = ref_pools[pool][which], sub_pools[pool][which]
                for l in range(ref_t.shape[0]):
                    for s in rng.sample(range(1, sizes[pool]), min(3, sizes[pool] - 1)):
                        ref_t[l, s] = sub_t[l, s] = row()  # this step's writes, the same in both runs
        for pool in ("full", "swa"):
            sk, sv = sub_pools[pool]
            for l in range(sk.shape[0]):
                for _ in range(rng.randint(0, 4)):
                    s, j = rng.randrange(sizes[pool]), rng.randrange(sizes[pool])
                    kind = rng.randrange(9)
                    if kind == 0:
                        poison_(sk[l, s]), poison_(sv[l, s])
                    elif kind == 1:
                        sk[l, s], sv[l, s] = sk[l, j].clone(), sv[l, j].clone()
                    elif kind == 2:
                        sk[l, j], sv[l, j] = sk[l, s].clone(), sv[l, s].clone()
                        sk[l, s] = row()
                    elif kind == 3 and dtype != torch.uint8:
                        sk[l, s] = sk[l, s] + 1e-3
                    elif kind == 4 and dtype != torch.uint8:
                        sv[l, s, 0, 0] = float("nan")
                    elif kind == 5:
                        sk[l, s] = row()
                    elif kind == 6:
                        poison_(sk[l, s])
                    elif kind == 7:
                        # another slot's row in its first cache line (and beyond, for short rows), not after it
                        twin = sk[l, j].clone().view(-1)
                        line = 64 // twin.element_size()
                        if twin.numel() > line:
                            twin[line:] = row().view(-1)[line:]
                        sk[l, s], sv[l, s] = twin.view(heads, dim), sv[l, j].clone()
                    else:
                        # the row of a slot in another layer of the pool: never the same row as this layer's
                        other = rng.randrange(sk.shape[0])
                        sk[l, s], sv[l, s] = sk[other, j].clone(), sv[other, j].clone()
        hidden = torch.randn(len(written), 4)
        for snaps, pools in ((ref_snaps, ref_pools), (sub_snaps, sub_pools)):
            snaps.append(hybrid_step(
                step=step, kind="decode", live=tuple(live), layer_is_swa=layer_is_swa,
                full_k=pools["full"][0].clone(), full_v=pools["full"][1].clone(),
                swa_k=pools["swa"][0].clone(), swa_v=pools["swa"][1].clone(),
                hidden=hidden.clone(), hidden_owners=written,
            ))
    return tuple(sub_snaps), tuple(ref_snaps), layer_is_swa, dtype


def _as_rows(result):
    return [(m.step, m.pool, m.layer, m.slot, m.rid, m.pos, m.what, m.classification, m.detail, m.holder, m.found_in)
            for m in result.mismatches]


def _cells(rows):
    """Mismatches per (step, pool, layer), in order of first appearance."""
    return list(Counter((r[0], r[1], r[2]) for r in rows).items())


def _colliding_hash(words: torch.Tensor) -> torch.Tensor:
    return (words[:, 0].to(torch.int64) & 1) if words.shape[0] else torch.zeros(0, dtype=torch.int64)


def _colliding_line_hash(words: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    return _colliding_hash(words if rows is None else words[rows])


@pytest.mark.parametrize("seed", seeds(range(80), stride=4))  # a quarter in make test, all in make test-slow
def test_vectorized_diff_classifies_like_the_literal_rules(seed, monkeypatch):
    sub, ref, layer_is_swa, dtype = random_runs(seed)
    tolerant = seed % 4 == 3 and dtype != torch.uint8
    kw = dict(exact=False, atol=2e-3, rtol=0.0) if tolerant else {}
    want, want_slots = literal_diff(sub, ref, layer_is_swa=layer_is_swa, **kw)
    got = diff_runs(sub, ref, limit=10_000, **kw)
    assert _as_rows(got) == want
    assert got.total == len(want) and got.mismatched_slots == want_slots
    classes: dict[str, int] = {}
    for row in want:
        classes[row[7]] = classes.get(row[7], 0) + 1
    assert got.classes == tuple(sorted(classes.items()))
    assert [(c.step, c.pool, c.layer, c.count) for c in got.counts] == [(*key, n) for key, n in _cells(want)]
    first = diff_runs(sub, ref, limit=5, **kw)
    assert _as_rows(first) == want[:5]
    assert first.counts == got.counts and first.total == got.total and first.classes == got.classes

    # Line hashes that collide: lookups give up on them and start over on row hashes, which collide too.
    monkeypatch.setattr(hashjoin, "line_hash", _colliding_line_hash)
    assert _as_rows(diff_runs(sub, ref, limit=10_000, **kw)) == want
    monkeypatch.setattr(hashjoin, "row_hash", _colliding_hash)
    assert _as_rows(diff_runs(sub, ref, limit=10_000, **kw)) == want


@pytest.mark.parametrize("seed", seeds(range(0, 80, 5), stride=4))
@pytest.mark.parametrize("left_out", [r.name for r in RULES[:-1]])
def test_each_rule_stands_alone_when_another_is_left_out(left_out, seed):
    # What one rule computes for another (the reference rows' hashes, whether a slot changed since the
    # previous step) must not depend on the other having run first.
    sub, ref, layer_is_swa, _ = random_runs(seed)
    want, _ = literal_diff(sub, ref, layer_is_swa=layer_is_swa, skip=(left_out,))
    rules = [r for r in RULES if r.name != left_out]
    assert _as_rows(diff_runs(sub, ref, limit=10_000, rules=rules)) == want


@pytest.mark.parametrize("seed", seeds(range(0, 80, 3), stride=4))
def test_large_pools_read_from_the_deltas_give_the_same_diff(seed, monkeypatch):
    # Large pools are read from the snapshots' deltas through a slot map, each row compared again only when
    # a step changed its slot in either run (``deltas.py``); forced here on small pools, against the literal
    # rules and against the working copies' diff, record for record.
    import harness.check.diff.diff as diff_module

    sub, ref, layer_is_swa, dtype = random_runs(seed)
    tolerant = seed % 4 == 3 and dtype != torch.uint8
    kw = dict(exact=False, atol=2e-3, rtol=0.0) if tolerant else {}
    whole = diff_runs(sub, ref, limit=10_000, **kw)
    monkeypatch.setattr(diff_module, "_LARGE_BYTES", 0)
    want, want_slots = literal_diff(sub, ref, layer_is_swa=layer_is_swa, **kw)
    got = diff_runs(sub, ref, limit=10_000, **kw)
    assert got == whole
    assert _as_rows(got) == want and got.mismatched_slots == want_slots
    # slots both runs' deltas hold compared in place run by run, however short the runs
    monkeypatch.setattr(diff_module, "_RUN_SLOTS", 1)
    assert diff_runs(sub, ref, limit=10_000, **kw) == whole


@pytest.mark.parametrize("seed", seeds(range(1, 80, 3), stride=4))
@pytest.mark.parametrize("path", ["gathered", "runs in a one-slot flag buffer", "pairs of places colliding"])
def test_each_way_of_refreshing_a_large_pool_gives_the_same_diff(seed, path, monkeypatch):
    # Where the two runs' deltas hold other slots, the large-pool refresh compares the slots both hold run by
    # run in place (their flags laid side by side in one buffer, reduced a buffer at a time) or reads the
    # larger delta in place against the other pool's rows gathered; each forced here, on every case, and
    # the rules' byte comparisons kept per pair of places with every pair's hash colliding.
    import harness.check.diff.diff as diff_module

    sub, ref, layer_is_swa, dtype = random_runs(seed)
    tolerant = seed % 4 == 3 and dtype != torch.uint8
    kw = dict(exact=False, atol=2e-3, rtol=0.0) if tolerant else {}
    whole = diff_runs(sub, ref, limit=10_000, **kw)
    monkeypatch.setattr(diff_module, "_LARGE_BYTES", 0)
    if path == "gathered":
        monkeypatch.setattr(diff_module, "_RUN_SLOTS", 1 << 40)
        monkeypatch.setattr(diff_module, "_PLAN_ROWS", 3)
    elif path == "pairs of places colliding":
        # every pair of places under one hash, and room for a few: the byte comparisons kept from one step
        # for the next (``hashjoin.Pairs``) are looked up wrongly only if a pair is not checked whole
        monkeypatch.setattr(hashjoin, "_PAIR_MIX", torch.zeros(4, dtype=torch.int64))
        monkeypatch.setattr(hashjoin, "_PAIRS", 5)
    else:
        monkeypatch.setattr(diff_module, "_RUN_SLOTS", 1)
        monkeypatch.setattr(diff_module, "_RUN_FLAG_BYTES", 1)
    assert diff_runs(sub, ref, limit=10_000, **kw) == whole

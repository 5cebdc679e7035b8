"""A large pool read from the snapshots' deltas (``deltas.DeltaRows``) against the pool rebuilt whole."""

from __future__ import annotations

import pytest
import torch

from harness.check.diff import hashjoin
from harness.check.diff.deltas import DeltaCursor
from harness.check.diff.snapshot import Cursor, hybrid_step, snapshots_of
from harness.serving.pool import poison_
from harness.serving.timeline import LiveToken


def _steps(seed: int, steps: int = 4, size: int = 40):
    """Steps of a one-layer-per-group run whose every step rewrites a random share of the slots (some back
    to poison), so that a step's rows lie in several deltas and the blank pool's poison."""
    gen = torch.Generator().manual_seed(seed)
    k = torch.empty(2, size, 2, 4)
    poison_(k)
    v = k.clone()
    out = []
    for step in range(steps):
        k, v = k.clone(), v.clone()
        for t in (k, v):
            at = torch.randperm(size, generator=gen)[: size // 3]
            t[:, at] = torch.randn((2, at.numel(), 2, 4), generator=gen)
            gone = torch.randperm(size, generator=gen)[: size // 8]
            rows = t[:, gone].clone()
            poison_(rows)
            t[:, gone] = rows
        out.append(hybrid_step(step=step, live=(LiveToken(rid="a", pos=0, slots=(1, 1), in_window=True),),
                               layer_is_swa=(False, True), full_k=k[:1], full_v=v[:1], swa_k=k[1:], swa_v=v[1:],
                               hidden=torch.zeros(1, 4), hidden_owners=()))
    return snapshots_of(out)


@pytest.mark.parametrize("seed", range(6))
def test_rows_gathered_from_the_deltas_are_the_pools_rows(seed):
    snaps = _steps(seed)
    whole, mapped = Cursor(snaps[0]), DeltaCursor(snaps[0])
    gen = torch.Generator().manual_seed(100 + seed)
    for snap in snaps:
        whole.apply(snap)
        mapped.apply(snap)
        for g_index in range(2):
            want = hashjoin.words(whole.pools[g_index].k.flatten(0, 1))
            table = mapped.pools[g_index].wk
            rows = torch.randint(0, want.shape[0], (57,), generator=gen)
            assert torch.equal(table.index_select(0, rows), want[rows])
            into = torch.empty_like(want[rows])
            assert table.index_select(0, rows, out=into) is into and torch.equal(into, want[rows])
            assert torch.equal(table[:], want)


def test_same_place_is_true_only_for_rows_read_from_the_same_bytes():
    snaps = _steps(7)
    before, now = DeltaCursor(snaps[0]), DeltaCursor(snaps[0])
    before.apply(snaps[0]).apply(snaps[1])
    now.apply(snaps[0]).apply(snaps[1]).apply(snaps[2])
    a, b = before.pools[0].wk, now.pools[0].wk
    rows = torch.arange(a.shape[0])
    same = a.same_place(b, rows)
    untouched = ~torch.isin(torch.arange(a.size), snaps[2].pools[0].slots)
    assert torch.equal(same, untouched)
    # rows of the same place hold the same bytes
    assert torch.equal(a.index_select(0, rows[same]), b.index_select(0, rows[same]))


@pytest.mark.parametrize("seed", range(4))
def test_a_plan_gathers_its_rows_a_chunk_at_a_time_as_index_select_does(seed):
    snaps = _steps(seed, steps=5)
    mapped = DeltaCursor(snaps[0])
    for snap in snaps:
        mapped.apply(snap)
    table = mapped.pools[0].wk
    rows = torch.randint(0, table.shape[0], (61,), generator=torch.Generator().manual_seed(seed))
    plan = table.plan(rows)
    want = table.index_select(0, rows)
    for chunk in (1, 7, 61):
        got = torch.cat([table.gather(plan, i, min(chunk, 61 - i), torch.empty((min(chunk, 61 - i), table.shape[1]),
                                                                             dtype=table.dtype))
                         for i in range(0, 61, chunk)])
        assert torch.equal(got, want)
    # K and V share the map, so one plan serves both
    assert torch.equal(mapped.pools[0].wv.gather(plan, 0, 61, torch.empty_like(want)),
                       mapped.pools[0].wv.index_select(0, rows))

"""Both engines warm up before capture, as serving engines' graph runners do.

Warm-up runs the program eagerly ``WARMUP_RUNS`` times, as plain eager runs (no stream captures
yet, so a host sync is allowed there as on a device), islands run eagerly.  The runs are real: what they write stays written, and what the
program sets in Python meanwhile (a memo, a flag saying a table is filled) agrees with the
tensors the capture then finds, as on a device.  A graph freezes that world.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from harness.graphs import CaptureError, eager_island
from harness.graphs._warm_up import WARMUP_RUNS

from ._helpers import ENGINES, capture, no_modes_active, sync


@pytest.fixture(params=ENGINES)
def engine(request):
    return request.param


def test_program_runs_warm_up_runs_plus_the_capture_before_the_first_replay(engine):
    name, device = engine
    s = SimpleNamespace(x=torch.ones(3, device=device), runs=0)

    def fn():
        s.runs += 1
        return s.x * 2

    g = capture(fn, engine=name)
    assert s.runs == WARMUP_RUNS + 1
    g.replay()
    assert s.runs == WARMUP_RUNS + 1


class _MemoPool:
    """Caches a gather keyed by the index tensor's address, as SGLang PR 25824's pool did."""

    def __init__(self, device: str) -> None:
        self.table = torch.tensor([10.0, 20.0, 30.0], device=device)
        self.memo_key: tuple[int, int] | None = None
        self.memo_value: torch.Tensor | None = None

    def translate(self, idx: torch.Tensor) -> torch.Tensor:
        key = (idx.data_ptr(), idx.numel())
        if key != self.memo_key or self.memo_value is None:
            self.memo_key, self.memo_value = key, self.table[idx]
        return self.memo_value


def test_replay_reads_what_warm_up_memoized_not_a_fresh_computation(engine):
    name, device = engine
    pool = _MemoPool(device)
    runner = SimpleNamespace(idx=torch.tensor([0, 1], device=device))
    g = capture(lambda: pool.translate(runner.idx) * 1, engine=name, roots={"pool": pool, "runner": runner},
                static=[runner.idx, pool.table])
    runner.idx.copy_(torch.tensor([2, 2]))
    pool.memo_key = pool.memo_value = None  # the runner invalidates the memo before replay: too late
    g.replay()
    sync(device)
    # the gather ran during warm-up, outside the graph; the graph reads the tensor it cached
    assert g.outputs[0].tolist() == [10.0, 20.0]
    assert [i.path for i in g.audit.unregistered] == ["pool.memo_value"]


def test_a_host_sync_only_a_warm_up_run_takes_is_allowed_as_on_a_device(engine):
    # lazy initialization (a first call that reads a device value on the host) is why runners warm up: the
    # warm-up runs are eager, no stream is capturing yet, and CUDA lets them sync
    name, device = engine
    s = SimpleNamespace(x=torch.ones(3, device=device), runs=0, scale=None)

    def fn():
        s.runs += 1
        if s.scale is None:
            s.scale = int(s.x.sum().item())
        return s.x * s.scale

    g = capture(fn, engine=name, roots={"s": s}, static=[s.x])
    assert s.runs == WARMUP_RUNS + 1
    g.replay()
    sync(device)
    assert g.outputs[0].tolist() == [3.0, 3.0, 3.0]
    assert no_modes_active()


def test_capture_refuses_a_host_sync_the_capture_run_takes_after_clean_warm_ups(engine):
    name, device = engine
    s = SimpleNamespace(x=torch.ones(3, device=device), runs=0)

    def fn():
        s.runs += 1
        if s.runs > WARMUP_RUNS:  # only the captured run reads a device value on the host
            return s.x * s.x.sum().item()
        return s.x * 2

    with pytest.raises(CaptureError, match="_local_scalar_dense"):
        capture(fn, engine=name)
    assert s.runs == WARMUP_RUNS + 1
    assert no_modes_active()


def test_warm_up_writes_stay_written_and_capture_adds_nothing(engine):
    name, device = engine
    s = SimpleNamespace(kv=torch.zeros(3, device=device), x=torch.ones(3, device=device), seen=[])

    def fn():
        s.seen.append(s.kv.clone())
        s.kv.add_(s.x)
        return s.kv

    g = capture(fn, engine=name)
    sync(device)
    assert len(s.seen) == WARMUP_RUNS + 1
    # eager runs, one after the other, as a serving engine's warm-up: each finds the previous one's write
    assert [seen.tolist() for seen in s.seen[:WARMUP_RUNS]] == [[float(k)] * 3 for k in range(WARMUP_RUNS)]
    if name == "tape":
        assert torch.isnan(s.seen[-1]).all()  # the capture run's clone is graph memory: poison until replay
    assert s.kv.tolist() == [float(WARMUP_RUNS)] * 3  # warm-up wrote for real; capture computed nothing
    g.replay()
    sync(device)
    assert s.kv.tolist() == [WARMUP_RUNS + 1.0] * 3


class _LazyTable:
    """A pre-allocated table filled on first use, with a Python flag saying so (a lazily built lookup)."""

    def __init__(self, device: str) -> None:
        self.source = torch.arange(4.0, device=device)
        self.table = torch.zeros(4, device=device)
        self.filled = False

    def lookup(self, idx: torch.Tensor) -> torch.Tensor:
        if not self.filled:
            self.table.copy_(self.source * 10)
            self.filled = True
        return self.table[idx]


def test_lazily_filled_table_set_by_warm_up_is_what_the_graph_reads(engine):
    name, device = engine
    lazy = _LazyTable(device)
    runner = SimpleNamespace(idx=torch.tensor([0, 3], device=device))
    g = capture(lambda: lazy.lookup(runner.idx) + 1, engine=name, roots={"lazy": lazy, "runner": runner},
                static=[lazy.table, lazy.source, runner.idx])
    runner.idx.copy_(torch.tensor([1, 2], device=device))
    g.replay()
    sync(device)
    assert g.outputs[0].tolist() == [11.0, 21.0]  # as eager: the flag and the table agree
    assert lazy.table.tolist() == [0.0, 10.0, 20.0, 30.0]


def test_islands_run_eagerly_on_real_values_during_warm_up(engine):
    name, device = engine
    s = SimpleNamespace(x=torch.arange(3.0, device=device), seen=[])

    def island(h):
        s.seen.append(h.sum().item())  # a host read: fine in an island
        return h + 1

    capture(lambda: eager_island(island, s.x * 2) * 1, engine=name, islands=True)
    assert s.seen[:WARMUP_RUNS] == [6.0] * WARMUP_RUNS

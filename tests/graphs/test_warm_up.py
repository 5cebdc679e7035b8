"""Both engines warm up before capture, as serving engines' graph runners do (issue 8, point 1).

Warm-up runs the program eagerly ``WARMUP_RUNS`` times under the recorder: checked like
capture, its writes to pre-existing tensors undone, islands run eagerly.  What the program
caches in Python meanwhile is part of the world the capture sees, and a graph freezes it.
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


def test_capture_fails_in_the_warm_up_run_that_takes_a_refused_path(engine):
    name, device = engine
    s = SimpleNamespace(x=torch.ones(3, device=device), runs=0)

    def fn():
        s.runs += 1
        if s.runs == 2:  # only the second eager run reads a device value on the host
            return s.x * s.x.sum().item()
        return s.x * 2

    with pytest.raises(CaptureError, match="_local_scalar_dense"):
        capture(fn, engine=name)
    assert s.runs == 2
    assert no_modes_active()


def test_warm_up_runs_for_real_and_their_writes_are_undone_before_capture():
    s = SimpleNamespace(kv=torch.zeros(3), x=torch.ones(3), seen=[])

    def fn():
        s.seen.append(s.kv.clone())
        s.kv.add_(s.x)
        return s.kv

    g = capture(fn)
    assert len(s.seen) == WARMUP_RUNS + 1
    # eager runs, one after the other, as a serving engine's warm-up
    assert [seen.tolist() for seen in s.seen[:WARMUP_RUNS]] == [[float(k)] * 3 for k in range(WARMUP_RUNS)]
    assert torch.isnan(s.seen[-1]).all()  # the capture run's clone is graph memory: poison until replay
    assert s.kv.tolist() == [0.0, 0.0, 0.0]  # neither warm-up nor capture left a write behind
    g.replay()
    assert s.kv.tolist() == [1.0, 1.0, 1.0]


def test_islands_run_eagerly_on_real_values_during_warm_up(engine):
    name, device = engine
    s = SimpleNamespace(x=torch.arange(3.0, device=device), seen=[])

    def island(h):
        s.seen.append(h.sum().item())  # a host read: fine in an island
        return h + 1

    capture(lambda: eager_island(island, s.x * 2) * 1, engine=name, islands=True)
    assert s.seen[:WARMUP_RUNS] == [6.0] * WARMUP_RUNS

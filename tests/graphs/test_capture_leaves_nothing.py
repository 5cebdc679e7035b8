"""Capture leaves nothing computed behind, ``out=`` buffers included (issue 8, point 5).

On CUDA, memory an op allocates or grows during capture is graph-pool memory that no kernel has
written yet.  The tape poisons it like any other capture allocation.  Warm-up, which really
computes, puts a resized ``out=`` buffer back exactly, shape and contents, before capture.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from harness.graphs._warm_up import WARMUP_RUNS

from ._helpers import ENGINES, capture, sync

pytestmark = pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")


@pytest.fixture(params=ENGINES)
def engine(request):
    return request.param


def test_out_buffer_allocated_by_the_op_during_capture_holds_poison_until_replay():
    s = SimpleNamespace(x=torch.arange(4.0))

    def fn():
        scratch = torch.empty(0)  # no memory yet: add allocates it
        torch.add(s.x, 1, out=scratch)
        return scratch

    g = capture(fn)
    (out,) = g.outputs
    assert out.shape == (4,)
    assert torch.isnan(out).all()
    g.replay()
    assert out.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_existing_empty_out_buffer_the_op_fills_during_capture_holds_poison_until_replay():
    s = SimpleNamespace(x=torch.arange(4.0), out=torch.empty(0))
    g = capture(lambda: torch.add(s.x, 1, out=s.out))
    assert s.out.shape == (4,)
    assert torch.isnan(s.out).all()
    g.replay()
    assert s.out.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_out_buffer_grown_by_the_op_keeps_its_old_values_and_holds_poison_where_it_grew(engine):
    name, device = engine
    s = SimpleNamespace(x=torch.arange(4.0, device=device), out=torch.tensor([7.0, 8.0], device=device))
    g = capture(lambda: torch.add(s.x, 1, out=s.out), engine=name)
    sync(device)
    assert s.out.shape == (4,)  # capture resizes it, as on a device
    assert s.out[:2].tolist() == [7.0, 8.0]
    assert torch.isnan(s.out[2:]).all()
    g.replay()
    sync(device)
    assert s.out.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_capture_finds_an_out_buffer_that_warm_up_resized_as_it_was_before_warm_up(engine):
    name, device = engine
    s = SimpleNamespace(x=torch.arange(4.0, device=device), out=torch.tensor([7.0, 8.0], device=device), seen=[])

    def fn():
        s.seen.append(tuple(s.out.shape))
        return torch.add(s.x, 1, out=s.out)

    capture(fn, engine=name)
    # warm-up runs are real eager runs (the second finds the first's resize); capture starts from scratch
    assert s.seen == [(2,)] + [(4,)] * (WARMUP_RUNS - 1) + [(2,)]

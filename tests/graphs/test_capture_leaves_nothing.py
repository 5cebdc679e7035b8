"""Capture leaves nothing computed behind, ``out=`` buffers included.

On CUDA, memory an op allocates or grows during capture is graph-pool memory that no kernel has
written yet.  The tape poisons it like any other capture allocation.  Warm-up runs really
compute: a buffer they resized stays resized, with what they wrote in it.
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


def _add_into_static_out_when_capturing(s: SimpleNamespace) -> torch.Tensor:
    # a static path for graphs, as serving code has: eager runs allocate, capture writes the runner's buffer
    if torch.cuda.is_current_stream_capturing():
        return torch.add(s.x, 1, out=s.out)
    return s.x + 1


def test_existing_empty_out_buffer_the_op_fills_during_capture_holds_poison_until_replay():
    s = SimpleNamespace(x=torch.arange(4.0), out=torch.empty(0))
    g = capture(lambda: _add_into_static_out_when_capturing(s))
    assert s.out.shape == (4,)
    assert torch.isnan(s.out).all()
    g.replay()
    assert s.out.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_out_buffer_grown_by_the_op_during_capture_holds_poison_until_replay(engine):
    name, device = engine
    s = SimpleNamespace(x=torch.arange(4.0, device=device), out=torch.tensor([7.0, 8.0], device=device))
    g = capture(lambda: _add_into_static_out_when_capturing(s), engine=name)
    sync(device)
    assert s.out.shape == (4,)  # capture resizes it, as on a device
    if name == "tape":
        # graph memory: on a device the copy of the old values into it is captured, not run
        assert torch.isnan(s.out).all()
    g.replay()
    sync(device)
    assert s.out.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_capture_finds_an_out_buffer_as_the_warm_up_runs_resized_it(engine):
    name, device = engine
    s = SimpleNamespace(x=torch.arange(4.0, device=device), out=torch.tensor([7.0, 8.0], device=device), seen=[])

    def fn():
        s.seen.append(tuple(s.out.shape))
        return torch.add(s.x, 1, out=s.out)

    g = capture(fn, engine=name)
    sync(device)
    # warm-up runs are real eager runs: the first resizes the buffer, and it stays resized
    assert s.seen == [(2,)] + [(4,)] * WARMUP_RUNS
    assert s.out.tolist() == [1.0, 2.0, 3.0, 4.0]
    s.x.fill_(10.0)
    g.replay()
    sync(device)
    assert s.out.tolist() == [11.0] * 4

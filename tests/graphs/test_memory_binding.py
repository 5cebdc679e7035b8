"""A graph binds memory, not Python objects.

A CUDA graph keeps reading the device addresses, offsets, sizes and strides it captured.  A
program that re-points a captured tensor afterwards (``t.data = ...``, ``set_``, ``resize_``,
``t_()``, ``unsqueeze_()``) moves the Python object, not the graph; the audit names the input
whose memory or layout moved.
"""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest
import torch

from ._helpers import ENGINES, capture, sync


@pytest.fixture(params=ENGINES)
def engine(request):
    return request.param


# (id, initial tensor, mutation, what the audit says changed)
MUTATIONS = [
    pytest.param(lambda d: torch.arange(4.0, device=d), lambda x: setattr(x, "data", torch.full_like(x, 100.0)),
                 "(another storage)", id="data-assignment"),
    pytest.param(lambda d: torch.arange(4.0, device=d), lambda x: x.set_(torch.full_like(x, 100.0)),
                 "(another storage)", id="set_"),
    pytest.param(lambda d: torch.arange(4.0, device=d), lambda x: x.resize_(2), "size [4] -> [2]", id="resize_"),
    pytest.param(lambda d: torch.arange(4.0, device=d).view(2, 2), lambda x: x.t_(), "stride (2, 1) -> (1, 2)", id="t_"),
    pytest.param(lambda d: torch.arange(4.0, device=d), lambda x: x.unsqueeze_(0), "size [4] -> [1, 4]", id="unsqueeze_"),
]


@pytest.mark.parametrize(("make", "mutate", "changed"), MUTATIONS)
def test_replay_reads_the_storage_and_layout_captured_after_the_tensor_is_re_pointed(engine, make, mutate, changed):
    name, device = engine
    s = SimpleNamespace(x=make(device))
    captured = s.x.detach()  # keeps the captured memory alive: a real graph would read it freed otherwise
    g = capture(lambda: s.x * 2, engine=name, roots={"s": s}, static=[s.x])
    s.x.copy_(s.x * 3)  # writing in place is what a program should do: no report
    assert g.replay() == ()
    mutate(s.x)
    stale = g.replay()
    sync(device)
    assert torch.equal(g.outputs[0], captured * 2)
    assert [(st.path, st.kind) for st in stale] == [("s.x", "memory")]
    assert changed in stale[0].changed
    assert [(st.path, st.kind) for st in g.replay()] == [("s.x", "memory")]  # reported at every replay


def test_tape_keeps_the_captured_storage_alive_after_the_program_drops_it():
    s = SimpleNamespace(x=torch.arange(4.0))
    g = capture(lambda: s.x * 2, roots={"s": s})
    s.x.data = torch.full((4,), 100.0)  # the program's only reference to the captured storage is gone
    gc.collect()
    torch.full((4,), -1.0)  # memory freed now would be handed out again
    g.replay()
    assert g.outputs[0].tolist() == [0.0, 2.0, 4.0, 6.0]


def test_each_step_binds_the_memory_and_layout_of_its_moment_when_capture_re_points_a_tensor():
    s = SimpleNamespace(x=torch.arange(6.0).view(2, 3))
    captured = s.x.detach()

    def fn():
        a = s.x * 1
        s.x.t_()  # the program transposes its own tensor mid-capture
        b = s.x * 1
        return a, b

    g = capture(fn, roots={"s": s})
    assert s.x.shape == (3, 2)
    captured.copy_(torch.arange(6.0).view(2, 3) * 10)  # in place: no memory change
    assert g.replay() == ()
    s.x.data = torch.zeros(3, 2)  # after capture the program moves it: the graph does not follow
    (stale,) = g.replay()
    assert (stale.path, stale.kind) == ("s.x", "memory")
    a, b = g.outputs
    assert torch.equal(a, captured)
    assert torch.equal(b, captured.t())

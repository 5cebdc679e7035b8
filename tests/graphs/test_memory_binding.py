"""A graph binds memory, not Python objects.

A CUDA graph keeps reading the device addresses, offsets, sizes and strides it captured.  A
program that re-points a captured tensor afterwards (``t.data = ...``, ``set_``, ``t_()``,
``unsqueeze_()``) moves the Python object, not the graph; the audit names the input whose memory
or layout moved.  A ``resize_`` past the storage's capacity reallocates it: the graph keeps the old
block, which the allocator freed, and so does a captured storage the program no longer holds (the
tape poisons such memory).  A ``resize_`` that grows a tensor during capture is a copy of the old
block into the new one, replayed every time.  A ``resize_`` within capacity (trimming a static
input) moves no memory and is no finding.
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


def _freed(out: torch.Tensor, name: str, live: float) -> bool:
    """What a graph reads from memory the allocator freed: poison on the tape, anything but the live value on CUDA."""
    if name == "tape":
        return bool(torch.isnan(out).all())
    return not bool((out == live).any())


@pytest.mark.parametrize("drop", [
    pytest.param(lambda x: x.set_(torch.full_like(x, 100.0)), id="set_"),
    pytest.param(lambda x: setattr(x, "data", torch.full_like(x, 100.0)), id="data-assignment"),
])
def test_replay_reads_freed_memory_where_the_program_dropped_the_storage_it_captured(engine, drop):
    name, device = engine
    s = SimpleNamespace(x=torch.arange(4.0, device=device))
    g = capture(lambda: s.x * 2, engine=name, roots={"s": s}, static=[s.x])
    drop(s.x)  # the program's only reference to the captured storage is gone: the allocator frees it
    gc.collect()
    stale = g.replay()
    sync(device)
    assert [(st.path, st.kind) for st in stale] == [("s.x", "memory")]
    assert _freed(g.outputs[0], name, 200.0)


def test_replay_keeps_the_old_block_when_a_captured_tensor_is_resized_past_its_capacity(engine):
    name, device = engine
    s = SimpleNamespace(x=torch.arange(4.0, device=device))
    g = capture(lambda: s.x * 2, engine=name, roots={"s": s}, static=[s.x])
    s.x.resize_(4096)  # the storage is reallocated; the graph still reads the old (freed) block
    s.x.fill_(100.0)
    (stale,) = g.replay()
    sync(device)
    assert (stale.path, stale.kind) == ("s.x", "memory") and "(reallocated)" in stale.changed
    assert _freed(g.outputs[0], name, 200.0)
    s.x.fill_(50.0)
    g.replay()  # and keeps reading it at every replay
    sync(device)
    assert _freed(g.outputs[0], name, 100.0)


def test_resize_that_grows_a_buffer_during_capture_replays_its_copy_of_the_old_block(engine):
    name, device = engine
    s = SimpleNamespace(buf=torch.zeros(2, device=device))

    def fn():
        if torch.cuda.is_current_stream_capturing():
            s.buf.resize_(4)  # a static buffer sized lazily, to the graph's batch, at capture
        return s.buf * 2

    g = capture(fn, engine=name, roots={"s": s}, static=[s.buf])
    assert s.buf.shape == (4,)
    s.buf.fill_(5.0)  # the runner fills its buffer before replay ...
    assert g.replay() == ()
    sync(device)
    out = g.outputs[0]
    assert out[2:].tolist() == [10.0, 10.0]
    # ... but every replay first copies the old block (freed after capture) over the head of the new one
    assert _freed(out[:2], name, 10.0)
    assert _freed(s.buf[:2], name, 5.0)


def test_trimming_a_static_input_within_its_capacity_moves_no_memory_and_is_no_finding(engine):
    name, device = engine
    s = SimpleNamespace(x=torch.arange(4.0, device=device))
    g = capture(lambda: s.x * 2, engine=name, roots={"s": s}, static=[s.x])
    s.x.resize_(2)  # the runner trims its static input to the batch, inside the storage's capacity
    s.x.fill_(7.0)
    assert g.replay() == ()
    sync(device)
    assert g.outputs[0].tolist() == [14.0, 14.0, 4.0, 6.0]  # the graph reads the memory it captured
    s.x.resize_(4)  # and grows it back, still inside the capacity
    assert g.replay() == ()


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

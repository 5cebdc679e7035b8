"""Other threads while a capture runs, as ``torch.cuda.graph``'s ``capture_error_mode`` has it.

PyTorch captures in ``"global"`` mode by default: while any thread captures, a host sync on any
other thread is refused, and the capture fails with it.  ``"thread_local"`` and ``"relaxed"`` let
other threads be; the capturing thread's own host syncs stay refused in every mode (they would
synchronize the capturing stream).  Warm-up is no capture: other threads are free meanwhile.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from harness.graphs import CaptureError

from ._helpers import ENGINES, capture, sync

MODES = ("global", "thread_local", "relaxed")


@pytest.fixture(params=ENGINES)
def engine(request):
    return request.param


def _capture_while_another_thread_syncs(name: str, device: str, **options):
    """Capture while another thread reads a device value with ``.item()``; (graph or None, what the thread saw)."""
    s = SimpleNamespace(x=torch.ones(2, device=device), y=torch.full((1,), 7.0, device=device))
    started, done = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def other() -> None:
        started.wait(10)
        try:
            seen["value"] = s.y.item()
        except CaptureError as exc:
            seen["error"] = exc
        finally:
            done.set()

    def fn():
        y = s.x * 2
        if torch.cuda.is_current_stream_capturing():
            started.set()
            done.wait(10)  # the other thread syncs while this one captures
        return y

    thread = threading.Thread(target=other)
    thread.start()
    try:
        try:
            graph = capture(fn, engine=name, **options)
        except CaptureError as exc:
            seen["capture"] = exc
            graph = None
    finally:
        started.set()
        thread.join()
    return graph, seen


def test_host_sync_on_another_thread_during_a_global_mode_capture_is_refused_and_fails_the_capture(engine):
    name, device = engine
    graph, seen = _capture_while_another_thread_syncs(name, device)  # PyTorch's default mode
    assert graph is None
    other, failed = seen["error"], seen["capture"]
    assert isinstance(other, CaptureError) and other.op == "Tensor.item"
    assert "another thread" in str(other) and "test_capture_threads.py:" in other.location
    assert failed.op == "Tensor.item" and "invalidated" in str(failed)


@pytest.mark.parametrize("mode", ["thread_local", "relaxed"])
def test_other_threads_are_free_while_a_capture_runs_in_thread_local_or_relaxed_mode(engine, mode):
    name, device = engine
    graph, seen = _capture_while_another_thread_syncs(name, device, capture_error_mode=mode)
    assert seen == {"value": 7.0}
    graph.replay()
    sync(device)
    assert graph.outputs[0].tolist() == [2.0, 2.0]


@pytest.mark.parametrize("mode", MODES)
def test_capturing_threads_own_host_sync_is_refused_in_every_mode(engine, mode):
    name, device = engine
    s = SimpleNamespace(x=torch.ones(2, device=device))
    with pytest.raises(CaptureError, match="_local_scalar_dense"):
        capture(lambda: s.x * s.x.sum().item(), engine=name, capture_error_mode=mode)


def test_other_threads_are_free_during_warm_up(engine):
    name, device = engine
    s = SimpleNamespace(x=torch.ones(2, device=device), y=torch.full((1,), 7.0, device=device), runs=0, seen=[])

    def fn():
        s.runs += 1
        if s.runs == 1:  # an eager run, not a capture: another thread may read device values meanwhile
            thread = threading.Thread(target=lambda: s.seen.append(s.y.item()))
            thread.start()
            thread.join()
        return s.x * 2

    capture(fn, engine=name)
    assert s.seen == [7.0]


def test_unknown_capture_error_mode_is_refused_before_anything_runs(engine):
    name, device = engine
    s = SimpleNamespace(runs=0)

    def fn():
        s.runs += 1
        return torch.ones(1, device=device)

    with pytest.raises(ValueError, match="capture_error_mode"):
        capture(fn, engine=name, capture_error_mode="strict")
    assert s.runs == 0

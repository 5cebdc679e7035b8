"""``torch.cuda.is_current_stream_capturing()`` answers as on a device, however it is spelled.

True while the capture runs, False during warm-up, during replay (an island's Python), before and
after, on both engines; on a CPU-only torch, where the real query raises, too.  A name bound at
import (``from torch.cuda import is_current_stream_capturing``) and the ``torch._C`` entry point it
calls agree with the attribute.  The guard ``torch.cuda.is_available() and
torch.cuda.is_current_stream_capturing()`` sees the capture on a machine without CUDA; a guard
the tape cannot make see it is named in the graph's notes.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from torch.cuda import is_current_stream_capturing as bound_at_import

from harness.graphs import eager_island
from harness.graphs._warm_up import WARMUP_RUNS

from ._helpers import ENGINES, capture, sync

_ORIGINAL = torch.cuda.is_current_stream_capturing


@pytest.fixture(params=ENGINES)
def engine(request):
    return request.param


def test_capture_query_is_true_while_capturing_and_false_in_warm_up_replay_and_after(engine):
    name, device = engine
    s = SimpleNamespace(x=torch.ones(2, device=device), seen=[])

    def island(h):
        s.seen.append(("island", torch.cuda.is_current_stream_capturing()))
        return h + 1

    def fn():
        s.seen.append(("run", torch.cuda.is_current_stream_capturing()))
        return eager_island(island, s.x * 2) * 1

    g = capture(fn, engine=name, islands=True)
    assert [v for k, v in s.seen if k == "run"] == [False] * WARMUP_RUNS + [True]
    assert not any(v for k, v in s.seen if k == "island")  # islands run outside the graph
    s.seen.clear()
    g.replay()
    assert s.seen == [("island", False)]
    assert torch.cuda.is_current_stream_capturing is _ORIGINAL
    assert torch.cuda.graphs.is_current_stream_capturing is _ORIGINAL


def test_program_guarded_by_the_capture_query_replays_its_capture_branch(engine):
    name, device = engine
    s = SimpleNamespace(x=torch.ones(2, device=device))

    def fn():
        if torch.cuda.is_current_stream_capturing():  # a static path for graphs, as serving code has
            return s.x * 2
        return s.x * 3

    g = capture(fn, engine=name)
    s.x.fill_(5.0)
    g.replay()
    sync(device)
    assert g.outputs[0].tolist() == [10.0, 10.0]


def test_capture_query_is_restored_when_the_capture_fails():
    s = SimpleNamespace(x=torch.ones(2))

    def fn():
        if torch.cuda.is_current_stream_capturing():
            raise ValueError("boom at capture")
        return s.x * 2

    with pytest.raises(ValueError, match="boom at capture"):
        capture(fn)
    assert torch.cuda.is_current_stream_capturing is _ORIGINAL
    assert torch.cuda.graphs.is_current_stream_capturing is _ORIGINAL


def _every_spelling() -> tuple[bool, ...]:
    return (
        torch.cuda.is_current_stream_capturing(),
        torch.cuda.graphs.is_current_stream_capturing(),
        bound_at_import(),
        torch._C._cuda_isCurrentStreamCapturing(),
    )


def test_capture_query_answers_false_outside_any_capture(engine):
    name, device = engine
    s = SimpleNamespace(x=torch.ones(2, device=device))
    assert _every_spelling() == (False,) * 4  # an eager step of a design that asks, before any graph
    g = capture(lambda: s.x * 2, engine=name)
    g.replay()
    sync(device)
    assert _every_spelling() == (False,) * 4


def test_every_spelling_of_the_capture_query_agrees_in_warm_up_and_capture(engine):
    name, device = engine
    s = SimpleNamespace(x=torch.ones(2, device=device), seen=[])

    def fn():
        s.seen.append(_every_spelling())
        return s.x * 2

    capture(fn, engine=name)
    assert s.seen == [(False,) * 4] * WARMUP_RUNS + [(True,) * 4]


def _and_guard(s):
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():  # as torch's own SyncBatchNorm
        return s.x * 2
    return s.x * 3


def _nested_guard(s):
    if torch.cuda.is_available():
        if bound_at_import():
            return s.x * 2
    return s.x * 3


@pytest.mark.parametrize("program", [_and_guard, _nested_guard], ids=["and", "nested-if"])
def test_guard_on_cuda_availability_sees_the_capture_and_replays_the_capture_branch(engine, program):
    name, device = engine
    s = SimpleNamespace(x=torch.ones(2, device=device))
    g = capture(lambda: program(s), engine=name)
    s.x.fill_(5.0)
    g.replay()
    sync(device)
    assert g.outputs[0].tolist() == [10.0, 10.0]
    assert g.audit.notes == ()


def test_cuda_availability_asked_for_anything_else_keeps_its_answer_during_capture(engine):
    name, device = engine
    s = SimpleNamespace(x=torch.ones(2, device=device), seen=[])

    def fn():
        available = torch.cuda.is_available()  # e.g. to pick a device for a new tensor
        s.seen.append(available)
        return s.x * 2

    capture(fn, engine=name)
    assert s.seen == [torch.cuda.is_available()] * (WARMUP_RUNS + 1)


def test_guard_that_cannot_see_the_capture_is_named_in_the_graph_notes(engine):
    name, device = engine
    s = SimpleNamespace(x=torch.ones(2, device=device))

    def fn():
        on_gpu = torch.cuda.is_available()
        if on_gpu and torch.cuda.is_current_stream_capturing():
            return s.x * 2
        return s.x * 3

    g = capture(fn, engine=name)
    g.replay()
    sync(device)
    if name == "cuda":  # a device answers both questions: nothing to say
        assert g.outputs[0].tolist() == [2.0, 2.0]
        assert g.audit.notes == ()
    else:
        assert g.outputs[0].tolist() == [3.0, 3.0]
        (note,) = g.audit.notes
        assert "test_capture_query.py:" in note and "on_gpu = torch.cuda.is_available()" in note
        assert "cannot see the capture" in note

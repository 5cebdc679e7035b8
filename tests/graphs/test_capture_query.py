"""``torch.cuda.is_current_stream_capturing()`` answers as on a device (issue 8, point 2).

True while the capture runs, False during warm-up, during replay (an island's Python) and after,
on both engines; on a CPU-only torch, where the real query raises, too.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

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

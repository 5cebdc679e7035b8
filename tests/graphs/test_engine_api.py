"""The public surface: engine lookup, protocols, capture misuse."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from harness.graphs._warm_up import WARMUP_RUNS
from harness.graphs import CapturedGraph, GraphEngine, get_engine

from ._helpers import capture, no_modes_active


@pytest.mark.parametrize("name", ["tape", "cuda"])
def test_get_engine_returns_an_engine_of_that_name(name):
    engine = get_engine(name)
    assert engine.name == name
    assert isinstance(engine, GraphEngine)


def test_each_get_engine_call_returns_a_fresh_instance():
    assert get_engine("cuda") is not get_engine("cuda")


def test_unknown_engine_name_lists_known_names():
    with pytest.raises(ValueError, match="tape.*cuda"):
        get_engine("cudagraph")


def test_tape_capture_returns_a_captured_graph_with_label():
    g = get_engine("tape").capture(lambda: None, label="decode-bs4", roots={}, static_inputs=[])
    assert isinstance(g, CapturedGraph)
    assert g.label == "decode-bs4"
    assert g.replay() == ()
    assert g.audit.inputs == ()


def test_captured_callable_must_return_tensors_or_none():
    s = SimpleNamespace(x=torch.ones(2))
    before = s.x.clone()

    def fn():
        s.x.add_(1)
        return {"y": s.x}

    with pytest.raises(TypeError, match="tensor"):
        capture(fn)
    # the warm-up runs are eager runs, whatever they return; capture checks it, and its own write is undone
    assert torch.equal(s.x, before + WARMUP_RUNS)
    assert no_modes_active()


def test_captures_do_not_nest():
    with pytest.raises(RuntimeError, match="nest"):
        capture(lambda: capture(lambda: None))
    assert no_modes_active()
    capture(lambda: None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_engine_without_cuda_says_so():
    with pytest.raises(RuntimeError, match="CUDA device"):
        get_engine("cuda").capture(lambda: None, label="x", roots={}, static_inputs=[])


class _IslandOwner:
    """Holds the graph its island is captured into, as a piecewise runner does."""

    def __init__(self) -> None:
        self.scale = torch.tensor(2.0)
        self.x = torch.arange(3.0)
        self.graph = None

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def test_a_weakly_bound_island_replays_keeps_its_name_and_no_cycle_holds_its_owner():
    import gc
    import weakref

    from harness.graphs import eager_island, weakly_bound

    owner = _IslandOwner()
    island = weakly_bound(owner.attend)
    assert island.__qualname__ == "_IslandOwner.attend"
    owner.graph = capture(lambda: eager_island(island, owner.x) + 1, islands=True)
    owner.scale.fill_(3.0)  # the island is Python again at every replay: it reads the new scale
    owner.graph.replay()
    assert owner.graph.outputs[0].tolist() == [1.0, 4.0, 7.0]
    graph, died = owner.graph, weakref.ref(owner)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del owner
        assert died() is None  # reference counting alone freed it: the graph's island holds it weakly
    finally:
        if enabled:
            gc.enable()
    with pytest.raises(RuntimeError, match="_IslandOwner.attend: its object is gone"):
        graph.replay()

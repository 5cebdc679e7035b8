"""The cuda engine's warm-up / capture / segment orchestration, driven on CPU.

A stand-in for ``torch.cuda`` logs what the engine asks of CUDA; tensors stay on
the CPU.  Ops run during the stand-in "capture" (nothing is really captured), so
these tests check the order of events, the shared checker and audit, and cleanup;
the GPU tests check the numbers.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

import harness.graphs.cuda as cuda_engine
from harness.graphs import CaptureError, eager_island, get_engine

from ._helpers import capture, no_modes_active


class _FakeStream:
    def wait_stream(self, other: object) -> None:
        pass


class _FakeGraph:
    def __init__(self, fake: "_FakeCuda", index: int) -> None:
        self._fake, self.index = fake, index

    def capture_begin(self, pool=None, capture_error_mode="global") -> None:
        self._fake.log.append(("begin", self.index, pool))
        if self._fake.on_begin is not None:
            self._fake.on_begin()

    def capture_end(self) -> None:
        self._fake.log.append(("end", self.index))

    def replay(self) -> None:
        self._fake.log.append(("replay", self.index))

    def pool(self):
        return ("pool of", self.index)

    def reset(self) -> None:
        self._fake.log.append(("reset", self.index))


class _FakeCuda:
    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.pools = 0
        self.graphs = 0
        self.on_begin = None

    def is_available(self) -> bool:
        return True

    def graph_pool_handle(self):
        self.pools += 1
        return (0, self.pools)

    def Stream(self) -> _FakeStream:
        return _FakeStream()

    def current_stream(self) -> _FakeStream:
        return _FakeStream()

    @contextmanager
    def stream(self, s):
        yield

    def synchronize(self) -> None:
        pass

    def CUDAGraph(self) -> _FakeGraph:
        self.graphs += 1
        return _FakeGraph(self, self.graphs - 1)


@pytest.fixture
def fake(monkeypatch) -> _FakeCuda:
    f = _FakeCuda()
    monkeypatch.setattr(cuda_engine, "_cuda", f)
    return f


def test_warms_up_twice_then_captures_once_into_the_engine_pool(fake):
    s = SimpleNamespace(x=torch.ones(2), calls=0)

    def fn():
        s.calls += 1
        return s.x * 2

    engine = get_engine("cuda")
    g1 = engine.capture(fn, label="a", roots={"s": s}, static_inputs=[s.x])
    g2 = engine.capture(fn, label="b", roots={"s": s}, static_inputs=[s.x])
    assert s.calls == 6
    assert fake.pools == 1  # one pool shared by every graph of the engine
    assert fake.log == [("begin", 0, (0, 1)), ("end", 0), ("begin", 1, (0, 1)), ("end", 1)]
    g2.replay()
    assert fake.log[-1] == ("replay", 1)
    assert g1.label == "a" and g2.audit == g1.audit
    get_engine("cuda").capture(fn, label="c", roots={}, static_inputs=[])
    assert fake.pools == 2


def test_capture_begins_on_what_the_warm_up_runs_wrote(fake):
    s = SimpleNamespace(kv=torch.zeros(3), x=torch.ones(3))
    seen = []
    fake.on_begin = lambda: seen.append(s.kv.clone())
    capture(lambda: s.kv.add_(s.x), engine="cuda")
    assert seen[0].tolist() == [2.0, 2.0, 2.0]  # two real warm-up runs, nothing undone


def test_static_outputs_are_poisoned_after_capture(fake):
    s = SimpleNamespace(x=torch.ones(3))
    g = capture(lambda: s.x + 1, engine="cuda")
    assert torch.isnan(g.outputs[0]).all()


def test_refused_op_raises_the_same_capture_error_as_tape_and_the_capture_is_ended(fake):
    s = SimpleNamespace(x=torch.ones(3))

    def fn():
        return s.x * s.x.sum().item()

    errors = []
    for engine in ("tape", "cuda"):
        with pytest.raises(CaptureError) as info:
            capture(fn, engine=engine)
        errors.append((info.value.op, info.value.location))
    assert errors[0] == errors[1]
    # the warm-up runs are eager, as on a device: the refusal comes from the capture, which is then ended
    assert [e[0] for e in fake.log] == ["begin", "end"]
    assert no_modes_active()


def test_audit_agrees_with_tape(fake):
    pool = SimpleNamespace(kv=torch.zeros(4, 2), loc=torch.tensor([1, 3]))
    run = SimpleNamespace(x=torch.ones(2, 2))

    def fn():
        pool.kv[pool.loc] = run.x * 2
        return pool.kv.sum(0)

    audits = [
        capture(fn, engine=e, roots={"pool": pool, "run": run}, static=[pool.kv, run.x]).audit
        for e in ("tape", "cuda")
    ]
    assert audits[0] == audits[1]
    assert [i.path for i in audits[1].unregistered] == ["pool.loc"]


def test_islands_split_capture_into_segments_replayed_in_order(fake):
    s = SimpleNamespace(x=torch.ones(2), bias=1.0)
    events = fake.log

    def add_bias(t):
        events.append(("island", "add_bias"))
        return t + s.bias

    def scale(t):
        events.append(("island", "scale"))
        return t * 3

    def fn():
        a = eager_island(add_bias, s.x * 2)
        b = eager_island(scale, a + 1)
        return b - 1

    g = capture(fn, engine="cuda", islands=True)
    # Warm-up runs the islands twice; capture does not run them (their inputs are not computed).
    assert events == [
        ("island", "add_bias"), ("island", "scale"),
        ("island", "add_bias"), ("island", "scale"),
        ("begin", 0, (0, 1)), ("end", 0),
        ("begin", 1, (0, 1)), ("end", 1),
        ("begin", 2, (0, 1)), ("end", 2),
    ]
    del events[:]
    s.bias = 10.0
    g.replay()
    assert events == [
        ("replay", 0), ("island", "add_bias"), ("replay", 1), ("island", "scale"), ("replay", 2),
    ]


def test_island_statics_come_from_warm_up_and_are_poisoned(fake):
    s = SimpleNamespace(x=torch.ones(2))
    got = {}

    def fn():
        got["static"] = eager_island(lambda t: t * 5, s.x)
        return got["static"] + 0

    capture(fn, engine="cuda", islands=True)
    assert got["static"].shape == (2,)
    assert torch.isnan(got["static"]).all()


def test_exception_during_capture_ends_the_open_segment_and_cleans_up(fake):
    s = SimpleNamespace(x=torch.ones(2), calls=0)

    def fn():
        s.calls += 1
        if s.calls == 3:  # the capture pass, after two clean warm-ups
            raise ValueError("boom")
        return s.x + 1

    with pytest.raises(ValueError, match="boom"):
        capture(fn, engine="cuda")
    assert fake.log == [("begin", 0, (0, 1)), ("end", 0)]
    assert no_modes_active()
    assert eager_island(lambda: 3) == 3


def test_island_reached_differently_at_capture_than_warm_up_is_an_error(fake):
    s = SimpleNamespace(x=torch.ones(2), calls=0)

    def fn():
        s.calls += 1
        if s.calls <= 2:
            return eager_island(lambda t: t + 1, s.x)
        return s.x + 1

    g = capture(fn, engine="cuda", islands=True)  # fewer islands at capture is fine
    assert g is not None

    s.calls = 0

    def fn2():
        s.calls += 1
        if s.calls > 2:
            return eager_island(lambda t: t + 1, s.x)
        return s.x + 1

    with pytest.raises(RuntimeError, match="same order"):
        capture(fn2, engine="cuda", islands=True)
    assert no_modes_active()


def test_audit_with_islands_agrees_with_tape(fake):
    s = SimpleNamespace(x=torch.ones(3), meta=torch.arange(3.0))

    def fn():
        h = s.x * 2
        planned = eager_island(lambda m, t: m + t, s.meta, h)
        return planned * h

    audits = [capture(fn, engine=e, roots={"s": s}, static=[s.x], islands=True).audit for e in ("tape", "cuda")]
    assert audits[0] == audits[1]
    assert [i.path for i in audits[1].unregistered] == ["s.meta"]


def test_a_region_on_the_cuda_engine_captures_one_real_graph_checked_like_the_callable_form(fake):
    s = SimpleNamespace(x=torch.ones(2))
    real_graph_class = torch.cuda.CUDAGraph
    with get_engine("cuda").run() as run:
        assert torch.cuda.CUDAGraph is not real_graph_class  # the stand-in, over the backend's graphs
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin(pool=("shared",))
        y = s.x * 2
        graph.capture_end()
        other = torch.cuda.CUDAGraph()
        other.capture_begin()
        with pytest.raises(CaptureError, match="_local_scalar_dense"):
            s.x.sum().item()
        other.reset()  # abandons the open capture
        third = torch.cuda.CUDAGraph()
        third.capture_begin()
        z = s.x + 1
        third.capture_end()
    assert torch.cuda.CUDAGraph is real_graph_class
    graph.replay()
    assert graph.pool() == ("shared",) and third.pool() == ("pool of", 2)
    assert fake.log == [("begin", 0, ("shared",)), ("end", 0), ("begin", 1, None), ("end", 1),
                        ("begin", 2, None), ("end", 2), ("replay", 0)]
    assert torch.isnan(y).all() and torch.isnan(z).all()  # what the capture computed is poisoned
    assert [g.label.split(": ", 1)[1] for g in run.regions] == ["graph.capture_begin(pool=(\"shared\",))",
                                                                 "third.capture_begin()"]
    assert [i.shape for i in run.regions[0].reads] == [(2,)]
    assert run.regions[0].register(roots={"s": s}, static_inputs=[]).inputs[0].path == "s.x"
    assert no_modes_active()

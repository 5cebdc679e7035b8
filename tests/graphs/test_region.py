"""Capture regions: code that opens ``torch.cuda.graph`` itself, captured during a graph run.

The programs under test (``_plain_program.py``, ``_refusal_cases.py``) know nothing of the harness:
they use ``torch.cuda``'s names only, which a run serves from the tape on a CPU and from CUDA on a GPU.
"""

from __future__ import annotations

import ast
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness.graphs import CaptureError, GraphRun, get_engine
from harness.graphs._tape_device import NAMES, TapeDevice

from . import _plain_program
from ._helpers import ENGINES, capture, no_modes_active, sync
from ._plain_program import GraphRunner, TinyModel, capture_twice_nested
from ._refusal_cases import CASES, state


def _names() -> dict[str, object]:
    return {name: getattr(torch.cuda, name, None) for name in (*NAMES, "is_current_stream_capturing")}


def test_the_plain_program_imports_nothing_of_the_harness():
    tree = ast.parse(Path(_plain_program.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported == {"__future__", "torch"}


# -- the same results as the callable form and as eager


def _batch(rows: int, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 8, generator=gen).to(device)
    loc = (torch.randperm(15, generator=gen)[:rows] + 1).to(device)
    return x, loc


def _padded(x: torch.Tensor, loc: torch.Tensor, bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
    pad = bucket - x.shape[0]
    return (torch.cat([x, x.new_zeros(pad, x.shape[1])]), torch.cat([loc, loc.new_zeros(pad)]))


@pytest.mark.parametrize("engine_device", ENGINES)
def test_a_plain_runner_captures_and_replays_as_the_callable_form_and_eager(engine_device):
    engine_name, device = engine_device
    runner = GraphRunner(TinyModel(device), (2, 4), device)
    with get_engine(engine_name).run() as run:
        runner.capture()
    assert isinstance(run, GraphRun)
    assert [g.label.split(": ", 1)[1] for g in run.regions] == [
        "with torch.cuda.graph(graph, pool=self.pool, stream=stream):"] * 2
    assert _names() == _NAMES_BEFORE

    # the callable form of bucket 4, on a twin of the model
    twin = TinyModel(device)
    x4, loc4 = torch.zeros(4, 8, device=device), torch.zeros(4, dtype=torch.int64, device=device)
    by_callable = get_engine(engine_name).capture(
        lambda: twin.forward(x4, loc4), label="bs4", roots={"twin": twin}, static_inputs=[x4, loc4])
    reference = TinyModel(device)
    for step, rows in enumerate((3, 4, 1)):
        x, loc = _batch(rows, device, seed=step)
        got = runner.replay(x, loc).clone()
        bucket = 4 if rows > 2 else 2
        eager = reference.forward(*_padded(x, loc, bucket))[:rows]
        if bucket == 4:
            padded = _padded(x, loc, 4)
            x4.copy_(padded[0])
            loc4.copy_(padded[1])
            by_callable.replay()
        sync(device)
        assert torch.equal(got, eager), step
        if bucket == 4:
            assert torch.equal(got, by_callable.outputs[0][:rows]), step
    assert torch.equal(runner.model.kv, reference.kv)


def test_a_region_computes_nothing_and_its_outputs_hold_poison_until_the_first_replay():
    runner = GraphRunner(TinyModel("cpu"), (2,), "cpu")
    with get_engine("tape").run():
        runner.capture()
    kv_after_warm_up = runner.model.kv.clone()
    assert torch.isnan(runner.outputs[2]).all()
    assert torch.equal(runner.model.kv, kv_after_warm_up)
    runner.replay(*_batch(2, "cpu", seed=0))
    assert not torch.isnan(runner.outputs[2]).any()


def test_a_region_names_what_it_read_once_its_roots_are_registered():
    runner = GraphRunner(TinyModel("cpu"), (2,), "cpu")
    with get_engine("tape").run() as run:
        runner.capture()
    (graph,) = run.regions
    # the slices of the static buffers are taken inside the region: it reads the buffers themselves
    assert [r.shape for r in graph.reads] == [(2, 8), (2,), (8, 8), (16, 8), (8, 8)]
    assert all(i.path is None and not i.registered for i in graph.audit.inputs)  # nothing registered yet
    audit = graph.register(roots={"runner": runner}, static_inputs=[runner.x, runner.loc])
    assert [(i.path, i.registered) for i in audit.inputs] == [
        ("runner.x", True), ("runner.loc", True), ("runner.model.w1", False), ("runner.model.kv", False),
        ("runner.model.w2", False)]
    assert graph.audit is audit
    runner.model.w2 = torch.ones(8, 8)  # rebound: the graph keeps reading the captured tensor
    runner.replay(*_batch(2, "cpu", seed=1))
    assert [(s.path, s.kind, s.benign) for s in runner.graphs[2].stale] == [("runner.model.w2", "rebound", False)]
    assert graph.stale == runner.graphs[2].stale


# -- the same refusals as the callable form


def _refusal(fn) -> tuple[str, str] | None:
    try:
        fn()
    except CaptureError as error:
        return error.op, error.location
    return None


def test_a_region_refuses_exactly_what_the_callable_form_refuses():
    differ, refused = [], 0
    for case in CASES:
        s = state("cpu")
        by_callable = _refusal(lambda: capture(lambda: case.program(s)))
        s = state("cpu")

        def region() -> None:
            with get_engine("tape").run():
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    case.program(s)

        by_region = _refusal(region)
        if by_region != by_callable:
            differ.append((case.id, by_callable, by_region))
        refused += by_region is not None
    assert differ == []
    assert refused == sum(case.refused("cpu") for case in CASES) > 20
    assert no_modes_active()
    assert _names() == _NAMES_BEFORE


def test_a_refused_region_undoes_its_writes_and_records_no_graph():
    s = SimpleNamespace(kv=torch.zeros(3), x=torch.ones(3))
    with get_engine("tape").run() as run:
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(CaptureError, match="_local_scalar_dense"):
            with torch.cuda.graph(graph):
                s.kv.add_(s.x)
                s.kv.sum().item()
        assert torch.equal(s.kv, torch.zeros(3))
        with pytest.raises(RuntimeError, match="without a preceding successful capture"):
            graph.replay()
        assert not torch.cuda.is_current_stream_capturing()
    assert run.regions == [] and no_modes_active()


def test_synchronizing_inside_a_region_is_refused():
    x = torch.ones(2)
    with get_engine("tape").run():
        torch.cuda.synchronize()  # outside a capture: a no-op
        stream = torch.cuda.Stream()
        stream.synchronize()
        for sync_call in (torch.cuda.synchronize, stream.synchronize, stream.query):
            with pytest.raises(CaptureError, match="synchronization") as info:
                with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=stream):
                    y = x + 1
                    sync_call()
            assert "test_region.py" in info.value.location
        del y


def test_events_record_and_wait_inside_a_region_and_their_syncs_are_refused():
    x = torch.ones(2)
    with get_engine("tape").run() as run:
        done = torch.cuda.Event()
        done.record()
        assert done.query() and repr(done).endswith("recorded>")
        done.synchronize()  # outside a capture: a no-op
        stream = torch.cuda.Stream()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            y = x * 2
            marker = stream.record_event()  # an event node, as CUDA captures one
            torch.cuda.current_stream().wait_event(marker)
            marker.wait()
        for sync_call in (done.synchronize, done.query):
            with pytest.raises(CaptureError, match="synchronization") as info:
                with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=stream):
                    sync_call()
            assert "test_region.py" in info.value.location
        with pytest.raises(RuntimeError, match="no device time"):
            done.elapsed_time(marker)
        graph.replay()
    assert len(run.regions) == 1 and y.tolist() == [2.0, 2.0]
    assert torch.cuda.Event is _NAMES_BEFORE["Event"]


def test_a_capture_on_the_default_stream_is_refused():
    with get_engine("tape").run():
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(CaptureError, match="non-default stream"):
            graph.capture_begin()
        with torch.cuda.stream(torch.cuda.Stream()):
            graph.capture_begin()
            y = torch.ones(2) * 3
            graph.capture_end()
        graph.replay()
    assert y.tolist() == [3.0, 3.0]


# -- CUDA's rules for regions


@pytest.mark.parametrize("engine_device", ENGINES)
def test_a_second_region_while_one_is_open_is_refused(engine_device):
    engine_name, device = engine_device
    x = torch.ones(3, device=device)
    with get_engine(engine_name).run() as run:
        # on a device the nested torch.cuda.graph fails at its opening synchronize, with CUDA's own error
        with pytest.raises(CaptureError if engine_name == "tape" else RuntimeError) as info:
            capture_twice_nested(x)
        if engine_name == "tape":
            assert "do not nest" in str(info.value) and info.value.op == "torch.cuda.graph"
            assert info.value.location.endswith("with torch.cuda.graph(inner):")
    assert run.regions == []
    assert torch.equal(x, torch.ones(3, device=device)) and no_modes_active()


def test_a_second_capture_begin_while_a_capture_is_open_is_refused():
    with get_engine("tape").run() as run:
        with torch.cuda.stream(torch.cuda.Stream()):
            outer, inner = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
            outer.capture_begin()
            with pytest.raises(CaptureError, match="do not nest"):
                inner.capture_begin()
            y = torch.ones(2) + 1
            outer.capture_end()
            with pytest.raises(RuntimeError, match="already owns a captured graph"):
                outer.capture_begin()
    assert len(run.regions) == 1
    outer.replay()
    assert y.tolist() == [2.0, 2.0]


def _opens_a_region() -> None:
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        pass


def test_the_callable_form_refuses_a_region_inside_it_and_a_region_refuses_the_callable_form():
    with get_engine("tape").run() as run:
        with pytest.raises(CaptureError, match="do not nest") as info:
            capture(_opens_a_region)  # the warm-up runs open their regions; the capture run is refused
        assert info.value.op == "torch.cuda.graph"
        assert len(run.regions) == 2
        with pytest.raises(CaptureError, match="do not nest") as info:
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                capture(lambda: None)
        assert info.value.op == "GraphEngine.capture"
    assert no_modes_active()


def test_replay_before_the_capture_ends_is_an_error():
    with get_engine("tape").run() as run:
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="still open"):
            with torch.cuda.graph(graph):
                y = torch.ones(2) * 2
                graph.replay()
        with pytest.raises(RuntimeError, match="pool\\(\\) without a preceding successful capture"):
            graph.pool()
    assert run.regions == []
    del y


def test_reset_frees_the_graph_and_a_new_capture_may_follow():
    s = SimpleNamespace(x=torch.ones(2))
    with get_engine("tape").run() as run:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = s.x * 2
        captured = graph.captured
        graph.reset()
        with pytest.raises(RuntimeError, match="without a preceding successful capture"):
            graph.replay()
        with pytest.raises(RuntimeError, match="was reset"):
            captured.replay()
        with torch.cuda.graph(graph):
            z = s.x * 5
    graph.replay()
    assert z.tolist() == [5.0, 5.0] and len(run.regions) == 2
    del y


def test_a_capture_left_open_at_the_end_of_the_run_is_abandoned_and_named():
    s = SimpleNamespace(kv=torch.zeros(2))
    before = _names()
    with pytest.raises(RuntimeError, match="capture still open.*test_region.py"):
        with get_engine("tape").run():
            with torch.cuda.stream(torch.cuda.Stream()):
                torch.cuda.CUDAGraph().capture_begin()
                s.kv.add_(1)
    assert torch.equal(s.kv, torch.zeros(2)) and no_modes_active()
    assert _names() == before


# -- pools


def test_graphs_captured_into_one_pool_share_its_memory():
    s = SimpleNamespace(x=torch.arange(4.0))

    def program(pool_of) -> tuple[list, list]:
        graphs, outs = [], []
        for k in range(3):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool_of(graphs)):
                outs.append(((s.x + k) * 2).sum(0, keepdim=True))  # two intermediates, dead at the end
            graphs.append(graph)
        return graphs, outs

    with get_engine("tape").run():
        shared, shared_outs = program(lambda graphs: graphs[0].pool() if graphs else None)
        handle = torch.cuda.graph_pool_handle()
        by_handle, _ = program(lambda graphs: handle)
        alone, _ = program(lambda graphs: None)
    assert shared[0].pool() is shared[1].pool() is shared[2].pool()
    assert by_handle[0].pool() is handle is by_handle[2].pool()
    assert len({id(g.pool()) for g in alone}) == 3
    assert "reuses" not in shared[0].captured.trace()
    assert "reuses" in shared[1].captured.trace() and "reuses" in by_handle[2].captured.trace()
    assert not any("reuses" in g.captured.trace() for g in alone)
    s.x.copy_(torch.tensor([1.0, 0.0, 0.0, 0.0]))
    for graph in shared:
        graph.replay()
    assert [o.item() for o in shared_outs] == [2.0, 10.0, 18.0]


def test_a_pool_of_another_kind_is_refused():
    with get_engine("tape").run():
        with pytest.raises(TypeError, match="graph_pool_handle"):
            with torch.cuda.graph(torch.cuda.CUDAGraph(), pool=(0, 1)):
                pass


# -- the stand-ins, and what is patched when


_NAMES_BEFORE = _names()


def test_the_stand_ins_answer_outside_a_capture_and_the_query_inside_one():
    answers = {}
    with get_engine("tape").run(device=TapeDevice(capability=(8, 0), total_memory=2**30, count=2)):
        answers["capability"] = torch.cuda.get_device_capability()
        answers["memory"] = torch.cuda.mem_get_info()
        answers["count"] = torch.cuda.device_count()
        answers["capturing outside"] = torch.cuda.is_current_stream_capturing()
        default = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(default)
        with torch.cuda.stream(side):
            answers["current in stream()"] = torch.cuda.current_stream() is side
        answers["current after"] = torch.cuda.current_stream() is default is torch.cuda.default_stream()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            answers["capturing inside"] = torch.cuda.is_current_stream_capturing()
            answers["capability inside"] = torch.cuda.get_device_capability()
            y = torch.ones(1) + 1
        answers["capturing after"] = torch.cuda.is_current_stream_capturing()
        torch.cuda.synchronize()
    assert answers == {
        "capability": (8, 0), "memory": (2**30, 2**30), "count": 2, "capturing outside": False,
        "current in stream()": True, "current after": True, "capturing inside": True, "capability inside": (8, 0),
        "capturing after": False,
    }
    del y


def test_nothing_is_patched_outside_a_run_even_after_an_error():
    assert _names() == _NAMES_BEFORE
    with pytest.raises(ZeroDivisionError):
        with get_engine("tape").run():
            assert torch.cuda.CUDAGraph is not _NAMES_BEFORE["CUDAGraph"]
            assert torch.cuda.graph is not _NAMES_BEFORE["graph"]
            1 / 0
    assert _names() == _NAMES_BEFORE
    with pytest.raises(RuntimeError, match="do not nest"):
        with get_engine("tape").run(), get_engine("tape").run():
            pass
    assert _names() == _NAMES_BEFORE


def test_another_thread_gets_torch_cuda_itself_while_a_run_is_active():
    real_count = torch.cuda.device_count()
    seen: dict[str, object] = {}
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        inside.wait()
        seen["count"] = torch.cuda.device_count()
        seen["stream"] = type(torch.cuda.current_stream()).__module__ if torch.cuda.is_available() else None
        release.set()

    thread = threading.Thread(target=other)
    thread.start()
    with get_engine("tape").run(device=TapeDevice(count=3)):
        inside.set()
        release.wait(timeout=30)
        seen["mine"] = torch.cuda.device_count()
    thread.join()
    assert seen["count"] == real_count and seen["mine"] == 3
    assert _names() == _NAMES_BEFORE


def test_runs_on_two_threads_capture_their_own_regions():
    results: dict[int, list] = {}
    barrier = threading.Barrier(2)

    def work(k: int) -> None:
        x = torch.full((2,), float(k))
        with get_engine("tape").run() as run:
            barrier.wait(timeout=30)
            graph = torch.cuda.CUDAGraph()
            # "global" would refuse the other thread's synchronize that opens torch.cuda.graph, as CUDA does
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                y = x * 10
            barrier.wait(timeout=30)
        graph.replay()
        results[k] = [len(run.regions), y.tolist()]

    threads = [threading.Thread(target=work, args=(k,)) for k in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {1: [1, [10.0, 10.0]], 2: [1, [20.0, 20.0]]}
    assert _names() == _NAMES_BEFORE


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_cuda_run_wraps_only_the_graph_class_and_captures_real_graphs():
    before = _names()
    x = torch.ones(4, device="cuda")
    with get_engine("cuda").run() as run:
        assert {n for n in NAMES if getattr(torch.cuda, n) is not before[n]} == {"CUDAGraph"}
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = x * 3
        with pytest.raises(CaptureError, match="_local_scalar_dense"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                (x * 2).sum().item()
    x.fill_(2.0)
    graph.replay()
    torch.cuda.synchronize()
    assert y.tolist() == [6.0] * 4 and len(run.regions) == 1
    assert [i.shape for i in run.regions[0].reads] == [(4,)]
    assert _names() == before

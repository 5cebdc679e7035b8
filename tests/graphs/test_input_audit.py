"""The input audit names what a graph reads and flags rebinding.

A tensor the graph writes whole before it reads it (an ``out=`` buffer, a ``copy_``/``fill_``
target) is no input.  Module-level state of the code under test (``module_roots``) is named
``module.attr``; the objects a caller passes as roots name a tensor first.
"""

from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch

from harness.graphs import GraphInput, eager_island, module_roots

from ._helpers import ENGINES, capture, sync

_MODULE_STATE: dict[str, torch.Tensor] = {}
_module_table: torch.Tensor | None = None  # a module global of this test module, refreshed by "eager" code


@pytest.fixture(params=ENGINES)
def engine(request):
    return request.param


def test_audit_lists_unregistered_input_with_attribute_path():
    pool = SimpleNamespace(kv=torch.zeros(4, 2), loc=torch.tensor([0, 1]))
    runner = SimpleNamespace(x=torch.ones(2, 2))

    def fn():
        pool.kv[pool.loc] = runner.x
        return pool.kv.sum()

    g = capture(fn, roots={"pool": pool, "runner": runner}, static=[pool.kv, runner.x])
    assert g.audit.unregistered == (GraphInput(path="pool.loc", shape=(2,), dtype="int64", registered=False),)
    assert {i.path for i in g.audit.inputs} == {"pool.kv", "pool.loc", "runner.x"}


def test_audit_path_is_none_for_tensor_no_root_holds():
    hidden = torch.ones(3)
    g = capture(lambda: hidden * 2, roots={"nothing": SimpleNamespace()})
    assert g.audit.inputs == (GraphInput(path=None, shape=(3,), dtype="float32", registered=False),)


@dataclass(slots=True)
class _Slotted:
    buf: torch.Tensor


class _WithSlots:
    __slots__ = ("table",)

    def __init__(self) -> None:
        self.table = torch.ones(2)


@dataclass
class _Config:
    layers: list[torch.Tensor] = field(default_factory=lambda: [torch.ones(2), torch.ones(2) * 2])
    named: dict[str, torch.Tensor] = field(default_factory=lambda: {"scale": torch.ones(2) * 3})


def test_audit_finds_paths_through_containers_slots_dataclasses_and_modules():
    lin = torch.nn.Linear(2, 2)
    roots = {
        "cfg": _Config(),
        "slotted": _Slotted(torch.ones(2)),
        "plain": _WithSlots(),
        "model": SimpleNamespace(net=torch.nn.Sequential(lin)),
    }

    def fn():
        cfg = roots["cfg"]
        with torch.no_grad():
            h = cfg.layers[1] + cfg.named["scale"] + roots["slotted"].buf + roots["plain"].table
            return lin(h)

    g = capture(fn, roots=roots)
    paths = {i.path for i in g.audit.inputs}
    assert paths == {
        "cfg.layers[1]",
        "cfg.named[scale]",
        "slotted.buf",
        "plain.table",
        "model.net.0.weight",
        "model.net.0.bias",
    }
    assert g.replay() == ()
    roots["cfg"].layers[1] = torch.zeros(2)
    roots["cfg"].named["scale"] = torch.zeros(2)
    lin.weight = torch.nn.Parameter(torch.zeros(2, 2))
    assert {s.path for s in g.replay()} == {"cfg.layers[1]", "cfg.named[scale]", "model.net.0.weight"}


def test_audit_excludes_capture_produced_tensors_and_lists_the_root_of_views():
    s = SimpleNamespace(x=torch.arange(8.0))

    def fn():
        tmp = s.x + 1
        v = s.x.view(2, 4)[1]  # a view made during capture: its root is s.x
        return tmp[:4] * v

    g = capture(fn, roots={"s": s})
    assert [i.path for i in g.audit.inputs] == ["s.x"]


def test_audit_deduplicates_inputs_by_identity():
    s = SimpleNamespace(x=torch.ones(3))
    g = capture(lambda: s.x + s.x * s.x, roots={"s": s})
    assert len(g.audit.inputs) == 1


def test_audit_matches_a_different_object_viewing_the_same_memory():
    s = SimpleNamespace(w=torch.ones(2, 2))
    g = capture(lambda: s.w.data * 2, roots={"s": s})  # .data is a new tensor object over s.w
    assert [i.path for i in g.audit.inputs] == ["s.w"]


def test_registered_means_sharing_storage_with_a_static_input():
    big = torch.zeros(10)
    s = SimpleNamespace(part=big[2:5], other=torch.ones(3))
    g = capture(lambda: s.part + s.other, roots={"s": s}, static=[big])
    by_path = {i.path: i.registered for i in g.audit.inputs}
    assert by_path == {"s.part": True, "s.other": False}


def test_audit_includes_tensors_passed_into_an_island():
    s = SimpleNamespace(meta=torch.ones(2))
    g = capture(lambda: eager_island(lambda m: m * 2, s.meta) + 1, roots={"s": s}, islands=True)
    assert [i.path for i in g.audit.inputs] == ["s.meta"]


def test_in_place_update_is_not_stale():
    s = SimpleNamespace(x=torch.ones(3))
    g = capture(lambda: s.x * 2, roots={"s": s})
    s.x.fill_(4.0)
    assert g.replay() == ()


def test_audit_walk_survives_cycles_and_depth():
    a = SimpleNamespace()
    a.self_ref = a
    deep = SimpleNamespace(t=torch.ones(1))
    for _ in range(8):
        deep = SimpleNamespace(child=deep)
    a.deep = deep
    a.near = torch.ones(2)
    g = capture(lambda: a.near + 1, roots={"a": a})
    assert [i.path for i in g.audit.inputs] == ["a.near"]


def test_audit_does_not_walk_into_graphs_a_root_holds():
    hidden = torch.ones(2)
    runner = SimpleNamespace(graphs={})
    runner.graphs["first"] = capture(lambda: hidden + 1)
    g = capture(lambda: hidden * 2, roots={"runner": runner})
    assert [i.path for i in g.audit.inputs] == [None]


# -- an audit without noise


def test_audit_names_a_view_by_its_base_path_and_the_slice():
    runner = SimpleNamespace(out_cache_loc_swa=torch.arange(16), table=torch.arange(24.0).view(4, 6))
    swa, rows, row, every_other = (runner.out_cache_loc_swa[:4], runner.table[1:3, :2], runner.table[2],
                                   runner.out_cache_loc_swa[2::2])
    g = capture(lambda: (swa + 1, rows * 1, row * 1, every_other + 1), roots={"runner": runner})
    assert [i.path for i in g.audit.inputs] == [
        "runner.out_cache_loc_swa[:4]", "runner.table[1:3, :2]", "runner.table[2]", "runner.out_cache_loc_swa[2::2]"]


def test_audit_names_a_view_no_slice_makes_by_its_base_and_strides():
    runner = SimpleNamespace(table=torch.arange(6.0).view(2, 3))
    flipped = runner.table.t()
    g = capture(lambda: flipped * 1, roots={"runner": runner})
    assert [i.path for i in g.audit.inputs] == ["runner.table.as_strided([3, 2], (1, 3), 0)"]


def test_audit_follows_int_keyed_dicts_and_the_lists_in_them():
    backend = SimpleNamespace(graph_metadata={4: [torch.ones(4), torch.zeros(4)]}, by_layer={0: torch.ones(2)})
    g = capture(lambda: (backend.graph_metadata[4][1] + backend.by_layer[0].sum()), roots={"backend": backend})
    assert {i.path for i in g.audit.inputs} == {"backend.graph_metadata[4][1]", "backend.by_layer[0]"}


class _Batch:
    """An object a cache is keyed by (a forward batch, say): no literal writes it back."""


def test_audit_names_dict_entries_keyed_by_a_tuple_or_an_object_and_watches_them():
    batch = _Batch()
    pool = SimpleNamespace(_cache={(4, "decode"): torch.ones(4)}, _by_batch={"x": 0, batch: torch.zeros(2)})
    g = capture(lambda: pool._cache[(4, "decode")].sum() + pool._by_batch[batch].sum(), roots={"pool": pool})
    assert {i.path for i in g.audit.inputs} == {"pool._cache[(4, 'decode')]", "pool._by_batch[<_Batch #1>]"}
    pool._by_batch[batch] = torch.ones(2)  # rebuilt, and nothing refreshes what the graph reads
    (stale,) = g.replay()
    assert (stale.path, stale.kind, stale.benign) == ("pool._by_batch[<_Batch #1>]", "rebound", False)


def test_rebound_attribute_is_benign_while_the_captured_tensor_is_refreshed_before_each_replay():
    runner = SimpleNamespace(loc=torch.zeros(8, dtype=torch.int64))
    pool = SimpleNamespace(swa_loc=runner.loc[:4])
    g = capture(lambda: pool.swa_loc + 1, roots={"pool": pool, "runner": runner}, static=[runner.loc])
    pool.swa_loc = torch.zeros(2, dtype=torch.int64)  # the stateful shortcut now points elsewhere
    runner.loc[:4].copy_(torch.arange(4))  # but the buffer the graph reads is refilled in place
    (stale,) = g.replay()
    assert (stale.path, stale.kind, stale.benign) == ("pool.swa_loc", "rebound", True)
    (stale,) = g.replay()  # nothing refreshed the captured buffer since the previous replay
    assert (stale.path, stale.kind, stale.benign) == ("pool.swa_loc", "rebound", False)


def test_rebound_attribute_is_a_finding_when_nothing_refreshes_the_captured_tensor():
    backend = SimpleNamespace(page_table=torch.zeros(4, dtype=torch.int64))
    g = capture(lambda: backend.page_table * 2, roots={"backend": backend})
    backend.page_table = torch.arange(4)  # rebuilt as a new tensor (SGLang PR 26019 review)
    (stale,) = g.replay()
    assert (stale.path, stale.kind, stale.benign) == ("backend.page_table", "rebound", False)
    assert g.outputs[0].tolist() == [0, 0, 0, 0]


def test_rebinding_the_base_of_a_captured_view_is_reported_under_the_view_path():
    runner = SimpleNamespace(positions=torch.arange(8))
    view = runner.positions[:4]
    g = capture(lambda: view * 1, roots={"runner": runner})
    runner.positions = torch.zeros(8, dtype=torch.int64)
    (stale,) = g.replay()
    assert (stale.path, stale.kind, stale.benign) == ("runner.positions[:4]", "rebound", False)


def test_replay_resolves_module_attributes_without_module_getattr(monkeypatch):
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))
    s = SimpleNamespace(x=torch.ones(2, 4), net=net)

    def fn():
        with torch.no_grad():
            return s.net(s.x)

    g = capture(fn, roots={"s": s})
    assert {i.path for i in g.audit.inputs} == {"s.x", "s.net.0.weight", "s.net.0.bias", "s.net.2.weight", "s.net.2.bias"}
    calls = []
    original = torch.nn.Module.__getattr__
    monkeypatch.setattr(torch.nn.Module, "__getattr__", lambda self, name: calls.append(name) or original(self, name))
    assert g.replay() == ()
    assert calls == []
    net[2].weight = torch.nn.Parameter(torch.zeros(4, 4))
    assert [st.path for st in g.replay()] == ["s.net.2.weight"]


@pytest.mark.parametrize("overwrite", [
    pytest.param(lambda s: torch.mul(s.x, 2, out=s.scratch), id="out="),
    pytest.param(lambda s: s.scratch.copy_(s.x), id="copy_"),
    pytest.param(lambda s: s.scratch.fill_(3.0), id="fill_"),
    pytest.param(lambda s: s.scratch.zero_(), id="zero_"),
])
def test_buffer_the_graph_overwrites_whole_before_reading_it_is_no_input(engine, overwrite):
    name, device = engine
    s = SimpleNamespace(x=torch.arange(4.0, device=device), scratch=torch.empty(4, device=device))

    def fn():
        overwrite(s)
        return s.scratch + 1

    g = capture(fn, engine=name, roots={"s": s}, static=[s.x])
    assert g.audit.unregistered == ()
    s.x.fill_(1.0)
    g.replay()
    sync(device)
    overwrite(s)
    assert torch.equal(g.outputs[0], s.scratch + 1)


@pytest.mark.parametrize("use", [
    pytest.param(lambda s: s.scratch.add_(s.x), id="read-modify-write"),
    pytest.param(lambda s: s.scratch[:2].copy_(s.x[:2]), id="partial-overwrite"),
    pytest.param(lambda s: torch.add(s.scratch, 1, out=s.scratch), id="out=-reads-it-too"),
])
def test_buffer_the_graph_reads_before_or_while_writing_it_stays_an_input(engine, use):
    name, device = engine
    s = SimpleNamespace(x=torch.arange(4.0, device=device), scratch=torch.zeros(4, device=device))

    def fn():
        use(s)
        return s.scratch + 1

    g = capture(fn, engine=name, roots={"s": s}, static=[s.x])
    assert [i.path for i in g.audit.unregistered] == ["s.scratch"]


def _reads_module_state():
    return _module_table * 2


def test_module_global_of_the_code_under_test_is_named_module_dot_attr_and_watched(engine):
    global _module_table
    name, device = engine
    _module_table = torch.arange(4.0, device=device)
    runner = SimpleNamespace(x=torch.ones(4, device=device))
    roots = {"runner": runner, **module_roots(_reads_module_state)}
    assert list(roots) == ["runner", __name__]
    g = capture(lambda: _reads_module_state() + runner.x, engine=name, roots=roots, static=[runner.x])
    assert [i.path for i in g.audit.unregistered] == [f"{__name__}._module_table"]
    _module_table = torch.zeros(4, device=device)  # the eager path refreshes the global with a new tensor
    (stale,) = g.replay()
    assert (stale.path, stale.kind, stale.benign) == (f"{__name__}._module_table", "rebound", False)


def test_a_tensor_a_root_object_holds_is_named_by_that_root_before_any_module_global(engine):
    name, device = engine
    runner = SimpleNamespace(x=torch.ones(4, device=device))
    _MODULE_STATE["x"] = runner.x  # the same tensor, one step from the module
    roots = {"runner": SimpleNamespace(deep=SimpleNamespace(holder=runner)), **module_roots(_reads_module_state)}
    g = capture(lambda: _MODULE_STATE["x"] * 2, engine=name, roots=roots)
    assert [i.path for i in g.audit.inputs] == ["runner.deep.holder.x"]


def test_module_roots_name_the_defining_modules_of_functions_classes_and_instances():
    from harness.graphs import tape

    engine = tape.TapeEngine()
    assert list(module_roots(_reads_module_state, engine, tape.TapeGraph)) == [__name__]  # graph machinery is never walked
    assert list(module_roots(SimpleNamespace(), torch.nn.Linear(2, 2), print)) == []  # nor stdlib, torch or builtins


class _Runner:
    """A runner as serving engines write one: it holds its buffers and the graph captured over them."""

    def __init__(self, device: str) -> None:
        self.loc = torch.arange(4, device=device)
        self.graph = None


def _replays_until_compiled(g, n: int = 12) -> None:
    # past the tape's and the watch's COMPILE_AFTER: the generated replay and probe are built and run too
    for _ in range(n):
        assert g.replay() == ()


def test_a_runner_holding_its_graph_dies_by_reference_counting_alone(engine):
    name, device = engine
    runner = _Runner(device)
    runner.graph = capture(lambda: runner.loc * 2, roots={"runner": runner}, engine=name)
    _replays_until_compiled(runner.graph)
    died = weakref.ref(runner)
    enabled = gc.isenabled()
    gc.disable()  # nothing but reference counting frees the runner, its graph and the graph's tape
    try:
        del runner
        assert died() is None
    finally:
        if enabled:
            gc.enable()


def test_a_root_without_weak_references_is_held_and_its_paths_still_watched(engine):
    name, device = engine
    state = {"table": torch.zeros(3, device=device)}  # a dict takes no weak reference
    g = capture(lambda: state["table"] + 1, roots={"state": state}, engine=name)
    _replays_until_compiled(g)
    state["table"] = torch.ones(3, device=device)
    (stale,) = g.replay()
    assert (stale.path, stale.kind, stale.benign) == ("state[table]", "rebound", False)


def test_a_graph_replayed_after_its_root_is_gone_reports_nothing_of_the_root_and_still_watches_memory(engine):
    name, device = engine
    runner = _Runner(device)
    loc = runner.loc
    g = capture(lambda: loc * 2, roots={"runner": runner}, engine=name)
    _replays_until_compiled(g, 3)
    del runner  # nobody can rebind anything under it any more: the graph reads what it captured
    for _ in range(10):  # the listed probe, then the compiled one
        assert g.replay() == ()
    sync(device)
    assert g.outputs[0].tolist() == [0, 2, 4, 6]
    loc.data = torch.zeros(4, dtype=torch.int64, device=device)  # the captured tensor itself re-pointed
    (stale,) = g.replay()
    assert stale.kind == "memory"

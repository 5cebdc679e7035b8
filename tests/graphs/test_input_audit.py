"""The input audit names what a graph reads and flags rebinding (point 7)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from harness.graphs import GraphInput, eager_island

from ._helpers import capture


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

"""A task's result crosses from its child to the caller as the same objects: frozen slotted dataclasses by
their field values, everything else as pickle carries it."""

from __future__ import annotations

import pickle
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.check.run import wire
from harness.check.run.workers import run_grouped


@dataclass(frozen=True, slots=True)
class Leaf:
    slot: int
    name: str = "leaf"
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Node:
    leaves: list[Leaf]
    tensor: torch.Tensor | None = None
    back: list[Any] = field(default_factory=list)
    derived: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "derived", len(self.leaves))


@dataclass(frozen=True, slots=True)
class Child(Leaf):
    extra: float = 0.5


@dataclass(frozen=True, slots=True)
class OwnReduce:
    value: int

    def __reduce__(self) -> tuple[Any, ...]:
        return (OwnReduce, (self.value * 10,))


@dataclass
class Plain:
    value: int


@dataclass(frozen=True)
class Unslotted(Leaf):  # inherits Leaf's pickling, but its own fields live in a __dict__
    note: str = "n"


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Weak:
    value: int


def _roundtrip(obj: Any) -> Any:
    return wire.loads(wire.dumps(obj))


def test_frozen_slotted_dataclasses_come_back_field_for_field() -> None:
    shared = Leaf(3, "shared", ("a", "b"))
    node = Node([shared, shared, Child(4, extra=2.5)], tensor=torch.arange(6.0))
    back = _roundtrip(node)
    assert back.leaves[:2] == [shared, shared] and back.leaves[0] is back.leaves[1]
    assert type(back.leaves[2]) is Child and back.leaves[2] == Child(4, extra=2.5)
    assert torch.equal(back.tensor, node.tensor) and back.derived == 3
    assert hash(back.leaves[0]) == hash(shared)


def test_an_object_that_leads_back_to_itself_is_one_object_again() -> None:
    node = Node([Leaf(1)])
    node.back.append(node)
    back = _roundtrip(node)
    assert back.back[0] is back


def test_classes_with_their_own_pickling_keep_it() -> None:
    assert _roundtrip(OwnReduce(2)) == OwnReduce(20)
    assert _roundtrip([Plain(1), {"k": Path("/x")}]) == [Plain(1), {"k": Path("/x")}]
    assert wire._fast(Unslotted) is None and wire._fast(OwnReduce) is None
    assert _roundtrip(Unslotted(1, note="kept")) == Unslotted(1, note="kept")
    weak = _roundtrip(Weak(5))
    assert weak == Weak(5) and weakref.ref(weak)() is weak


def test_the_fast_path_gives_what_pickle_gives() -> None:
    obj = {"nodes": [Node([Leaf(i, str(i)) for i in range(5)]) for _ in range(3)], "n": 1.5}
    assert pickle.dumps(_roundtrip(obj)) == pickle.dumps(pickle.loads(pickle.dumps(obj)))


def test_a_result_with_the_wrong_number_of_fields_is_refused() -> None:
    # a child and its caller run the same code, so this is a corrupt stream, never a version skew
    with pytest.raises(pickle.UnpicklingError, match="Leaf: 1 field values for a class that takes 3"):
        wire._set_fields(object.__new__(Leaf), (1,))
    with pytest.raises(pickle.UnpicklingError, match="Plain: 1 field values for a class that takes none"):
        wire._set_fields(object.__new__(Plain), (1,))


def _task(n: int) -> Node:
    return Node([Leaf(k) for k in range(n)], tensor=torch.full((2,), float(n)))


def test_results_from_a_child_process_arrive_whole() -> None:
    got = run_grouped(_task, [2, 3], [[0, 1]], jobs=1, timeout_s=lambda _: 60.0)
    assert got[0].leaves == [Leaf(0), Leaf(1)] and got[1].derived == 3
    assert torch.equal(got[1].tensor, torch.full((2,), 3.0))

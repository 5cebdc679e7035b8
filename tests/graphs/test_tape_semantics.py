"""The tape engine reproduces CUDA-graph semantics.

Python is frozen at capture, tensors are bound by identity, capture computes nothing, views are free
and other ops write into their static outputs, and eager islands re-run as Python at replay.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from harness.graphs import eager_island
from harness.graphs._warm_up import WARMUP_RUNS

from ._helpers import OpLog, capture, twice

# -- 1. Python runs only at capture


def test_branch_taken_at_capture_is_frozen():
    s = SimpleNamespace(x=torch.ones(3), mode="double")

    def fn():
        if s.mode == "double":
            return s.x * 2
        return s.x * 3

    g = capture(fn)
    s.mode = "triple"
    s.x.fill_(5.0)
    g.replay()
    assert g.outputs[0].tolist() == [10.0, 10.0, 10.0]


def test_python_number_read_at_capture_is_frozen():
    s = SimpleNamespace(x=torch.ones(2), scale=2.0)
    g = capture(lambda: s.x * s.scale)
    s.scale = 100.0
    g.replay()
    assert g.outputs[0].tolist() == [2.0, 2.0]


def test_shape_read_at_capture_is_frozen():
    s = SimpleNamespace(x=torch.arange(6.0))
    g = capture(lambda: s.x[: s.x.shape[0] // 2] + 0)
    s.x.copy_(torch.arange(6.0) * 10)
    g.replay()
    assert g.outputs[0].tolist() == [0.0, 10.0, 20.0]


# -- 2. tensors are bound by identity


def test_replay_reads_in_place_update_of_static_input():
    s = SimpleNamespace(x=torch.ones(3))
    g = capture(lambda: s.x + 1)
    s.x.copy_(torch.tensor([1.0, 2.0, 3.0]))
    g.replay()
    assert g.outputs[0].tolist() == [2.0, 3.0, 4.0]


def test_rebound_attribute_is_not_seen_and_is_reported_stale():
    s = SimpleNamespace(x=torch.ones(3))
    g = capture(lambda: s.x + 1, roots={"s": s})
    assert g.replay() == ()
    s.x = torch.full((3,), 7.0)
    stale = g.replay()
    assert g.outputs[0].tolist() == [2.0, 2.0, 2.0]
    assert [st.path for st in stale] == ["s.x"]
    assert (stale[0].captured, stale[0].now) == ("float32[3]", "float32[3]")  # same kind, another tensor


def test_attribute_set_to_none_is_reported_stale():
    s = SimpleNamespace(x=torch.ones(3))
    g = capture(lambda: s.x * 2, roots={"s": s})
    s.x = None
    (stale,) = g.replay()
    assert stale.path == "s.x" and stale.now == "None"


# -- 4. capture does not compute


def test_capture_writes_to_existing_tensor_are_undone():
    s = SimpleNamespace(buf=torch.arange(4.0), x=torch.ones(4))

    def run(buf: torch.Tensor) -> torch.Tensor:
        buf.add_(s.x)
        buf[1:3].mul_(10)  # through a view: the whole storage is restored
        return buf

    expected = s.buf.clone()
    for _ in range(WARMUP_RUNS):
        run(expected)
    g = capture(lambda: run(s.buf))
    assert torch.equal(s.buf, expected)  # what the warm-up runs wrote, nothing of the capture
    g.replay()
    assert torch.equal(s.buf, run(expected))


def test_capture_writes_through_out_argument_are_undone():
    s = SimpleNamespace(a=torch.ones(2), out=torch.zeros(2), runs=0)

    def fn():
        s.runs += 1  # a Python number: each eager run adds more, the graph freezes the capture's
        return torch.add(s.a, s.runs, out=s.out)

    g = capture(fn)
    assert s.out.tolist() == [1.0 + WARMUP_RUNS] * 2  # the last warm-up run's write; the capture's is undone
    g.replay()
    assert s.out.tolist() == [2.0 + WARMUP_RUNS] * 2


@pytest.mark.parametrize(
    ("dtype", "poison"),
    [
        (torch.float32, None),  # NaN
        (torch.bfloat16, None),
        (torch.int32, -(2**31) + 7),
        (torch.int64, -(2**31) + 7),
        (torch.int16, -(2**15)),
        (torch.uint8, 255),
        (torch.bool, True),
    ],
)
def test_capture_allocated_tensor_holds_poison_until_first_replay(dtype, poison):
    s = SimpleNamespace(x=torch.ones(4, dtype=torch.int32))
    g = capture(lambda: (s.x * 0).to(dtype))
    (out,) = g.outputs
    if poison is None:
        assert torch.isnan(out).all()
    else:
        assert (out == poison).all()
    g.replay()
    assert (out == torch.zeros(4, dtype=dtype)).all()


def test_intermediate_tensors_are_poisoned_too():
    s = SimpleNamespace(x=torch.ones(3))
    kept = {}

    def fn():
        kept["mid"] = s.x + 1
        return kept["mid"] * 2

    g = capture(fn)
    assert torch.isnan(kept["mid"]).all()
    g.replay()
    assert kept["mid"].tolist() == [2.0, 2.0, 2.0]


# -- 5. what replay re-runs


def test_replay_writes_into_captured_outputs():
    s = SimpleNamespace(x=torch.ones(2, 3), w=torch.ones(3, 2))
    g = capture(lambda: ((s.x @ s.w).relu(), s.x.sum(0)))
    y, total = g.outputs
    ptrs = (y.data_ptr(), total.data_ptr())
    s.x.fill_(2.0)
    g.replay()
    assert g.outputs[0] is y and g.outputs[1] is total
    assert (y.data_ptr(), total.data_ptr()) == ptrs
    assert y.tolist() == [[6.0, 6.0], [6.0, 6.0]]
    assert total.tolist() == [4.0, 4.0, 4.0]


def test_view_ops_are_not_rerun():
    s = SimpleNamespace(x=torch.arange(6.0))

    def fn():
        v = s.x.view(2, 3).t()[1:]
        return v * 2

    g = capture(fn)
    with OpLog() as log:
        g.replay()
    assert log.ops == ["aten.mul.out"]
    assert g.outputs[0].tolist() == [[2.0, 8.0], [4.0, 10.0]]


def test_views_of_outputs_see_replayed_values():
    s = SimpleNamespace(x=torch.ones(4))
    g = capture(lambda: (s.x + 1).view(2, 2))
    s.x.fill_(3.0)
    g.replay()
    assert g.outputs[0].tolist() == [[4.0, 4.0], [4.0, 4.0]]


def test_allocation_is_not_rerun():
    s = SimpleNamespace(x=torch.ones(3))

    def fn():
        scratch = torch.empty(3)
        scratch[:2].copy_(s.x[:2])  # the last element is never written
        return scratch

    g = capture(fn)
    with OpLog() as log:
        g.replay()
    assert not any("empty" in op for op in log.ops)
    out = g.outputs[0]
    assert out[:2].tolist() == [1.0, 1.0]
    assert torch.isnan(out[2])  # like graph memory: nobody wrote it, it keeps its poison


def test_fill_factory_is_rerun_into_its_output():
    s = SimpleNamespace(x=torch.tensor([1.0, 2.0]))

    def fn():
        acc = torch.zeros(2)
        acc += s.x
        acc += s.x
        return acc

    g = capture(fn)
    for _ in range(3):
        g.replay()
        assert g.outputs[0].tolist() == [2.0, 4.0]


def test_arange_and_full_are_rerun_into_their_outputs():
    g = capture(lambda: (torch.arange(4) * 2, torch.full((2,), 3.5)))
    g.replay()
    assert g.outputs[0].tolist() == [0, 2, 4, 6]
    assert g.outputs[1].tolist() == [3.5, 3.5]


def test_in_place_op_is_rerun_as_recorded():
    s = SimpleNamespace(counter=torch.zeros(1))
    g = capture(lambda: s.counter.add_(1))
    assert s.counter.item() == WARMUP_RUNS  # the warm-up runs are real
    for _ in range(3):
        g.replay()
    assert s.counter.item() == WARMUP_RUNS + 3.0


def test_metadata_only_in_place_op_is_not_rerun():
    s = SimpleNamespace(x=torch.arange(6.0).view(2, 3))

    def fn():
        t = s.x.clone()
        t.t_()
        return t

    g = capture(fn)
    for _ in range(3):
        g.replay()
        assert g.outputs[0].shape == (3, 2)
        assert torch.equal(g.outputs[0], s.x.t())


def test_op_without_out_overload_is_computed_and_copied():
    s = SimpleNamespace(x=torch.tensor([3.0, 1.0]))
    g = capture(lambda: twice(s.x))
    (y,) = g.outputs
    s.x.copy_(torch.tensor([0.5, -1.0]))
    g.replay()
    assert g.outputs[0] is y
    assert y.tolist() == [1.0, -2.0]


def test_multi_output_op_writes_every_captured_output():
    s = SimpleNamespace(x=torch.tensor([3.0, 1.0, 2.0]))
    g = capture(lambda: tuple(torch.sort(s.x)))
    s.x.copy_(torch.tensor([0.0, 5.0, -1.0]))
    g.replay()
    values, indices = g.outputs
    assert values.tolist() == [-1.0, 0.0, 5.0]
    assert indices.tolist() == [2, 0, 1]


def test_replay_does_not_depend_on_autograd_state():
    w = torch.nn.Parameter(torch.ones(2))
    s = SimpleNamespace(x=torch.ones(2))
    with torch.no_grad():
        g = capture(lambda: s.x * w)
    s.x.fill_(4.0)
    g.replay()  # out= with a requires_grad input would raise if replay went through autograd
    assert g.outputs[0].tolist() == [4.0, 4.0]


# -- 6. eager islands


def test_island_reruns_python_at_each_replay():
    s = SimpleNamespace(x=torch.ones(2), calls=0, bias=1.0)

    def plan(x):
        s.calls += 1
        return x + s.bias  # reads a Python number: not frozen inside an island

    def fn():
        y = s.x * 2
        z = eager_island(plan, y)
        return z * 10

    g = capture(fn, islands=True)
    assert s.calls == WARMUP_RUNS + 1  # warm-up runs it eagerly, and so does the tape's capture
    s.bias = 5.0
    g.replay()
    assert s.calls == WARMUP_RUNS + 2
    assert g.outputs[0].tolist() == [70.0, 70.0]
    s.x.fill_(2.0)
    g.replay()
    assert s.calls == WARMUP_RUNS + 3
    assert g.outputs[0].tolist() == [90.0, 90.0]


def test_island_may_read_device_values():
    s = SimpleNamespace(n=torch.tensor([3]))

    def island(n):
        return torch.arange(int(n.item())).sum().reshape(1)

    g = capture(lambda: eager_island(island, s.n) + 0, islands=True)
    s.n.fill_(5)
    g.replay()
    assert g.outputs[0].tolist() == [10]


def test_island_outputs_are_static_and_poisoned_until_first_replay():
    s = SimpleNamespace(x=torch.ones(2))
    seen = {}

    def fn():
        seen["static"] = eager_island(lambda x: x * 3, s.x)
        return seen["static"] + 1

    g = capture(fn, islands=True)
    static = seen["static"]
    assert torch.isnan(static).all()
    g.replay()
    assert seen["static"] is static
    assert static.tolist() == [3.0, 3.0]
    assert g.outputs[0].tolist() == [4.0, 4.0]


def test_island_side_effects_on_existing_tensors_are_not_undone():
    s = SimpleNamespace(log=torch.zeros(1), x=torch.ones(1))

    def bump(x):
        s.log.add_(1)
        return x.clone()

    capture(lambda: eager_island(bump, s.x), islands=True)
    assert s.log.item() == WARMUP_RUNS + 1.0  # every eager run of the island, warm-up ones included


def test_island_without_islands_is_captured_like_other_code():
    s = SimpleNamespace(x=torch.ones(2), calls=0, bias=1.0)

    def plan(x):
        s.calls += 1
        return x + s.bias

    g = capture(lambda: eager_island(plan, s.x), islands=False)
    assert s.calls == WARMUP_RUNS + 1
    s.bias = 5.0
    g.replay()
    assert s.calls == WARMUP_RUNS + 1  # not an island: its Python ran at capture only
    assert g.outputs[0].tolist() == [2.0, 2.0]


def test_eager_island_outside_capture_is_a_plain_call():
    assert eager_island(lambda a, b=0: a + b, torch.ones(1), b=2).tolist() == [3.0]

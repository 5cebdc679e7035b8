"""Gathers and rolls replay as cheaper calls (``graphs/_replay_ops.py``) and leave what the boxed call leaves:
the same bytes, and where the indices are bad, the same error from the same line of the replay."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from harness.check.run.frames import subject_frames
from harness.graphs._replay_ops import masked_fill_by_copy, pad_by_fill, roll_by_copies, rows_gather
from harness.graphs.tape import COMPILE_AFTER

from ._helpers import OpLog, capture


def _replays() -> range:
    """Enough replays to run a graph's listed calls, then its generated function."""
    return range(COMPILE_AFTER + 2)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _replays_as_eager(fn, s: SimpleNamespace, refresh, replaced: str) -> None:
    """Capture ``fn`` over ``s``; its replay runs no ``replaced`` op, and past its compile, after each
    ``refresh(k)`` of the inputs, leaves eager's bytes (NaN payloads too)."""
    g = capture(fn, roots={"s": s})
    with OpLog() as log:
        g.replay()
    assert not any(op.startswith(replaced) for op in log.ops), log.ops
    for k in _replays():
        refresh(k)
        g.replay()
        assert torch.equal(_bytes(g.outputs[0]), _bytes(fn())), k


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_rows_named_by_an_integer_index_replay_as_index_select_and_match_eager(dtype):
    s = SimpleNamespace(kv=torch.randn(16, 2, 4), table=torch.randint(0, 16, (3, 5), dtype=dtype))

    def refresh(k: int) -> None:
        s.kv.copy_(torch.randn(16, 2, 4))
        s.table.copy_(torch.randint(0, 16, (3, 5), dtype=dtype))

    _replays_as_eager(lambda: (s.kv * 2)[s.table] + 1, s, refresh, "aten.index.")


def test_negative_indices_count_from_the_end_as_the_boxed_index_does():
    s = SimpleNamespace(x=torch.arange(12.0).view(6, 2), i=torch.tensor([0, 1]))
    g = capture(lambda: (s.x + 0)[s.i], roots={"s": s})
    for k in _replays():
        s.i.copy_(torch.tensor([-1, 2]) if k % 2 else torch.tensor([3, -6]))
        g.replay()
        assert torch.equal(g.outputs[0], (s.x + 0)[s.i]), k


def test_an_index_out_of_range_fails_as_the_boxed_call_does_from_the_replay_s_own_line():
    s = SimpleNamespace(x=torch.arange(8.0).view(4, 2), i=torch.tensor([1]))
    g = capture(lambda: (s.x * 2 + 1)[s.i], roots={"s": s})
    seen = []
    for k in range(COMPILE_AFTER + 2):
        s.i.fill_(7 if k % 2 else 1)
        try:
            g.replay()
        except IndexError as exc:
            assert exc.__context__ is None and exc.__cause__ is None  # index_select's refusal does not show
            seen.append((k, str(exc), [(f.file, f.line, f.function) for f in subject_frames(exc.__traceback__)][-1]))
    assert [k for k, _, _ in seen] == list(range(1, COMPILE_AFTER + 2, 2))
    assert {text for _, text, _ in seen} == {"index 7 is out of bounds for dimension 0 with size 4"}
    assert {frame for _, _, frame in seen} == {("<tape replay>", 4, "run")}  # the third op, as any op's


def test_a_gather_not_over_the_first_dimension_or_into_shared_memory_keeps_the_general_path():
    src, idx = torch.randn(8, 3), torch.tensor([1, 2])
    out = torch.empty(2, 3)
    boxed = (torch.ops.aten.index.Tensor_out, (src, [idx]), {"out": out})
    assert rows_gather((src, [idx]), {}, out, boxed) is not None
    assert rows_gather((src, [None, idx]), {}, out, boxed) is None  # src[:, idx]
    assert rows_gather((src, [idx, idx]), {}, out, boxed) is None  # two index tensors
    assert rows_gather((src, [idx > 0]), {}, out, boxed) is None  # a mask
    assert rows_gather((src, [idx]), {}, src[:2], boxed) is None  # the output over the source's storage
    assert rows_gather((src, [idx]), {}, torch.empty(3, 2).t(), boxed) is None  # a strided output


@pytest.mark.parametrize("shift", [1, -1, 3, 5, 7, -12, 0])
def test_a_roll_along_one_dimension_replays_as_two_copies_and_matches_eager(shift):
    s = SimpleNamespace(x=torch.randn(3, 5, 2))
    _replays_as_eager(lambda: torch.roll(s.x * 2, shift, 1), s, lambda k: s.x.copy_(torch.randn(3, 5, 2)),
                      "aten.roll.")


def test_a_roll_over_the_flattened_tensor_or_into_its_own_memory_keeps_the_general_path():
    x = torch.randn(4, 3)
    assert roll_by_copies((x, [1], [0]), {}, torch.empty(4, 3)) is not None
    assert roll_by_copies((x, [1], []), {}, torch.empty(4, 3)) is None  # no dim: the flattened roll
    assert roll_by_copies((x, [1, 2], [0, 1]), {}, torch.empty(4, 3)) is None
    assert roll_by_copies((x, [1], [0]), {}, x.view(4, 3)) is None


@pytest.mark.parametrize("pad, value", [((1, 2), 0.0), ((0, 3, 2, 0), -1.5), ((1, 1, 1, 1, 1, 1), float("nan"))])
def test_a_constant_pad_replays_as_a_fill_and_a_copy_and_matches_eager(pad, value):
    s = SimpleNamespace(x=torch.randn(2, 3, 4))
    _replays_as_eager(lambda: torch.nn.functional.pad(s.x + 1, pad, value=value), s,
                      lambda k: s.x.copy_(torch.randn(2, 3, 4)), "aten.constant_pad_nd.")


def test_a_negative_pad_crops_and_keeps_the_general_path():
    x = torch.randn(3, 4)
    assert pad_by_fill((x, [1, 1]), {}, torch.empty(3, 6)) is not None
    assert pad_by_fill((x, [-1, 1]), {}, torch.empty(3, 4)) is None
    assert pad_by_fill((x, [1, 1]), {}, torch.empty(3, 5)) is None  # not the padded shape


@pytest.mark.parametrize("value", [0.0, float("-inf")])
def test_a_masked_fill_replays_as_a_copy_and_a_fill_in_place_and_matches_eager(value):
    s = SimpleNamespace(x=torch.randn(4, 6), keep=torch.rand(1, 6) > 0.5)

    def refresh(k: int) -> None:
        s.x.copy_(torch.randn(4, 6))
        s.keep.copy_(torch.rand(1, 6) > 0.5)

    _replays_as_eager(lambda: (s.x * 3).masked_fill(s.keep, value), s, refresh, "aten.masked_fill.")


def test_a_masked_fill_whose_mask_widens_the_result_keeps_the_general_path():
    x, mask = torch.randn(1, 6), torch.rand(4, 6) > 0.5
    assert masked_fill_by_copy((x, mask[:1], 0.0), {}, torch.empty(1, 6)) is not None
    assert masked_fill_by_copy((x, mask, 0.0), {}, torch.empty(4, 6)) is None  # the result is [4, 6], not x's shape
    assert masked_fill_by_copy((x, mask[:1], 0.0), {}, x) is None


@pytest.mark.slow  # a fresh interpreter
def test_binding_these_calls_imports_nothing_a_child_process_would_pay_for():
    # torch.broadcast_shapes imports sympy: a second in every forked child that binds a masked fill
    program = """
import sys, torch
import subprocess
import sys
from types import SimpleNamespace
from harness.graphs import get_engine
s = SimpleNamespace(x=torch.randn(4, 6), m=torch.rand(1, 6) > 0.5, i=torch.tensor([1, 2]))
def fn():
    y = torch.roll((s.x * 2).masked_fill(s.m, 0.0), 1, 0)
    return torch.nn.functional.pad(y, (1, 1))[s.i]
g = get_engine("tape").capture(fn, label="t", roots={"s": s}, static_inputs=(), islands=False)
g.replay()
print(sorted(m for m in ("sympy", "torch._dynamo", "torch.fx.experimental.symbolic_shapes") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.parametrize("program", [
    pytest.param(lambda s: s.x[s.i], id="gather"),
    pytest.param(lambda s: torch.roll(s.x, 1, 0), id="roll"),
    pytest.param(lambda s: torch.nn.functional.pad(s.x, (1, 1)), id="pad"),
    pytest.param(lambda s: s.x.masked_fill(s.x > 2, 0.0), id="masked_fill"),
])
def test_these_calls_follow_the_memory_the_tape_moves_a_reallocated_input_to(program):
    # once bound, a call must read where the tape's pins are, not where they were: a captured input resized past
    # its capacity keeps the graph on the old, freed block (poison), whatever the program writes into the new one
    s = SimpleNamespace(x=torch.arange(8.0), i=torch.tensor([1, 3]))
    g = capture(lambda: program(s) * 1, roots={"s": s}, static=[s.x, s.i])
    for _ in _replays():
        g.replay()  # bound, then compiled
    s.x.resize_(4096)
    s.x.fill_(100.0)
    (stale,) = g.replay()
    assert (stale.path, stale.kind) == ("s.x", "memory")
    assert not bool((g.outputs[0] == 100.0).any()), g.outputs[0]


@pytest.mark.parametrize("moved", ["x", "i"])
def test_a_gather_whose_source_or_index_the_tape_moves_replays_as_the_boxed_call_does(moved, monkeypatch):
    from harness.graphs import tape

    def replays(fast: bool):
        if not fast:
            monkeypatch.setattr(tape, "_INDEX", None)
        s = SimpleNamespace(x=torch.arange(8.0), i=torch.tensor([1, 3]))
        g = capture(lambda: s.x[s.i] * 1, roots={"s": s}, static=[s.x, s.i])
        for _ in _replays():
            g.replay()
        getattr(s, moved).resize_(4096).fill_(2)  # reallocated: the graph keeps the old, freed block
        try:
            g.replay()
        except IndexError as exc:  # the freed index block's poison is out of range
            return str(exc)
        return g.outputs[0].clone()

    fast, boxed = replays(True), replays(False)
    assert type(fast) is type(boxed)
    assert fast == boxed if isinstance(fast, str) else torch.equal(_bytes(fast), _bytes(boxed))

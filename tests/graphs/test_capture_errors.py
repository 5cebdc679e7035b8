"""What CUDA refuses during capture raises CaptureError naming the op and the line."""

from __future__ import annotations

import linecache
from types import SimpleNamespace

import pytest
import torch

from harness.graphs import CaptureError, eager_island
from harness.graphs._warm_up import WARMUP_RUNS

from ._helpers import capture, no_modes_active


def _state() -> SimpleNamespace:
    return SimpleNamespace(
        x=torch.tensor([1.0, -2.0, 3.0, -4.0]),
        i=torch.tensor([2, 0, 2, 1]),
        rep=torch.tensor([1, 2, 0, 1]),
    )


# Each case calls the refused op on the lambda's own line, which the error must quote.
REFUSED = [
    pytest.param(lambda s: s.x.sum().item(), "aten._local_scalar_dense.default", id="item"),
    pytest.param(lambda s: bool(s.x.sum() > 0), "aten._local_scalar_dense.default", id="bool"),
    pytest.param(lambda s: int(s.i[0]), "aten._local_scalar_dense.default", id="int"),
    pytest.param(lambda s: float(s.x[0]), "aten._local_scalar_dense.default", id="float"),
    pytest.param(lambda s: s.x.tolist(), "Tensor.tolist", id="tolist"),
    pytest.param(lambda s: s.x.numpy(), "Tensor.numpy", id="numpy"),
    pytest.param(lambda s: torch.nonzero(s.x), "aten.nonzero.default", id="nonzero"),
    pytest.param(lambda s: torch.where(s.x > 0), "aten.nonzero.default", id="where-one-arg"),
    pytest.param(lambda s: torch.masked_select(s.x, s.x > 0), "aten.masked_select.default", id="masked_select"),
    pytest.param(lambda s: torch.unique(s.i), "aten._unique2.default", id="unique"),
    pytest.param(lambda s: torch.unique(s.i.view(2, 2), dim=0), "aten.unique_dim.default", id="unique-dim"),
    pytest.param(lambda s: torch.unique_consecutive(s.i), "aten.unique_consecutive.default", id="unique_consecutive"),
    pytest.param(lambda s: s.i.repeat_interleave(s.rep), "aten.repeat_interleave.Tensor", id="repeat_interleave"),
    pytest.param(lambda s: torch.repeat_interleave(s.rep), "aten.repeat_interleave.Tensor", id="repeat_interleave-repeats-only"),
    pytest.param(lambda s: s.x[s.x > 0], "aten.index.Tensor", id="bool-mask-index"),
    pytest.param(lambda s: s.x.__setitem__(s.i > 1, s.x[:2] * 0), "aten.index_put_.default", id="bool-mask-put-tensor"),
    pytest.param(lambda s: s.x + torch.tensor([1.0, 2.0, 3.0, 4.0]), "torch.tensor", id="torch.tensor"),
    pytest.param(lambda s: s.x + torch.as_tensor([1.0, 2.0, 3.0, 4.0]), "torch.as_tensor", id="torch.as_tensor"),
    pytest.param(lambda s: s.x + s.x.new_tensor([1.0, 2.0, 3.0, 4.0]), "Tensor.new_tensor", id="new_tensor"),
    pytest.param(lambda s: torch.equal(s.x, s.x), "aten.equal.default", id="equal"),
    pytest.param(lambda s: torch.bincount(s.i), "aten.bincount.default", id="bincount"),
]


@pytest.mark.parametrize(("case", "op"), REFUSED)
def test_refused_op_raises_capture_error_naming_op_and_line(case, op):
    s = _state()
    with pytest.raises(CaptureError) as info:
        capture(lambda: case(s))
    err = info.value
    line = case.__code__.co_firstlineno
    code = linecache.getline(__file__, line).strip()
    assert err.op == op
    assert err.location.endswith(f"test_capture_errors.py:{line}: {code}")
    assert op in str(err) and err.location in str(err)


def test_item_during_capture_raises_capture_error_naming_op_and_line():
    s = _state()

    def fn():
        y = s.x * 2
        n = y.sum().item()  # the refused line
        return y + n

    with pytest.raises(CaptureError, match=r"aten\._local_scalar_dense") as info:
        capture(fn)
    assert info.value.location.endswith("n = y.sum().item()  # the refused line")
    assert "test_capture_errors.py:" in info.value.location


SAFE = [
    pytest.param(lambda s: s.i.repeat_interleave(s.rep, output_size=4), id="repeat_interleave-output_size"),
    pytest.param(lambda s: s.x.__setitem__(s.x > 0, 0.0), id="bool-mask-fill-scalar"),
    pytest.param(lambda s: s.x.__setitem__(s.i, 1.0), id="index-put-scalar"),
    pytest.param(lambda s: torch.where(s.x > 0, s.x, 0.0), id="where-three-args"),
    pytest.param(lambda s: s.x.masked_fill(s.x > 0, 0.0), id="masked_fill"),
    pytest.param(lambda s: torch.nonzero_static(s.x, size=4), id="nonzero_static"),
    pytest.param(lambda s: s.x[s.i], id="integer-index"),
]


@pytest.mark.parametrize("case", SAFE)
def test_capture_safe_variant_is_accepted(case):
    s = _state()
    capture(lambda: case(s))


def test_python_scalar_setitem_value_is_a_graph_constant_not_poisoned():
    s = _state()
    g = capture(lambda: s.x.__setitem__(s.i[:2], 9.0))
    g.replay()
    assert s.x.tolist() == [9.0, -2.0, 9.0, -4.0]


def test_capture_error_leaves_no_capture_state_behind():
    s = _state()
    before = s.x.clone()

    def fn():
        s.x.mul_(100)  # at capture, written before the refusal: undone
        if torch.cuda.is_current_stream_capturing():
            return s.x.sum().item()
        return s.x

    with pytest.raises(CaptureError):
        capture(fn)
    after_warm_up = before * 100**WARMUP_RUNS  # warm-up runs are real eager runs
    assert torch.equal(s.x, after_warm_up)
    assert no_modes_active()
    assert eager_island(lambda: 1) == 1  # no island host left behind
    g = capture(lambda: s.x * 2)  # and a new capture works
    g.replay()
    assert torch.equal(g.outputs[0], after_warm_up * 2)


def test_any_exception_during_capture_restores_state():
    s = _state()
    before = s.x.clone()

    def fn():
        s.x.add_(1)
        if torch.cuda.is_current_stream_capturing():
            raise ValueError("boom")
        return s.x

    with pytest.raises(ValueError, match="boom"):
        capture(fn, islands=True)
    assert torch.equal(s.x, before + WARMUP_RUNS)  # the capture's write is undone, the warm-ups' stay
    assert no_modes_active()
    assert eager_island(lambda: 2) == 2


def test_item_inside_island_is_allowed():
    s = _state()
    g = capture(lambda: eager_island(lambda x: x * x.sum().item(), s.x), islands=True)
    g.replay()
    assert g.outputs[0].tolist() == [-2.0, 4.0, -6.0, 8.0]


def test_item_inside_island_is_refused_without_islands():
    s = _state()
    with pytest.raises(CaptureError):
        capture(lambda: eager_island(lambda x: x * x.sum().item(), s.x), islands=False)


def test_capture_error_survives_pickling():
    import pickle

    err = CaptureError("aten.nonzero.default", "f.py:3: torch.nonzero(x)", "why")
    back = pickle.loads(pickle.dumps(err))
    assert (back.op, back.location, str(back)) == (err.op, err.location, str(err))

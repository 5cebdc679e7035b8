"""The tape refuses exactly what CUDA refuses during capture: one table, one program per decision.

On the CPU the tape models a CUDA device: what would be a device-to-host read, a host-to-device
copy of host data or a CUDA-only sync is refused although a CPU kernel could do it; what CUDA
captures is captured although the CPU kernel syncs.  The GPU half of the check (the same
programs against a bare ``torch.cuda.graph``) is in test_cuda_gpu.py.
"""

from __future__ import annotations

import linecache

import pytest
import torch

from harness.graphs import CaptureError
from harness.graphs._refusals import SEEDED, TABLE

from ._helpers import capture, no_modes_active
from ._refusal_cases import CASES, state

_BY_ID = {c.id: c for c in CASES}


def _run(case, s) -> None:
    case.program(s)


def _decide(case) -> str:
    """What the tape does with the case on the CPU: "refused" or "captured"."""
    s = state("cpu")
    try:
        capture(lambda: _run(case, s)).replay()
    except CaptureError:
        return "refused"
    return "captured"


def test_tape_decides_every_program_of_the_table_as_a_cuda_capture_would():
    wrong = [(c.id, "refused" if c.refused("cpu") else "captured", got)
             for c in CASES if (got := _decide(c)) != ("refused" if c.refused("cpu") else "captured")]
    assert wrong == []
    assert no_modes_active()


def _assert_refused_naming_op_line_and_reason(case_id: str) -> None:
    __tracebackhide__ = True
    case = _BY_ID[case_id]
    s = state("cpu")
    with pytest.raises(CaptureError) as info:
        capture(lambda: _run(case, s))
    line = case.program.__code__.co_firstlineno
    code = linecache.getline(case.program.__code__.co_filename, line).strip()
    assert info.value.op == case.op
    assert info.value.reason == TABLE[case.key].why
    assert info.value.location.endswith(f"_refusal_cases.py:{line}: {code}")


@pytest.mark.parametrize("case_id", ["cpu", "to-cpu-string", "repr", "str", "f-string"])
def test_host_read_of_a_captured_tensor_is_refused_although_nothing_moves_on_a_cpu(case_id):
    _assert_refused_naming_op_line_and_reason(case_id)


@pytest.mark.parametrize("case_id", ["list-index", "list-index-assign", "numpy-value-assign", "from_numpy", "frombuffer"])
def test_host_data_reaching_the_device_implicitly_is_refused(case_id):
    _assert_refused_naming_op_line_and_reason(case_id)


@pytest.mark.parametrize("case_id", [
    "masked_fill-device-scalar", "masked_fill_-device-scalar", "bool-mask-put-device-scalar", "index_put-out-of-place",
    "_index_put_impl_", "histc-without-range", "allclose", "linalg-inv",
])
def test_op_whose_cuda_kernel_syncs_is_refused_although_its_cpu_kernel_does_not(case_id):
    _assert_refused_naming_op_line_and_reason(case_id)


def test_random_op_with_a_generator_the_graph_does_not_know_is_refused():
    _assert_refused_naming_op_line_and_reason("random-own-generator")


@pytest.mark.parametrize("case_id", ["torch.tensor", "torch.as_tensor", "new_tensor"])
def test_tensor_built_from_python_data_is_refused_at_the_call_that_builds_it(case_id):
    _assert_refused_naming_op_line_and_reason(case_id)


def test_one_hot_with_num_classes_is_captured_although_the_cpu_kernel_checks_on_the_host():
    s = state("cpu")
    g = capture(lambda: torch.nn.functional.one_hot(s.i, num_classes=4))
    s.i.copy_(torch.tensor([3, 1, 0, 0]))
    g.replay()
    assert torch.equal(g.outputs[0], torch.nn.functional.one_hot(s.i, num_classes=4))


def test_every_decision_of_the_table_has_a_program_and_every_program_a_decision():
    assert {c.key for c in CASES} == set(TABLE)
    assert len({c.id for c in CASES}) == len(CASES)
    assert SEEDED in TABLE


def test_every_rule_says_why_and_names_the_pytorch_source_that_shows_it():
    for key, rule in TABLE.items():
        assert rule.why, key
        path, _, function = rule.source.partition(": ")
        assert path.startswith(("aten/", "torch/")) and path.rsplit(".", 1)[-1] in ("cpp", "cu", "h", "py"), key
        assert function, key

"""The same flows on a GPU: real CUDA graphs and the tape emulator over CUDA tensors must agree."""

import dataclasses

import pytest
import torch

from harness.check.run.drive import execute
from harness.check.matrix.verdict import judge

from ._flows import heterogeneous_decode, heterogeneous_prefill, spec_for
from .test_stale_state_graph import _spec as stale_spec

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("mode,timeline", [("full", heterogeneous_decode), ("piecewise", heterogeneous_prefill)])
@pytest.mark.parametrize("design", ["forward_batch", "translate", "metadata"])
def test_cuda_and_tape_engines_agree_on_gpu(mode, timeline, design):
    spec = dataclasses.replace(spec_for("gpt-oss-mini", timeline, mode, design=design), device="cuda")
    reference = execute(spec.reference())
    verdicts = {engine: judge(execute(dataclasses.replace(spec, engine=engine)), reference)
                for engine in ("cuda", "tape")}
    assert verdicts["cuda"].outcome == verdicts["tape"].outcome == "match", {
        k: v.summary() for k, v in verdicts.items()}


def test_stale_state_fault_diverges_under_both_engines_on_gpu():
    spec = dataclasses.replace(stale_spec("stale_state", ["no_preset_swa_loc"]), device="cuda")
    reference = execute(spec.reference())
    outcomes = {engine: judge(execute(dataclasses.replace(spec, engine=engine)), reference).outcome
                for engine in ("cuda", "tape")}
    assert outcomes == {"cuda": "diverge", "tape": "diverge"}

"""The backend contract: a backend declares what it supports, collection obeys the declaration, a third-party
backend is one module named by import path, and expectations may differ by backend."""

from __future__ import annotations

import textwrap

import pytest

from harness.backends.base import GraphSupport
from harness.backends.registry import BACKENDS, backend_class
from harness.runspec import Device, KVWrite, Mode

# A second backend as a user would add one: one module, three parts reused or subclassed from the contract.
TOY_BACKENDS = textwrap.dedent('''
    from harness.backends.base import GraphSupport
    from harness.backends.registry import backend_class
    from harness.runspec import Device

    TorchNative = backend_class("torch_native")


    class PiecewiseOnly(TorchNative):
        name = "piecewise_only"
        graph_support = GraphSupport.PIECEWISE_ONLY


    class CudaOnly(TorchNative):
        name = "cuda_only"
        devices = frozenset({Device.CUDA})


    class NoFaults(TorchNative):
        name = "no_faults"
        known_faults = frozenset()
''')


def test_torch_native_declares_what_it_supports():
    cls = backend_class("torch_native")
    assert (cls.name, cls.graph_support) == ("torch_native", GraphSupport.DECODE_ONLY)
    assert cls.devices == {Device.CPU, Device.CUDA}
    assert cls.kv_write_paths == {KVWrite.PLAIN, KVWrite.FUSED_FP8}
    assert all(cls.unsupported(mode=m, device="cpu") == () for m in Mode)


def test_graph_support_is_ranked_and_decides_the_modes():
    assert GraphSupport.NONE < GraphSupport.PIECEWISE_ONLY < GraphSupport.DECODE_ONLY < GraphSupport.FULL

    class EagerOnly(backend_class("torch_native")):
        name = "eager_only"
        graph_support = GraphSupport.NONE

    assert EagerOnly.unsupported(mode="eager", device="cpu") == ()
    assert EagerOnly.unsupported(mode="piecewise", device="cpu") == (
        "backend eager_only declares graph support NONE; piecewise mode needs PIECEWISE_ONLY or more",)


def test_registry_resolves_names_and_import_paths_and_refuses_the_rest():
    assert set(BACKENDS) == {"torch_native"}
    assert backend_class("harness.backends.torch_native:TorchNativeBackend") is backend_class("torch_native")
    with pytest.raises(KeyError, match="unknown backend 'flashinfer'"):
        backend_class("flashinfer")
    with pytest.raises(KeyError, match="not an AttentionBackend subclass"):
        backend_class("harness.serving.designs:translate")


def _scenario(backends: str, expect_extra: str = "") -> str:
    return textwrap.dedent(f'''
        description = "one request past the window, decode after prefill"
        [model]
        preset = "gpt-oss-mini"
        [pool]
        full_size = 48
        swa_size = 32
        [graphs]
        modes = ["eager", "full", "piecewise"]
        decode_buckets = [1]
        prefill_buckets = [16]
        [run]
        designs = ["forward_batch"]
        backends = {backends}
        [timeline]
        seed = 5
        [[timeline.requests]]
        rid = "a"
        prompt_len = 10
        output_len = 3
        [expect.forward_batch]
        verdict = "match"
        why = "the reference design itself"
    ''') + textwrap.dedent(expect_extra)


@pytest.fixture
def toy(harness_pytester):
    harness_pytester.makepyfile(toy_backends=TOY_BACKENDS)
    harness_pytester.syspathinsert()
    return harness_pytester


def test_collection_skips_pairs_the_backend_does_not_support_and_marks_cuda_only_backends_gpu(toy, add_scenario):
    add_scenario("swa_toy", text=_scenario('["torch_native", "toy_backends:PiecewiseOnly", "toy_backends:CudaOnly"]'))
    items, _ = toy.inline_genitems("-q")
    by_name = {i.name: i for i in items}
    skipped = by_name["swa_toy[forward_batch-full-toy_backends:PiecewiseOnly]"]
    reasons = [m.kwargs.get("reason") for m in skipped.iter_markers("skip")]
    assert reasons == ["backend piecewise_only declares graph support PIECEWISE_ONLY; full mode needs DECODE_ONLY or more"]
    assert not list(by_name["swa_toy[forward_batch-piecewise-toy_backends:PiecewiseOnly]"].iter_markers("skip"))
    cuda_item = by_name["swa_toy[forward_batch-eager-toy_backends:CudaOnly]"]
    assert cuda_item.get_closest_marker("gpu") is not None and cuda_item.case.device == "cuda"
    assert by_name["swa_toy[forward_batch-eager-torch_native]"].get_closest_marker("gpu") is None

    result = toy.runpytest_inprocess("-q", "-rs")
    # torch_native: oracle + 3 modes; PiecewiseOnly: oracle + eager + piecewise; CudaOnly: all skipped (no GPU)
    result.assert_outcomes(passed=7, skipped=5)


def test_expectations_may_differ_by_backend(toy, add_scenario):
    add_scenario("swa_toy", text=_scenario('["torch_native", "toy_backends:PiecewiseOnly"]', '''
        [expect.forward_batch.by_backend."toy_backends:PiecewiseOnly"]
        piecewise = "diverge"
        why = "pretend this backend rounds differently in piecewise graphs"
    '''))
    result = toy.runpytest_inprocess("-q")
    # the override makes the PiecewiseOnly piecewise run fail as an unexpected pass; every other item passes
    result.assert_outcomes(passed=6, failed=1, skipped=1)
    out = result.stdout.str()
    assert "UNEXPECTED PASS swa_toy[forward_batch-piecewise-toy_backends:PiecewiseOnly]: expected diverge" in out
    assert "why expected: pretend this backend rounds differently in piecewise graphs" in out


def test_a_backend_fault_the_backend_does_not_implement_is_a_load_error(tmp_path, monkeypatch):
    from harness.scenario import ScenarioError, load_scenario

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "toy_backends_nf.py").write_text(TOY_BACKENDS)
    monkeypatch.setitem(BACKENDS, "no_faults", "toy_backends_nf:NoFaults")
    path = tmp_path / "s.toml"
    path.write_text(_scenario('["no_faults"]').replace('designs = ["forward_batch"]',
                                                        'designs = ["forward_batch"]\nfaults = ["baked_scalar"]'))
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert f"{path}: run.faults[0]: baked_scalar is not a switch of backend no_faults" in err.value.problems

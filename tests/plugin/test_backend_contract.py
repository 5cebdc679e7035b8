"""The backend contract: a backend declares what it supports and cannot leave a declaration out, collection
obeys the declaration with every reason, a third-party backend is one module named by import path (in a
scenario or on the command line), and expectations may differ by backend."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from harness.backends.base import GraphSupport, KVLayout, SpecInfo, attention_batch
from harness.backends.registry import BACKENDS, backend_class
from harness.check.matrix.case import cases
from harness.cli import main
from harness.runspec import Device, KVWrite, Mode
from harness.scenario import load_scenario
from harness.serving.batch import ForwardMode

from .conftest import SAMPLES

LIBRARY = Path(__file__).resolve().parents[2] / "scenarios"

# Backends as a user would add them: one module, each part reused or subclassed from the contract.
TOY_BACKENDS = (SAMPLES / "toy_backends.py").read_text()


def test_torch_native_declares_what_it_supports():
    cls = backend_class("torch_native")
    # uniform batches: a verify's n tokens per request have static token rows (tests/flows/test_verify_graph.py)
    assert (cls.name, cls.graph_support) == ("torch_native", GraphSupport.UNIFORM_BATCH)
    assert cls.devices == {Device.CPU, Device.CUDA}
    assert cls.kv_write_paths == {KVWrite.PLAIN, KVWrite.FUSED_FP8}
    assert (cls.page_sizes, cls.kv_layouts) == (None, {KVLayout.NHD})  # it gathers token rows: any page size
    assert cls.known_faults == {"rebind_metadata", "baked_scalar", "window_from_wrong_layer", "read_page_tail",
                                "fused_fp8_scale_dropped", "verify_without_swa_window", "draft_tree_swa_untranslated",
                                "draft_extend_without_swa_window"}
    assert cls.missing_declarations() == ()
    assert all(cls.unsupported(mode=m, device="cpu", page_size=p) == () for m in Mode for p in (1, 16, 64))


def test_torch_gather_declares_what_torch_native_does_and_the_index_space_faults_of_its_page_tables():
    cls, native = backend_class("torch_gather"), backend_class("torch_native")
    assert BACKENDS["torch_gather"] == "harness.backends.torch_gather:TorchGatherBackend"
    # both graph paths keep static per-token rows for each tokens-per-request shape: uniform batches (a verify too)
    for declared in ("devices", "kv_write_paths", "page_sizes", "kv_layouts", "graph_support"):
        assert getattr(cls, declared) == getattr(native, declared), declared
    assert cls.graph_support is GraphSupport.UNIFORM_BATCH
    assert cls.known_faults - native.known_faults == {"swa_read_untranslated", "page_ids_translated_as_slots",
                                                      "swa_table_sized_by_swa_pages"}
    assert native.known_faults <= cls.known_faults  # every library scenario of a dense-kernel fault runs it too
    assert cls.missing_declarations() == ()
    assert all(cls.unsupported(mode=m, device="cpu", page_size=p) == () for m in Mode for p in (1, 4, 16, 64))
    assert cls.unsupported(mode="eager", device="cpu", faults=["page_ids_translated_as_slots"]) == ()
    assert native.unsupported(mode="full", device="cpu", faults=["swa_read_untranslated"]) == (
        "backend torch_native has no switch for fault swa_read_untranslated",)


def test_graph_support_is_ranked_and_decides_the_modes():
    assert (GraphSupport.NONE < GraphSupport.PIECEWISE_ONLY < GraphSupport.DECODE_ONLY < GraphSupport.UNIFORM_BATCH
            < GraphSupport.FULL)

    class EagerOnly(backend_class("torch_native")):
        name = "eager_only"
        graph_support = GraphSupport.NONE

    assert EagerOnly.unsupported(mode="eager", device="cpu") == ()
    assert EagerOnly.unsupported(mode="piecewise", device="cpu") == (
        "backend eager_only declares graph support NONE; piecewise mode needs PIECEWISE_ONLY or more",)


def _batch(mode: ForwardMode, extend_lens: tuple[int, ...] = (), **kwargs):
    n = len(extend_lens) or 2
    return attention_batch(
        forward_mode=mode, req_pool_indices=torch.zeros(n, dtype=torch.int64), seq_lens=torch.full((n,), 9),
        out_cache_loc=torch.zeros(sum(extend_lens) or n, dtype=torch.int64), page_size=1,
        extend_seq_lens=torch.tensor(extend_lens) if extend_lens else None, extend_seq_lens_cpu=extend_lens, **kwargs)


def test_uniform_batch_support_covers_a_verify_step_but_not_a_mixed_prefill():
    decode = _batch(ForwardMode.DECODE)
    verify = _batch(ForwardMode.DRAFT, spec_info=SpecInfo(draft_steps=3, tokens_per_request=4))
    uniform_extend = _batch(ForwardMode.EXTEND, (3, 3))
    mixed_extend = _batch(ForwardMode.EXTEND, (3, 5))
    covered = {support: [support.covers(b) for b in (decode, verify, uniform_extend, mixed_extend)]
               for support in GraphSupport}
    assert covered == {
        GraphSupport.NONE: [False, False, False, False],
        GraphSupport.PIECEWISE_ONLY: [False, False, False, False],
        GraphSupport.DECODE_ONLY: [True, False, False, False],
        GraphSupport.UNIFORM_BATCH: [True, True, True, False],
        GraphSupport.FULL: [True, True, True, True],
    }


def test_unsupported_lists_every_reason_not_the_first(toy_module):
    assert toy_module.CannotRunAnything.unsupported(mode="full", device="cpu", kv_write="fused_fp8", page_size=1,
                                         kv_layout="NHD", faults=("baked_scalar", "no_zero_swa_pad")) == (
        "backend cannot_run_anything runs on cuda, not cpu",
        "backend cannot_run_anything declares graph support NONE; full mode needs DECODE_ONLY or more",
        "backend cannot_run_anything has no fused_fp8 KV write path",
        "backend cannot_run_anything supports page sizes 16, not 1",
        "backend cannot_run_anything reads KV layout HND, not NHD",
        # no_zero_swa_pad is the decode runner's switch, not a backend's: no reason for it
        "backend cannot_run_anything has no switch for fault baked_scalar",
    )
    # baked_scalar acts only in full graphs: an eager case lacks no switch
    assert toy_module.CannotRunAnything.unsupported(mode="eager", device="cuda", faults=("baked_scalar",)) == (
        "backend cannot_run_anything supports page sizes 16, not 1",
        "backend cannot_run_anything reads KV layout HND, not NHD",
    )


def test_a_backend_that_brings_its_own_builder_must_declare_its_known_faults():
    torch_native = backend_class("torch_native")
    with pytest.raises(TypeError, match=r"attention backend .*Forgetful sets builder_cls but does not declare "
                                        r"known_faults: list the catalog faults whose switches its code implements"):
        class Forgetful(torch_native):
            name = "forgetful"
            builder_cls = torch_native.builder_cls
    with pytest.raises(TypeError, match="declares known_faults that are not attention-backend faults of the "
                                        "catalog: no_zero_swa_pad"):
        class Boastful(torch_native):
            name = "boastful"
            known_faults = frozenset({"baked_scalar", "no_zero_swa_pad"})


def test_a_backend_without_its_declarations_is_refused_where_it_is_named(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "bare_backends.py").write_text(textwrap.dedent('''
        from harness.backends.base import AttentionBackend

        class Bare(AttentionBackend):
            name = "bare"
    '''))
    with pytest.raises(KeyError, match="backend 'bare_backends:Bare' does not declare graph_support, devices, "
                                       "page_sizes, kv_layouts, known_faults, builder_cls, impl_cls"):
        backend_class("bare_backends:Bare")


def test_registry_resolves_names_and_import_paths_and_refuses_the_rest():
    assert set(BACKENDS) == {"torch_native", "torch_gather", "flashinfer", "trtllm_mha"}
    assert backend_class("harness.backends.torch_native:TorchNativeBackend") is backend_class("torch_native")
    with pytest.raises(KeyError, match="unknown backend 'cutlass_mla'"):
        backend_class("cutlass_mla")
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


@pytest.fixture
def toy_module(monkeypatch):
    """The sample module ``toy_backends``, importable by that name for the test."""
    monkeypatch.syspath_prepend(str(SAMPLES))
    yield importlib.import_module("toy_backends")
    sys.modules.pop("toy_backends", None)


def test_a_page_size_the_backend_does_not_support_is_skipped_with_the_reason(toy, add_scenario):
    add_scenario("swa_toy", text=_scenario('["torch_native", "toy_backends:LargePagesOnly"]'))
    items, _ = toy.inline_genitems("-q")
    reasons = {i.name: [m.kwargs.get("reason") for m in i.iter_markers("skip")] for i in items}
    for mode in ("oracle", "eager", "full", "piecewise"):
        name = f"swa_toy[{'oracle-' if mode == 'oracle' else 'forward_batch-' + mode + '-'}toy_backends:LargePagesOnly]"
        assert reasons[name] == ["backend large_pages_only supports page sizes 16, 32, not 1"], name
        assert reasons[name.replace("toy_backends:LargePagesOnly", "torch_native")] == []


def test_a_backend_refuses_a_pool_whose_page_size_it_does_not_support(toy_module):
    from harness.serving.designs import DESIGNS
    from harness.serving.miniature import MiniatureStack
    from harness.serving.model import model_spec
    from harness.serving.pool import HybridSWAKVPool, PoolSpec, ReqToTokenPool

    spec = model_spec("gpt-oss-mini")
    pool = HybridSWAKVPool(spec=PoolSpec(full_size=32, swa_size=16), layer_is_swa=spec.layer_is_swa,
                           num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim)
    stack = MiniatureStack.over(pool, ReqToTokenPool(max_running_requests=2, max_context_len=16))
    kwargs = dict(model_spec=spec, stack=stack, design=DESIGNS["translate"])
    with pytest.raises(ValueError, match=r"backend large_pages_only supports page sizes \[16, 32\], not the pool's 1"):
        toy_module.LargePagesOnly(**kwargs)
    assert backend_class("torch_native")(**kwargs).pool.page_size == 1


def test_a_case_carries_every_reason_its_backend_gives(toy_module, tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(_scenario('["toy_backends:CannotRunAnything"]'))
    page_and_layout = ("backend cannot_run_anything supports page sizes 16, not 1; "
                       "backend cannot_run_anything reads KV layout HND, not NHD")
    assert {c.mode: c.unsupported for c in cases(load_scenario(path))} == {
        "eager": page_and_layout,
        "full": "backend cannot_run_anything declares graph support NONE; full mode needs DECODE_ONLY or more; "
                + page_and_layout,
        "piecewise": "backend cannot_run_anything declares graph support NONE; piecewise mode needs PIECEWISE_ONLY "
                     "or more; " + page_and_layout,
    }


def test_a_backend_without_a_scenarios_fault_skips_where_it_acts_and_runs_the_clean_rerun(toy_module, tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(_scenario('["toy_backends:NoFaults"]').replace(
        'designs = ["forward_batch"]', 'designs = ["forward_batch"]\nfaults = ["baked_scalar"]').replace(
        'verdict = "match"', 'verdict = "match"\nfull = "diverge"\nwithout_faults = "match"'))
    got = {(c.mode, c.with_faults): c.unsupported for c in cases(load_scenario(path))}
    assert got == {
        ("eager", True): None, ("eager", False): None,  # baked_scalar acts only in full graphs
        ("full", True): "backend no_faults has no switch for fault baked_scalar", ("full", False): None,
        ("piecewise", True): None, ("piecewise", False): None,
    }


@pytest.mark.slow
def test_cli_backend_by_import_path_runs_the_library_scenarios_with_their_expectations(cli_dir, write_scenario, capsys,
                                                                                      monkeypatch):
    (cli_dir / "toy_backends.py").write_text(TOY_BACKENDS)
    monkeypatch.syspath_prepend(str(cli_dir))
    monkeypatch.delitem(sys.modules, "toy_backends", raising=False)
    library = LIBRARY / "faults" / "swa_decode_baked_max_seq_len.toml"
    # a scenario that lists one of the backends with an expectation of its own, which wins over the design's
    write_scenario(cli_dir, "tiny_match", replace={
        'backends = ["torch_native"]': 'backends = ["torch_native", "toy_backends:Renamed"]',
        'why = "reads the batch\'s own out_cache_loc_swa"': (
            'why = "reads the batch\'s own out_cache_loc_swa"\n'
            '[expect.forward_batch.by_backend."toy_backends:Renamed"]\nfull = "diverge"\nwhy = "pretend it differs"')})
    code = main(["run", str(library), "scenarios", "--design", "forward_batch", "--backend", "toy_backends:Renamed",
                 "--backend", "toy_backends:NoFaults", "--jobs", "1", "--json", "r.json"])
    out, err = capsys.readouterr()
    sys.modules.pop("toy_backends", None)
    records = json.loads((cli_dir / "r.json").read_text())["records"]
    got = {(r["scenario"], r["backend"], r["mode"], tuple(r["faults"])): (r["expected"], r["verdict"])
           for r in records}
    fault = ("baked_scalar",)
    assert got == {
        # the library's expectations for the design, met by a backend that implements the fault's switch
        ("swa_decode_baked_max_seq_len", "toy_backends:Renamed", "eager", fault): ("match", "match"),
        ("swa_decode_baked_max_seq_len", "toy_backends:Renamed", "eager", ()): ("match", "match"),
        ("swa_decode_baked_max_seq_len", "toy_backends:Renamed", "full", fault): ("diverge", "diverge"),
        ("swa_decode_baked_max_seq_len", "toy_backends:Renamed", "full", ()): ("match", "match"),
        # one that lacks the switch is skipped where the fault acts, not reported as an unexpected pass
        ("swa_decode_baked_max_seq_len", "toy_backends:NoFaults", "eager", fault): ("match", "match"),
        ("swa_decode_baked_max_seq_len", "toy_backends:NoFaults", "eager", ()): ("match", "match"),
        ("swa_decode_baked_max_seq_len", "toy_backends:NoFaults", "full", fault): ("diverge", "skipped"),
        ("swa_decode_baked_max_seq_len", "toy_backends:NoFaults", "full", ()): ("match", "match"),
        ("tiny_match", "toy_backends:Renamed", "eager", ()): ("match", "match"),
        ("tiny_match", "toy_backends:Renamed", "full", ()): ("diverge", "match"),
        ("tiny_match", "toy_backends:NoFaults", "eager", ()): ("match", "match"),
        ("tiny_match", "toy_backends:NoFaults", "full", ()): ("match", "match"),
    }
    skipped = [r["skip_reason"] for r in records if r["verdict"] == "skipped"]
    assert skipped == ["backend no_faults has no switch for fault baked_scalar"]
    assert code == 1, out + err  # the by_backend override: an unexpected pass
    assert "tiny_match[forward_batch-full-toy_backends:Renamed]: match (UNEXPECTED)" in err

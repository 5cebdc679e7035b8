"""The TRT-LLM MHA backend hands its decode kernel page tables of both pools that read what torch-native reads.

On the CPU the decode op runs its dense stand-in over the same tables, so everything but the kernel is checked:
the full and SWA page tables against the torch-native backend's slot tables of the same batches at every page
size the kernels take, the padding lanes and padding rows on the dummy page, graph refreshes, prefill going
through FlashInfer's lists, and the declaration that skips its cells (page sizes, architecture, FlashInfer, a
GPU). The test marked ``gpu`` runs the kernel.
"""

from __future__ import annotations

import ast
import importlib.util
import dataclasses
from pathlib import Path

import pytest
import torch

from harness.backends import trtllm_mha as trt_module
from harness.backends.flashinfer import FlashInferMetadata
from harness.backends.page_table import page_table_slots
from harness.backends.registry import backend_class
from harness.backends.trtllm_mha import OP_NAME, PAGE_SIZES, TrtllmDecodeMetadata, TrtllmMHABackend
from harness.serving.model import PRESETS

from test_flashinfer_backend import LENS, SPEC, WIDTH, _backend, _decode, _extend, _requests

ROOT = Path(__file__).resolve().parents[2]
FULL, SWA = 1, 0  # gpt-oss-mini's window groups: its SWA layers first, then its full ones


@pytest.mark.parametrize("page_size", sorted(PAGE_SIZES))
def test_the_page_tables_read_the_slots_torch_native_reads_in_both_pools(page_size):
    pool, r2t, rows = _requests(page_size)
    batch = _decode(rows, LENS, page_size)
    native = _backend("torch_native", pool, r2t).builder.build(batch)
    md = _backend("trtllm_mha", pool, r2t).builder.build(batch)
    assert isinstance(md, TrtllmDecodeMetadata)
    lens = batch.seq_lens
    full_slots = page_table_slots(md.page_tables[FULL].long(), lens, WIDTH, page_size=page_size)
    assert torch.equal(full_slots, native.page_table)
    swa_slots = page_table_slots(md.page_tables[SWA].long(), lens, WIDTH, page_size=page_size)
    pos = torch.arange(WIDTH)[None, :]
    in_window = (pos < lens[:, None]) & (pos >= lens[:, None] - SPEC.window)  # the keys the kernel reads
    assert torch.equal(swa_slots[in_window], native.swa_page_table[in_window])
    assert md.window_left == (SPEC.window - 1, -1)
    assert md.seq_lens.tolist() == LENS and md.max_seq_len == WIDTH


def test_the_swa_table_holds_swa_page_ids_and_columns_past_a_requests_pages_the_dummy_page():
    page_size = 16
    pool, r2t, rows = _requests(page_size)
    md = _backend("trtllm_mha", pool, r2t).builder.build(_decode(rows, LENS, page_size))
    used = [-(-n // page_size) for n in LENS]
    for r, n in enumerate(used):
        assert md.page_tables[FULL][r, n:].tolist() == [0] * (md.page_tables[FULL].shape[1] - n)
        assert md.page_tables[SWA][r, n:].tolist() == [0] * (md.page_tables[SWA].shape[1] - n)
        full_first = r2t.req_to_token[rows[r], 0:n * page_size:page_size]
        swa_first = pool.translate_loc_from_full_to_swa(full_first).long()
        assert md.page_tables[SWA][r, :n].tolist() == (swa_first // page_size).tolist()
        assert md.page_tables[SWA][r, :n].tolist() != md.page_tables[FULL][r, :n].tolist()  # the pools part
    assert int(md.page_tables[SWA].max()) < pool.swa_size // page_size


def test_a_graph_refresh_fills_the_real_rows_and_the_padding_rows_read_the_dummy_page():
    pool, r2t, rows = _requests(16)
    builder = _backend("trtllm_mha", pool, r2t).builder
    builder.init_graph_state(4)
    captured = builder.build_for_graph_capture(_decode([0] * 4, [1] * 4, 16))
    for table in captured.page_tables:
        assert table.tolist() == [[0] * table.shape[1]] * 4
    assert captured.seq_lens.tolist() == [1] * 4
    refreshed = builder.refresh_for_graph_replay(_decode([*rows, 0], [*LENS, 1], 16, num_real=3))
    assert refreshed is captured
    eager = builder.build(_decode(rows, LENS, 16))
    for static, fresh in zip(refreshed.page_tables, eager.page_tables, strict=True):
        assert static[:3].tolist() == fresh.tolist()
        assert static[3].tolist() == [0] * static.shape[1]
    assert refreshed.seq_lens.tolist() == [*LENS, 1]
    assert {id(t) for t in builder.static_tensors()} >= {id(t) for t in builder._cg_tables}


@pytest.mark.parametrize("kv_dtype", ["float32", "fp8_e4m3"])
def test_the_decode_stand_in_attends_as_torch_native_does(kv_dtype):
    pool, r2t, rows = _requests(16, kv_dtype=kv_dtype)
    batch = _decode(rows, LENS, 16)
    native, trt = _backend("torch_native", pool, r2t), _backend("trtllm_mha", pool, r2t)
    md_native, md_trt = native.builder.build(batch), trt.builder.build(batch)
    q = torch.randn(3, SPEC.num_heads * SPEC.head_dim, generator=torch.Generator().manual_seed(1))
    for layer in range(SPEC.num_layers):
        got, want = trt.impl.attend(layer, q, None, md_trt), native.impl.attend(layer, q, None, md_native)
        assert (got - want).abs().max() <= 1e-5 + 1e-5 * want.abs().max(), layer


def test_extend_batches_go_through_flashinfers_prefill_lists():
    pool, r2t, rows = _requests(16)
    batch = _extend(rows, LENS, [3, 2, 5], 16)
    trt, fi = _backend("trtllm_mha", pool, r2t), _backend("flashinfer", pool, r2t)
    md = trt.builder.build(batch)
    assert isinstance(md, FlashInferMetadata)
    q = torch.randn(10, SPEC.num_heads * SPEC.head_dim, generator=torch.Generator().manual_seed(2))
    for layer in range(SPEC.num_layers):
        assert torch.equal(trt.impl.attend(layer, q, None, md), fi.impl.attend(layer, q, None, fi.builder.build(batch)))


def test_the_op_declares_that_it_writes_out_and_only_out_and_has_cpu_and_cuda_kernels():
    schema = torch.ops.harness_trtllm.paged_decode.default._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == ["out"]
    assert {"q", "k_cache", "v_cache", "block_tables", "seq_lens", "workspace"} <= {a.name for a in schema.arguments}
    for key in ("CPU", "CUDA"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(OP_NAME, key), key


# ---- the declaration -----------------------------------------------------------------------------------
def _gpu(monkeypatch, capability, name="NVIDIA GPU"):
    monkeypatch.setattr(importlib.util, "find_spec", lambda module: object())
    monkeypatch.setattr(trt_module.torch.cuda, "is_available", lambda: capability is not None)
    monkeypatch.setattr(trt_module.torch.cuda, "get_device_capability", lambda *a: capability)
    monkeypatch.setattr(trt_module.torch.cuda, "get_device_name", lambda *a: name)


def test_the_backend_needs_pages_of_16_32_or_64_and_an_sm90_gpu_naming_the_architecture_it_lacks(monkeypatch):
    assert backend_class("trtllm_mha") is TrtllmMHABackend
    model = dict(model=PRESETS["gpt-oss-mini-bf16"], kv_dtype="bfloat16")
    _gpu(monkeypatch, (8, 0), "NVIDIA A100-SXM4-80GB")
    assert TrtllmMHABackend.unsupported(mode="full", device="cuda", page_size=16, **model) == (
        "backend trtllm_mha needs an SM90 (Hopper) or newer GPU for FlashInfer's TRT-LLM decode kernel; "
        "NVIDIA A100-SXM4-80GB is sm_80",)
    _gpu(monkeypatch, (9, 0), "NVIDIA H200")
    assert TrtllmMHABackend.unsupported(mode="full", device="cuda", page_size=16, **model) == ()
    assert TrtllmMHABackend.unsupported(mode="piecewise", device="cuda", page_size=64, **model) == ()
    assert TrtllmMHABackend.unsupported(mode="eager", device="cuda", page_size=4, **model) == (
        "backend trtllm_mha supports page sizes 16, 32, 64, not 4",)
    _gpu(monkeypatch, None)
    assert "backend trtllm_mha needs a CUDA GPU; this machine has none" in TrtllmMHABackend.unsupported(
        mode="eager", device="cpu", page_size=16, **model)


def test_the_backend_refuses_float32_models_and_names_a_missing_flashinfer(monkeypatch):
    _gpu(monkeypatch, (9, 0))
    reasons = TrtllmMHABackend.unsupported(mode="eager", device="cuda", page_size=16, model=PRESETS["gpt-oss-mini"],
                                           kv_dtype="float32")
    assert any(r.startswith("backend trtllm_mha: FlashInfer has no float32 kernels") for r in reasons)
    monkeypatch.setattr(importlib.util, "find_spec", lambda module: None)
    assert trt_module.missing_requirements() == (
        "backend trtllm_mha needs flashinfer-python, the optional extra gpu (make test-gpu, or "
        "pip install -e '.[gpu]')",)


def test_flashinfer_is_imported_only_inside_the_ops_cuda_kernel():
    tree = ast.parse((ROOT / "harness" / "backends" / "trtllm_mha.py").read_text())
    for node in tree.body:  # module level: would import the extra wherever the registry loads the backend
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        assert not any(n.split(".")[0] == "flashinfer" for n in names), ast.unparse(node)


# ---- on a GPU ------------------------------------------------------------------------------------------
_LACKING = "; ".join(trt_module.missing_requirements()) or None
BF16_SPEC = dataclasses.replace(SPEC, dtype="bfloat16", head_dim=64)


@pytest.mark.gpu
@pytest.mark.skipif(_LACKING is not None, reason=_LACKING or "")
@pytest.mark.parametrize("kv_dtype", ["bfloat16", "fp8_e4m3"])
def test_the_trtllm_decode_kernel_attends_as_its_cpu_stand_in_on_the_same_page_tables(kv_dtype):
    pool, r2t, rows = _requests(16, kv_dtype=kv_dtype, spec=BF16_SPEC, device="cuda")
    backend = _backend("trtllm_mha", pool, r2t, BF16_SPEC)
    md = backend.builder.build(_decode(rows, LENS, 16, device="cuda"))
    q = torch.randn(3, BF16_SPEC.num_heads * BF16_SPEC.head_dim, device="cuda").bfloat16()
    impl = backend.impl
    for layer in range(BF16_SPEC.num_layers):
        kernel = impl.attend(layer, q, None, md).float().cpu()
        group = impl._group_of[layer]
        k_buf, v_buf = pool.get_kv_buffer(layer)
        k_scale, v_scale = pool.kv_scales[layer] if impl._fp8 else (1.0, 1.0)
        stand_in = trt_module.dense_paged_decode(
            q.cpu().view(3, impl.num_heads, impl.head_dim), impl._pages(k_buf).cpu(), impl._pages(v_buf).cpu(),
            md.page_tables[group].cpu(), md.seq_lens.cpu(), max_seq_len=md.max_seq_len,
            window_left=md.window_left[group], bmm1_scale=impl.scale * k_scale, bmm2_scale=v_scale)
        want = stand_in.reshape(3, -1).float()
        assert (kernel - want).abs().max() <= 2e-2 + 2e-2 * want.abs().max(), layer


def test_the_tape_records_the_decode_op_body_and_replays_it_on_the_refreshed_static_tables():
    from types import SimpleNamespace

    from harness.graphs.registry import get_engine

    pool, r2t, rows = _requests(16)
    backend = _backend("trtllm_mha", pool, r2t)
    backend.init_cuda_graph_state(4)
    backend.init_forward_metadata_capture_cuda_graph(_decode([0] * 4, [1] * 4, 16))
    md = backend.forward_metadata
    static = SimpleNamespace(q=torch.zeros(4, SPEC.num_heads * SPEC.head_dim))

    def decode_attention():
        return torch.stack([backend.impl.attend(layer, static.q, None, md) for layer in range(SPEC.num_layers)])

    graph = get_engine("tape").capture(
        decode_attention, label="decode bs=4", roots={"backend": backend, "static": static},
        static_inputs=[static.q, *pool.buffers(), *backend.graph_static_tensors()])
    batch = _decode([*rows, 0], [*LENS, 1], 16, num_real=3)
    backend.init_forward_metadata_replay_cuda_graph(batch)
    static.q.copy_(torch.randn(static.q.shape, generator=torch.Generator().manual_seed(2)))
    graph.replay()
    eager = backend.builder.build(batch)
    expected = torch.stack([backend.impl.attend(layer, static.q, None, eager) for layer in range(SPEC.num_layers)])
    assert torch.equal(graph.outputs[0], expected)
    assert not graph.audit.unregistered
    assert {"backend.forward_metadata.page_tables[0]", "backend.forward_metadata.page_tables[1]",
            "backend.forward_metadata.seq_lens"} <= {i.path for i in graph.audit.inputs}

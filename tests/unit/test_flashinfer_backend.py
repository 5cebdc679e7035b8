"""The FlashInfer backend hands its kernels the lists the CPU backends read, planned per window group.

On the CPU the paged-attention op runs its dense stand-in over the same lists, so everything but the kernels
is checked here: the CSR lists of both pools at every page size the pool supports against the torch-native
and gathering backends' views of the same batches, the padding rows of graph batches, the window groups,
the FP8 views, the op's registration, its attention against torch-native's, the tape recording and replaying
it on refreshed static lists, and the declaration that skips the backend's cells without FlashInfer or a GPU.
The tests marked ``gpu`` run the kernels.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness.backends import flashinfer as fi_module
from harness.backends.base import attention_batch
from harness.backends.flashinfer import FlashInferBackend, missing_requirements, window_groups
from harness.backends.flashinfer_ops import OP_NAME
from harness.backends.paged_kv import paged_kv_layout, paged_kv_slots
from harness.backends.registry import backend_class
from harness.check.case import cases
from harness.graphs.registry import get_engine
from harness.scenario.loader import load_scenario
from harness.serving.allocator import SWATokenToKVPoolAllocator
from harness.serving.batch import ForwardMode
from harness.serving.designs import DESIGNS
from harness.serving.miniature import MiniatureStack
from harness.serving.model import model_spec
from harness.serving.pool import SUPPORTED_PAGE_SIZES, HybridSWAKVPool, PoolSpec, ReqToTokenPool

ROOT = Path(__file__).resolve().parents[2]
SPEC = model_spec("gpt-oss-mini")  # layers swa, full, swa, full; window 8
WIDTH = 32
LENS = [11, 3, 20]


def _requests(page_size: int, lens=LENS, *, kv_dtype: str = "float32", spec=SPEC, device: str = "cpu"):
    """Requests of ``lens`` tokens whose SWA pages differ from their full pages (three SWA pages of an
    earlier request were evicted first), every pool slot holding random K/V."""
    pool = HybridSWAKVPool(spec=PoolSpec(full_size=64 * page_size, swa_size=48 * page_size, page_size=page_size,
                                         kv_dtype=kv_dtype, max_context_len=WIDTH),
                           layer_is_swa=spec.layer_is_swa, num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                           kv_scales=[(0.5, 0.25)] * spec.num_layers, device=device)
    r2t = ReqToTokenPool(max_running_requests=4, max_context_len=WIDTH, device=device)
    alloc = SWATokenToKVPoolAllocator(pool)
    alloc.free_swa(alloc.alloc(3 * page_size))
    rows = []
    for n in lens:
        locs = alloc.alloc(n)
        rows.append(r2t.alloc())
        r2t.write(rows[-1], 0, locs)
    gen = torch.Generator().manual_seed(0)
    for buf in (*pool.full_k_buffer, *pool.full_v_buffer, *pool.swa_k_buffer, *pool.swa_v_buffer):
        values = torch.randn(buf.shape, generator=gen)
        buf.copy_(values.to(torch.float8_e4m3fn).view(torch.uint8) if buf.dtype == torch.uint8 else values)
    return pool, r2t, rows


def _backend(name: str, pool, r2t, spec=SPEC):
    return backend_class(name)(model_spec=spec, stack=MiniatureStack.over(pool, r2t),
                               design=DESIGNS["forward_batch"])


def _decode(rows, lens, page_size, *, num_real=None, device="cpu"):
    return attention_batch(forward_mode=ForwardMode.DECODE, req_pool_indices=torch.tensor(rows, device=device),
                           seq_lens=torch.tensor(lens, device=device), num_real=num_real,
                           out_cache_loc=torch.zeros(len(rows), dtype=torch.int64, device=device), page_size=page_size)


def _extend(rows, lens, new, page_size, device="cpu"):
    return attention_batch(forward_mode=ForwardMode.EXTEND, req_pool_indices=torch.tensor(rows, device=device),
                           seq_lens=torch.tensor(lens, device=device),
                           out_cache_loc=torch.zeros(sum(new), dtype=torch.int64, device=device), page_size=page_size,
                           extend_seq_lens=torch.tensor(new, device=device), extend_seq_lens_cpu=tuple(new))


def _slots(paged, page_size):
    """Each request's run of the group as pool slots, and its kv length."""
    return paged_kv_slots(paged.indptr, paged.indices, paged.last_page_len, page_size=page_size, lanes=WIDTH)


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, *, rtol: float, atol: float) -> None:
    # not torch.testing.assert_close: its first call imports torch.distributed.tensor (seconds per worker)
    assert actual.shape == expected.shape
    worst = ((actual.float() - expected.float()).abs() - rtol * expected.float().abs()).max().item()
    assert worst <= atol, f"off by {worst + atol:.3g} past rtol {rtol}"


FULL, SWA = 1, 0  # gpt-oss-mini's first group is its SWA layers (layer 0), the second its full ones


# ---- the lists -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("page_size", SUPPORTED_PAGE_SIZES)
def test_full_layers_read_every_page_of_each_request_as_torch_native_reads_them(page_size):
    pool, r2t, rows = _requests(page_size)
    batch = _decode(rows, LENS, page_size)
    native = _backend("torch_native", pool, r2t).builder.build(batch)
    md = _backend("flashinfer", pool, r2t).builder.build(batch)
    slots, kv_lens = _slots(md.groups[FULL], page_size)
    assert kv_lens.tolist() == LENS
    for r, n in enumerate(LENS):
        assert slots[r, :n].tolist() == native.page_table[r, :n].tolist()
    assert md.groups[FULL].indptr.tolist() == [0, *torch.tensor(LENS).add(page_size - 1).div(
        page_size, rounding_mode="floor").cumsum(0).tolist()]


@pytest.mark.parametrize("page_size", SUPPORTED_PAGE_SIZES)
def test_swa_layers_read_each_requests_window_translated_to_the_swa_pool_and_at_most_one_partial_page_more(
        page_size):
    pool, r2t, rows = _requests(page_size)
    batch = _decode(rows, LENS, page_size)
    gather = _backend("torch_gather", pool, r2t).builder.build(batch)
    md = _backend("flashinfer", pool, r2t).builder.build(batch)
    slots, kv_lens = _slots(md.groups[SWA], page_size)
    counts = (~gather.swa.padding[:, 0, 0]).sum(1).tolist()
    for r, (kv_len, count) in enumerate(zip(kv_lens.tolist(), counts)):
        # the window's keys end the run; before them only the older keys sharing the window's first page
        assert slots[r, kv_len - count:kv_len].tolist() == gather.swa.indices[r, :count].tolist()
        assert 0 <= kv_len - count < page_size
    if page_size == 1:
        assert slots[0, :8].tolist() != gather.full.indices[0, 3:11].tolist(), "the setup must part the pools"


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_an_extend_run_starts_at_the_window_of_its_first_new_token(page_size):
    pool, r2t, rows = _requests(page_size)
    new = [3, 2, 5]
    batch = _extend(rows, LENS, new, page_size)
    gather = _backend("torch_gather", pool, r2t).builder.build(batch)
    md = _backend("flashinfer", pool, r2t).builder.build(batch)
    slots, kv_lens = _slots(md.groups[SWA], page_size)
    counts = (~gather.swa.padding[:, 0, 0]).sum(1).tolist()
    token = 0
    for r, n in enumerate(new):
        for i in range(n):
            query = kv_lens[r].item() - n + i  # the token's own position in its request's run
            assert slots[r, query + 1 - counts[token]:query + 1].tolist() == gather.swa.indices[token, :counts[token]].tolist()
            token += 1
    assert md.qo_indptr.tolist() == [0, 3, 5, 10]


def test_last_page_len_counts_the_tokens_of_each_requests_last_page():
    layout = paged_kv_layout((11, 3, 20, 16), (1, 1, 1, 1), page_size=4, window=None)
    assert layout.last_page_len == (3, 3, 4, 4)
    assert layout.indptr == (0, 3, 4, 9, 13)
    swa = paged_kv_layout((11, 3, 20, 16), (1, 1, 1, 1), page_size=4, window=8)
    # windows start at positions 3, 0, 12, 8: pages 0, 0, 3, 2
    assert swa.first_page == (0, 0, 3, 2)
    assert swa.kv_lens == (11, 3, 8, 8)


# ---- graph batches ---------------------------------------------------------------------------------------
def test_the_capture_batch_plans_one_dummy_page_of_one_token_per_padding_row():
    pool, r2t, _ = _requests(4)
    backend = _backend("flashinfer", pool, r2t)
    backend.builder.init_graph_state(4)
    pad = FlashInferBackend.pad_seq_len
    md = backend.builder.build_for_graph_capture(_decode([0] * 4, [pad] * 4, 4))
    for paged in md.groups:
        assert paged.indptr.tolist() == [0, 1, 2, 3, 4]
        assert paged.indices[:4].tolist() == [0] * 4
        assert paged.last_page_len.tolist() == [1] * 4
    assert pad == 1


def test_a_replay_refresh_fills_the_real_rows_and_the_padding_rows_read_the_dummy_page():
    pool, r2t, rows = _requests(4)
    backend = _backend("flashinfer", pool, r2t)
    backend.builder.init_graph_state(4)
    captured = backend.builder.build_for_graph_capture(_decode([0] * 4, [1] * 4, 4))
    refreshed = backend.builder.refresh_for_graph_replay(_decode([*rows, 0], [*LENS, 1], 4, num_real=3))
    assert refreshed is captured
    eager = backend.builder.build(_decode(rows, LENS, 4))
    for static, fresh in zip(refreshed.groups, eager.groups):
        n = fresh.indices.shape[0]
        assert static.indptr.tolist() == [*fresh.indptr.tolist(), n + 1]
        assert static.indices[:n + 1].tolist() == [*fresh.indices.tolist(), 0]
        assert static.last_page_len.tolist() == [*fresh.last_page_len.tolist(), 1]


# ---- window groups, FP8 views --------------------------------------------------------------------------
@pytest.mark.parametrize("preset, expected", [
    ("gpt-oss-mini", [(8, (0, 2), 7), (None, (1, 3), -1)]),
    ("gemma-mini", [(6, (0, 1, 2, 3, 4), 5), (None, (5,), -1)]),
    ("all-swa", [(4, (0, 1, 2), 3)]),
])
def test_layers_group_by_window_with_flashinfer_window_left_of_w_minus_one(preset, expected):
    groups = window_groups(model_spec(preset))
    assert [(g.window, g.layers, g.window_left) for g in groups] == expected


def test_an_fp8_pool_is_handed_over_as_e4m3_views_of_its_own_bytes():
    pool, r2t, _ = _requests(4, kv_dtype="fp8_e4m3")
    impl = _backend("flashinfer", pool, r2t).impl
    buf = pool.get_key_buffer(0)
    view = impl._pages(buf)
    assert view.dtype == torch.float8_e4m3fn
    assert view.shape == (buf.shape[0] // 4, 4, *buf.shape[1:])
    assert view.data_ptr() == buf.data_ptr()
    assert torch.equal(view.reshape(buf.shape).view(torch.uint8), buf)


# ---- the op --------------------------------------------------------------------------------------------
def test_the_op_declares_that_it_writes_out_and_only_out_and_has_cpu_and_cuda_kernels():
    schema = torch.ops.harness_flashinfer.paged_attention.default._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == ["out"]
    assert {"q", "k_cache", "v_cache", "kv_indptr", "kv_indices", "kv_last_page_len", "int_workspace",
            "float_workspace"} <= {a.name for a in schema.arguments}
    for key in ("CPU", "CUDA"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(OP_NAME, key), key


@pytest.mark.parametrize("kv_dtype", ["float32", "fp8_e4m3"])
@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_the_stand_in_attends_as_torch_native_does(mode, page_size, kv_dtype):
    pool, r2t, rows = _requests(page_size, kv_dtype=kv_dtype)
    new = [1] * 3 if mode == "decode" else [3, 2, 5]
    batch = _decode(rows, LENS, page_size) if mode == "decode" else _extend(rows, LENS, new, page_size)
    native, fi = _backend("torch_native", pool, r2t), _backend("flashinfer", pool, r2t)
    md_native, md_fi = native.builder.build(batch), fi.builder.build(batch)
    q = torch.randn(sum(new), SPEC.num_heads * SPEC.head_dim, generator=torch.Generator().manual_seed(1))
    for layer in range(SPEC.num_layers):
        _assert_close(fi.impl.attend(layer, q, None, md_fi), native.impl.attend(layer, q, None, md_native),
                                   rtol=1e-5, atol=1e-5)


def test_the_stand_in_attends_as_torch_native_does_in_bfloat16():
    spec = dataclasses.replace(SPEC, dtype="bfloat16")
    pool, r2t, rows = _requests(4, kv_dtype="bfloat16", spec=spec)
    batch = _decode(rows, LENS, 4)
    native, fi = _backend("torch_native", pool, r2t, spec), _backend("flashinfer", pool, r2t, spec)
    q = torch.randn(3, spec.num_heads * spec.head_dim, generator=torch.Generator().manual_seed(1)).bfloat16()
    for layer in range(spec.num_layers):
        _assert_close(fi.impl.attend(layer, q, None, fi.builder.build(batch)),
                                   native.impl.attend(layer, q, None, native.builder.build(batch)),
                                   rtol=2e-2, atol=2e-2)


def test_the_tape_records_the_op_body_and_replays_it_on_the_refreshed_static_lists():
    pool, r2t, rows = _requests(4)
    backend = _backend("flashinfer", pool, r2t)
    backend.init_cuda_graph_state(4)
    backend.init_forward_metadata_capture_cuda_graph(_decode([0] * 4, [1] * 4, 4))
    md = backend.forward_metadata
    static = SimpleNamespace(q=torch.zeros(4, SPEC.num_heads * SPEC.head_dim))

    def decode_attention():
        return torch.stack([backend.impl.attend(layer, static.q, None, md) for layer in range(SPEC.num_layers)])

    graph = get_engine("tape").capture(
        decode_attention, label="decode bs=4", roots={"backend": backend, "static": static},
        static_inputs=[static.q, *pool.buffers(), *backend.graph_static_tensors()])
    batch = _decode([*rows, 0], [*LENS, 1], 4, num_real=3)
    backend.init_forward_metadata_replay_cuda_graph(batch)
    static.q.copy_(torch.randn(static.q.shape, generator=torch.Generator().manual_seed(2)))
    graph.replay()
    eager = backend.builder.build(batch)
    expected = torch.stack([backend.impl.attend(layer, static.q, None, eager) for layer in range(SPEC.num_layers)])
    assert torch.equal(graph.outputs[0], expected)
    assert graph.audit.rerun_ops == ()  # the stand-in's body is recorded, not re-run
    assert not graph.audit.unregistered
    paths = {i.path for i in graph.audit.inputs}
    assert {f"backend.builder._cg_lists[{g}].indices" for g in (0, 1)} <= paths


# ---- the declaration -----------------------------------------------------------------------------------
def test_the_backend_runs_on_cuda_only_and_names_what_this_machine_lacks(monkeypatch):
    reasons = FlashInferBackend.unsupported(mode="full", device="cpu")
    assert "backend flashinfer runs on cuda, not cpu" in reasons
    monkeypatch.setattr(fi_module.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(fi_module.importlib.util, "find_spec", lambda name: None)
    assert missing_requirements() == (
        "backend flashinfer needs flashinfer-python, the optional extra gpu (make test-gpu, or "
        "pip install -e '.[gpu]')",
        "backend flashinfer needs a CUDA GPU; this machine has none")
    assert FlashInferBackend.unsupported(mode="eager", device="cuda") == missing_requirements()


def test_a_library_scenarios_flashinfer_cells_run_on_cuda_and_say_why_they_are_skipped_here(monkeypatch):
    monkeypatch.setattr(fi_module.torch.cuda, "is_available", lambda: False)
    scenario = load_scenario(ROOT / "scenarios" / "swa_decode_padded_buckets.toml")
    found = cases(scenario, backends=["flashinfer"], extra_backends=["flashinfer"], designs=["metadata"])
    assert {(c.mode, c.device, c.engine) for c in found} == {("eager", "cuda", "cuda"), ("full", "cuda", "cuda")}
    assert all("backend flashinfer needs a CUDA GPU; this machine has none" in c.unsupported for c in found)


def test_flashinfer_is_imported_only_inside_the_planner():
    for name in ("flashinfer.py", "flashinfer_ops.py", "paged_kv.py"):
        tree = ast.parse((ROOT / "harness" / "backends" / name).read_text())
        for node in tree.body:  # module level: would import the 1.3 GB extra wherever the registry loads it
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            assert not any(n.split(".")[0] == "flashinfer" for n in names), (name, ast.unparse(node))


# ---- on a GPU ------------------------------------------------------------------------------------------
# the reasons this machine lacks, or None where the GPU tests run
_LACKING = "; ".join(missing_requirements()) or None
gpu_only = pytest.mark.skipif(_LACKING is not None, reason=_LACKING or "")
BF16_SPEC = dataclasses.replace(SPEC, dtype="bfloat16", head_dim=64)  # FlashInfer: no float32, head_dim >= 64


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("kv_dtype", ["bfloat16", "fp8_e4m3"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_flashinfer_kernels_attend_as_their_cpu_stand_in_on_the_same_lists(mode, page_size, kv_dtype):
    pool, r2t, rows = _requests(page_size, kv_dtype=kv_dtype, spec=BF16_SPEC, device="cuda")
    new = [1] * 3 if mode == "decode" else [3, 2, 5]
    batch = (_decode(rows, LENS, page_size, device="cuda") if mode == "decode"
             else _extend(rows, LENS, new, page_size, device="cuda"))
    backend = _backend("flashinfer", pool, r2t, BF16_SPEC)
    md = backend.builder.build(batch)
    q = torch.randn(sum(new), BF16_SPEC.num_heads * BF16_SPEC.head_dim, device="cuda").bfloat16()
    for layer in range(BF16_SPEC.num_layers):
        kernel = backend.impl.attend(layer, q, None, md)
        cpu_md = dataclasses.replace(md, groups=tuple(dataclasses.replace(g, wrapper=0) for g in md.groups))
        stand_in = _stand_in(backend.impl, layer, q, cpu_md)
        _assert_close(kernel.float().cpu(), stand_in.float(), rtol=2e-2, atol=2e-2)


def _stand_in(impl, layer, q, md):
    from harness.backends.flashinfer_ops import dense_paged_attention

    paged = md.groups[impl._group_of[layer]]
    k_buf, v_buf = impl.pool.get_kv_buffer(layer)
    k_scale, v_scale = impl.pool.kv_scales[layer] if impl._fp8 else (1.0, 1.0)
    t = q.shape[0]
    out = dense_paged_attention(
        q.cpu().view(t, impl.num_heads, impl.head_dim), impl._pages(k_buf).cpu(), impl._pages(v_buf).cpu(),
        md.qo_indptr.cpu(), paged.indptr.cpu(), paged.indices.cpu(), paged.last_page_len.cpu(),
        window_left=paged.window_left, sm_scale=impl.scale, k_scale=k_scale, max_kv_len=md.max_kv_len)
    return out.reshape(t, -1) * v_scale


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("mode", ["full", "piecewise"])
def test_a_library_scenario_under_flashinfer_and_cuda_graphs_matches_its_eager_run(mode):
    from harness.check.matrix import run_case

    scenario = load_scenario(ROOT / "scenarios" / "swa_prefill_window_edge.toml" if mode == "piecewise"
                             else ROOT / "scenarios" / "swa_decode_padded_buckets.toml")
    scenario = dataclasses.replace(scenario, model=dataclasses.replace(scenario.model, dtype="bfloat16", head_dim=64),
                                   pool=dataclasses.replace(scenario.pool, kv_dtype="bfloat16"))
    [case] = [c for c in cases(scenario, backends=["flashinfer"], extra_backends=["flashinfer"], designs=["metadata"],
                               modes=[mode], device="cuda", engine="cuda") if c.with_faults]
    assert case.unsupported is None, case.unsupported
    result = run_case(case)
    assert result.ok, (result.verdict.outcome, result.verdict.error)


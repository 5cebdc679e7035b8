"""The catalog's FlashInfer faults change what the backend hands FlashInfer, and only that.

Their library scenarios' cells need FlashInfer's kernels (a GPU); here each fault's mechanism is checked on the
CPU: the plan calls (recorded by a stand-in for FlashInfer's wrapper API that the real planner drives), the
buffer the replay's page ids land in, and the window the SWA prefill is planned and run with, with the op's
CPU stand-in showing what the kernel would read.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from harness.backends import flashinfer as fi_module
from harness.backends.registry import backend_class
from harness.serving.designs import DESIGNS
from harness.serving.faults import FAULTS, Component
from harness.serving.miniature import MiniatureStack

from test_flashinfer_backend import LENS, SPEC, SWA, _decode, _extend, _requests

FAULT_NAMES = ("skip_replan_before_replay", "indices_in_eager_buffer", "swa_prefill_plan_without_window")


class _RecordedWrapper:
    """FlashInfer's wrapper API as the planner calls it, recording each ``plan``."""

    def __init__(self, log: list, kind: str, float_workspace: torch.Tensor, kv_layout: str, **options) -> None:
        self.log, self.kind, self.options = log, kind, options
        assert kv_layout == "NHD" and options.get("backend") == "fa2"

    def reset_workspace_buffer(self, float_workspace: torch.Tensor, int_workspace: torch.Tensor) -> None:
        self.workspaces = (float_workspace, int_workspace)

    def plan(self, *args, **kwargs) -> None:
        graph = self.options.get("use_cuda_graph", False)
        indices = args[1] if self.kind == "decode" else args[2]
        self.log.append(SimpleNamespace(kind=self.kind, graph=graph, window_left=kwargs.get("window_left", -1),
                                        indices=indices, bound=self.options.get("paged_kv_indices_buffer")))


def _backend_with_recorded_planner(monkeypatch, page_size: int, faults=()):
    log: list = []
    fake = SimpleNamespace(
        BatchDecodeWithPagedKVCacheWrapper=lambda *a, **k: _RecordedWrapper(log, "decode", *a, **k),
        BatchPrefillWithPagedKVCacheWrapper=lambda *a, **k: _RecordedWrapper(log, "prefill", *a, **k))
    monkeypatch.setitem(__import__("sys").modules, "flashinfer", fake)
    monkeypatch.setattr(fi_module, "_FLOAT_WORKSPACE_BYTES", 1 << 10)
    monkeypatch.setattr(fi_module, "_INT_WORKSPACE_BYTES", 1 << 10)
    pool, r2t, rows = _requests(page_size)
    backend = backend_class("flashinfer")(model_spec=SPEC, stack=MiniatureStack.over(pool, r2t),
                                          design=DESIGNS["forward_batch"], faults=faults)
    # on the CPU the builder plans nothing; the real planner drives the recorded API instead
    backend.builder._planner = fi_module._Planner(model_spec=SPEC, pool=pool, groups=backend.builder.groups)
    return backend, rows, log


def _capture_then_refresh(backend, rows, page_size):
    backend.builder.init_graph_state(4)
    backend.builder.build_for_graph_capture(_decode([0] * 4, [1] * 4, page_size))
    return backend.builder.refresh_for_graph_replay(_decode([*rows, 0], [*LENS, 1], page_size, num_real=3))


def test_the_flashinfer_faults_are_attention_backend_faults_with_a_switch_in_flashinfer_only():
    for name in FAULT_NAMES:
        assert FAULTS[name].acts_on is Component.ATTENTION_BACKEND
        assert name in backend_class("flashinfer").known_faults
        for cpu in ("torch_native", "torch_gather"):
            assert name not in backend_class(cpu).known_faults


@pytest.mark.parametrize("faults, replay_plans", [((), 2), (("skip_replan_before_replay",), 0)])
def test_skipping_the_replan_leaves_every_replay_on_the_capture_batchs_plan(monkeypatch, faults, replay_plans):
    backend, rows, log = _backend_with_recorded_planner(monkeypatch, 4, faults)
    refreshed = _capture_then_refresh(backend, rows, 4)
    graph_plans = [entry for entry in log if entry.graph]
    assert len(graph_plans) == 2 + replay_plans  # one per window group at capture, then per group again
    eager = backend.builder.build(_decode(rows, LENS, 4))
    for static, fresh in zip(refreshed.groups, eager.groups, strict=True):  # the lists are refreshed either way
        n = fresh.indices.shape[0]
        assert static.indices[:n].tolist() == fresh.indices.tolist()


@pytest.mark.parametrize("faults", [(), ("indices_in_eager_buffer",)])
def test_indices_rebuilt_in_the_eager_buffer_leave_the_graph_bound_one_on_the_dummy_page(monkeypatch, faults):
    backend, rows, log = _backend_with_recorded_planner(monkeypatch, 4, faults)
    refreshed = _capture_then_refresh(backend, rows, 4)
    eager = backend.builder.build(_decode(rows, LENS, 4))
    for i, (static, fresh) in enumerate(zip(refreshed.groups, eager.groups, strict=True)):
        n = fresh.indices.shape[0]
        bound = backend.builder._cg_lists[i].indices
        assert static.indices is bound  # what the graph (and the op) reads
        replan = [e for e in log if e.graph and e.bound is bound][-1]
        assert replan.indices.data_ptr() == bound.data_ptr()  # the plan is handed the graph-bound buffer
        if faults:
            assert bound[:n].tolist() == [0] * n
            assert backend.builder._eager_indices[i][:n].tolist() == fresh.indices.tolist()
        else:
            assert bound[:n].tolist() == fresh.indices.tolist()


def test_a_graph_on_indices_left_in_the_eager_buffer_reads_only_the_dummy_page():
    pool, r2t, rows = _requests(4)
    q = torch.randn(4, SPEC.num_heads * SPEC.head_dim, generator=torch.Generator().manual_seed(3))
    outs = {}
    for faults in ((), ("indices_in_eager_buffer",)):
        backend = backend_class("flashinfer")(model_spec=SPEC, stack=MiniatureStack.over(pool, r2t),
                                              design=DESIGNS["forward_batch"], faults=faults)
        refreshed = _capture_then_refresh(backend, rows, 4)
        outs[faults] = backend.impl.attend(SWA, q, None, refreshed)
    assert not torch.equal(outs[()][:3], outs[("indices_in_eager_buffer",)][:3])


@pytest.mark.parametrize("faults, swa_prefill_window", [((), 7), (("swa_prefill_plan_without_window",), -1)])
def test_the_sliding_window_prefill_wrapper_is_planned_and_run_with_the_window_unless_the_fault_drops_it(
        monkeypatch, faults, swa_prefill_window):
    backend, rows, log = _backend_with_recorded_planner(monkeypatch, 4, faults)
    extend = backend.builder.build(_extend(rows, LENS, [3, 2, 5], 4))
    decode = backend.builder.build(_decode(rows, LENS, 4))
    prefill_plans = [e.window_left for e in log if e.kind == "prefill"]
    decode_plans = [e.window_left for e in log if e.kind == "decode"]
    assert prefill_plans == [swa_prefill_window, -1]  # the SWA group, then the full one
    assert decode_plans == [7, -1]  # decode wrappers keep W - 1 either way
    assert [g.window_left for g in extend.groups] == prefill_plans  # the layers run what was planned
    assert [g.window_left for g in decode.groups] == decode_plans


def test_a_sliding_window_prefill_without_its_window_attends_to_keys_before_the_window():
    pool, r2t, rows = _requests(1)
    batch = _extend(rows, LENS, [3, 2, 5], 1)
    q = torch.randn(10, SPEC.num_heads * SPEC.head_dim, generator=torch.Generator().manual_seed(4))
    native = backend_class("torch_native")(model_spec=SPEC, stack=MiniatureStack.over(pool, r2t),
                                           design=DESIGNS["forward_batch"])
    faulty = backend_class("flashinfer")(model_spec=SPEC, stack=MiniatureStack.over(pool, r2t),
                                         design=DESIGNS["forward_batch"], faults=("swa_prefill_plan_without_window",))
    want = native.impl.attend(SWA, q, None, native.builder.build(batch))
    got = faulty.impl.attend(SWA, q, None, faulty.builder.build(batch))
    # request 2 (20 tokens, 5 new): its later queries see more than W keys; the full layers are untouched
    per_token = (got - want).abs().amax(dim=1)
    assert per_token[5:].max() > 1e-3
    full = 1 - SWA
    assert torch.allclose(faulty.impl.attend(full, q, None, faulty.builder.build(batch)),
                          native.impl.attend(full, q, None, native.builder.build(batch)), atol=1e-5, rtol=1e-5)

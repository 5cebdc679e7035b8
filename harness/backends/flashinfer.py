"""The FlashInfer backend: the torch-native backend's semantics through FlashInfer's paged wrappers.

KV is written where the active design says, through the base implementation's seam
(``_get_layer_cache_loc``, the fused FP8 path included). Attention reads the pools through
``BatchPrefillWithPagedKVCacheWrapper`` (extend batches) and ``BatchDecodeWithPagedKVCacheWrapper``
(decode-shaped ones), as SGLang's FlashInfer backend drives them:

* **one wrapper per window group.** FlashInfer plans a window into the wrapper and asserts at ``run``
  that the call's ``window_left`` is the planned one, so the full layers (``window_left = -1``, full-pool
  pages) and the sliding-window layers (``window_left = W - 1``, SWA-pool pages holding only the windows
  of the forward's tokens) each get their own, planned once per forward and run by every layer of the group;
* **plans from host lengths.** ``plan()`` sizes its work on the CPU, so the lists are laid out from
  ``AttentionBatch.seq_lens_cpu`` (``paged_kv.py``) and only the page ids are gathered on the device;
* **graphs.** Per decode bucket and group, a wrapper built with ``use_cuda_graph=True`` on static
  ``kv_indptr`` / ``kv_indices`` / ``kv_last_page_len`` buffers this builder owns (registered with the input
  audit, with both workspaces), planned for the all-padding capture batch before capture and re-planned
  before every replay, outside the graph. Padding rows have one token (``pad_seq_len``): FlashInfer's
  planner needs a last page of 1 to ``page_size`` tokens. Eager and graph plans both pin the FA2 kernels
  and turn split-KV off, so a graph replay computes each row as the eager step does;
* **FP8 pools** are handed over as ``float8_e4m3fn`` views of their bytes, with the layer's scales at ``run``.

Its fault switches are FlashInfer's forms of the catalog's graph-metadata bugs: a graph wrapper never re-planned
after capture (``skip_replan_before_replay``), a replay's page ids rebuilt in the eager buffer rather than the
graph-bound one (``indices_in_eager_buffer``), and the SWA prefill wrapper planned without its window
(``swa_prefill_plan_without_window``). The kernels need no float32 and heads of 64 and up: a float32 model or a
smaller head is an unsupported cell, naming the half-precision presets that run.

Every kernel call is the ``torch.library`` op of ``flashinfer_ops.py``, so both graph engines record it
and the audit sees its inputs. FlashInfer is imported only where a run needs its kernels (a CUDA pool):
on the CPU the op's dense stand-in computes the same attention over the same lists, which is how the
builders, the op and the graph path are tested without a GPU; the backend itself declares CUDA only.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import torch

from ..runspec import Device
from ..serving.batch import ForwardBatch
from ..serving.model import DTYPES, ModelSpec
from ..serving.pool import SUPPORTED_PAGE_SIZES, HybridSWAKVPool, in_bounds
from .base import AttentionBackend, AttentionBatch, AttentionImpl, AttentionMetadataBuilder, GraphSupport, KVLayout
from .flashinfer_ops import NO_WRAPPER, paged_attention, register_wrapper
from .page_table import build_page_table, swa_page_translation, translate_pages
from .paged_kv import PagedKVLayout, gather_page_ids, host_tensor, paged_kv_layout

# FlashInfer's documented recommendation for the float workspace (split-KV partials; plans pin split-KV
# off, so little of it is used); the int workspace holds a wrapper's plan, 8 MB as FlashInfer allocates it
_FLOAT_WORKSPACE_BYTES = 128 << 20
_INT_WORKSPACE_BYTES = 8 << 20
_KERNEL_DTYPES = (torch.bfloat16, torch.float16)
# the head sizes FlashInfer ships kernels for (and SGLang's models use); the library's float32 presets have 16 or 32
_KERNEL_HEAD_DIMS = (64, 128, 256)
_KERNEL_PRESETS = ("gpt-oss-mini-bf16", "gemma-mini-fp16")


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowGroup:
    """Layers that attend with one window over one pool: one FlashInfer wrapper, planned once per forward."""

    window: int | None
    """keys a query sees, its own included; None for full attention"""
    layers: tuple[int, ...]

    @property
    def swa(self) -> bool:
        """Whether the group reads the SWA pool."""
        return self.window is not None

    @property
    def window_left(self) -> int:
        """FlashInfer's inclusive left window: ``W - 1`` keys before the query, -1 for none."""
        return -1 if self.window is None else self.window - 1


def window_groups(model_spec: ModelSpec) -> tuple[WindowGroup, ...]:
    """The model's layers grouped by window, in the order the groups first appear."""
    by_window: dict[int | None, list[int]] = {}
    for layer_id in range(model_spec.num_layers):
        by_window.setdefault(model_spec.layer_window(layer_id), []).append(layer_id)
    return tuple(WindowGroup(window=w, layers=tuple(layers)) for w, layers in by_window.items())


@dataclass(slots=True, kw_only=True)
class PagedKV:
    """One window group's lists for one forward, as the op reads them."""

    indptr: torch.Tensor
    """[bs + 1] int32 CSR offsets into ``indices``"""
    indices: torch.Tensor
    """int32 page ids of the group's pool (a graph's whole static buffer: entries past ``indptr[-1]`` are stale)"""
    last_page_len: torch.Tensor
    """[bs] int32 tokens in each request's last page"""
    window_left: int
    int_workspace: torch.Tensor
    """the group's wrappers' plan memory (empty on the CPU)"""
    wrapper: int
    """the handle of the wrapper planned for these lists (``NO_WRAPPER`` on the CPU)"""


@dataclass(slots=True, kw_only=True)
class FlashInferMetadata:
    groups: tuple[PagedKV, ...]
    """by window group (``window_groups``)"""
    qo_indptr: torch.Tensor
    """[bs + 1] int32 offsets of each request's new tokens"""
    float_workspace: torch.Tensor
    max_kv_len: int
    """keys per query the CPU stand-in lays out: the page tables' width"""
    out_cache_loc_swa: torch.Tensor | None
    """[num_tokens] int32 SWA write locations computed once per forward (the ``metadata`` design)"""


@dataclass(slots=True, kw_only=True)
class _GraphLists:
    indptr: torch.Tensor
    indices: torch.Tensor
    last_page_len: torch.Tensor


def kernel_problems(model_spec: ModelSpec, kv_dtype: str, *, backend: str = "flashinfer") -> list[str]:
    """Why FlashInfer's kernels cannot run this model and pool; empty when they can."""
    dtype = DTYPES[model_spec.dtype]
    out = []
    if dtype not in _KERNEL_DTYPES:
        out.append(f"backend {backend}: FlashInfer has no {model_spec.dtype} kernels; the model needs dtype "
                   f"bfloat16 or float16 (a preset such as {' or '.join(_KERNEL_PRESETS)})")
    elif kv_dtype not in ("fp8_e4m3", model_spec.dtype):
        out.append(f"backend {backend}: FlashInfer reads a KV pool of the query's dtype ({model_spec.dtype}) or "
                   f"fp8_e4m3, not {kv_dtype}")
    if model_spec.head_dim not in _KERNEL_HEAD_DIMS:
        out.append(f"backend {backend}: FlashInfer's prebuilt kernels take head_dim "
                   f"{', '.join(map(str, _KERNEL_HEAD_DIMS))}, not {model_spec.head_dim}")
    return out


class _Planner:
    """FlashInfer's wrappers for one backend: it builds them, plans them outside any graph, names them."""

    def __init__(self, *, model_spec: ModelSpec, pool: HybridSWAKVPool, groups: tuple[WindowGroup, ...]) -> None:
        import flashinfer  # only a run on a GPU needs the kernels; the extra is optional

        self._flashinfer = flashinfer
        dev = pool.device
        self.float_workspace = torch.zeros(_FLOAT_WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
        # one plan memory per group: both groups' wrappers are planned before the forward's first layer runs,
        # while a group's own wrappers (eager, and every bucket's, re-planned before each replay) run in turn
        self.int_workspaces = tuple(torch.zeros(_INT_WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
                                    for _ in groups)
        self._groups = groups
        self._page_size = pool.page_size
        self._heads = (model_spec.num_heads, model_spec.num_kv_heads, model_spec.head_dim)
        q_dtype = DTYPES[model_spec.dtype]
        self._options = dict(
            q_data_type=q_dtype,
            kv_data_type=torch.float8_e4m3fn if pool.kv_dtype == "fp8_e4m3" else q_dtype,
            sm_scale=model_spec.head_dim**-0.5,
            # split-KV depends on the batch a plan sees (a padded bucket is not the eager batch): off, so a
            # graph replay and the eager step compute every row alike and can be compared
            disable_split_kv=True,
            non_blocking=True,
        )
        self._eager: dict[tuple[bool, int], tuple[Any, int]] = {}
        self._graph: dict[tuple[int, int], tuple[Any, int]] = {}

    def _own(self, wrapper: Any, group: int) -> tuple[Any, int]:
        wrapper.reset_workspace_buffer(self.float_workspace, self.int_workspaces[group])
        return wrapper, register_wrapper(wrapper)

    def plan_eager(self, group: int, *, decode: bool, qo_indptr: tuple[int, ...], layout: PagedKVLayout,
                   indices: torch.Tensor, window_left: int) -> int:
        """Plan the group's eager wrapper of this kind for the lists; its handle."""
        key = (decode, group)
        if key not in self._eager:
            fi = self._flashinfer
            cls = fi.BatchDecodeWithPagedKVCacheWrapper if decode else fi.BatchPrefillWithPagedKVCacheWrapper
            self._eager[key] = self._own(cls(self.float_workspace, "NHD", backend="fa2"), group)
        wrapper, handle = self._eager[key]
        self._plan(wrapper, decode=decode, qo_indptr=qo_indptr, layout=layout, indices=indices,
                   window_left=window_left)
        return handle

    def graph_wrapper(self, bs: int, group: int, lists: _GraphLists) -> int:
        """A decode wrapper of the ``bs`` graph bound to the static lists; its handle."""
        wrapper = self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.float_workspace, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=lists.indptr,
            paged_kv_indices_buffer=lists.indices, paged_kv_last_page_len_buffer=lists.last_page_len,
            backend="fa2")
        self._graph[(bs, group)] = self._own(wrapper, group)
        return self._graph[(bs, group)][1]

    def plan_graph(self, bs: int, group: int, *, layout: PagedKVLayout, indices: torch.Tensor) -> None:
        """Re-plan the ``bs`` graph's wrapper of the group (outside the graph, before it replays)."""
        wrapper, _ = self._graph[(bs, group)]
        self._plan(wrapper, decode=True, qo_indptr=(), layout=layout, indices=indices,
                   window_left=self._groups[group].window_left)

    def _plan(self, wrapper: Any, *, decode: bool, qo_indptr: tuple[int, ...], layout: PagedKVLayout,
              indices: torch.Tensor, window_left: int) -> None:
        num_qo_heads, num_kv_heads, head_dim = self._heads
        indptr, last_page_len = host_tensor(layout.indptr), host_tensor(layout.last_page_len)
        if decode:
            wrapper.plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, self._page_size,
                         window_left=window_left, **self._options)
        else:
            wrapper.plan(host_tensor(qo_indptr), indptr, indices, last_page_len, num_qo_heads, num_kv_heads,
                         head_dim, self._page_size, causal=True, window_left=window_left, **self._options)


class FlashInferMetadataBuilder(AttentionMetadataBuilder):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.width = int(self.req_to_token.shape[1])
        self.groups = window_groups(self.model_spec)
        for group in self.groups:
            wrong = [layer for layer in group.layers if self.pool.is_swa_layer(layer) != group.swa]
            if wrong:
                raise ValueError(f"layers {wrong} have window {group.window} but the pool keeps them in the "
                                 f"{'full' if group.swa else 'SWA'} pool")
        p = self.pool.page_size
        self._pool_pages = {swa: (size // p, f"the {'SWA' if swa else 'full'} pool ({size // p} pages)")
                            for swa, size in ((True, self.pool.swa_size), (False, self.pool.full_size))}
        self._planner: _Planner | None = None
        if self.device.type == Device.CUDA:
            if problems := kernel_problems(self.model_spec, self.pool.kv_dtype):
                raise ValueError("; ".join(problems))
            self._planner = _Planner(model_spec=self.model_spec, pool=self.pool, groups=self.groups)
        empty = torch.zeros(0, dtype=torch.uint8, device=self.device)
        self._float_workspace = empty if self._planner is None else self._planner.float_workspace
        self._int_workspaces = ((empty,) * len(self.groups) if self._planner is None
                                else self._planner.int_workspaces)
        self._graph_metadata: dict[int, FlashInferMetadata] = {}

    # ---- the lists ----------------------------------------------------------------------------------
    def _lists(self, batch: AttentionBatch) -> list[tuple[PagedKVLayout, torch.Tensor]]:
        """Each group's layout (host) and ``kv_indices`` (device) for the batch."""
        p = batch.page_size
        pages = build_page_table(self.req_to_token, batch.req_pool_indices, batch.seq_lens, self.width, page_size=p)
        new_tokens = (1,) * batch.bs if batch.forward_mode.is_decode_like else batch.extend_seq_lens_cpu
        swa_pages: torch.Tensor | None = None
        out = []
        for group in self.groups:
            table = pages
            if group.swa:
                if swa_pages is None:
                    mapping = self.pool.full_to_swa_index_mapping
                    swa_pages = translate_pages(swa_page_translation(mapping, self.pool.full_size, page_size=p), pages)
                table = swa_pages
            layout = paged_kv_layout(batch.seq_lens_cpu, new_tokens, page_size=p, window=group.window)
            out.append((layout, in_bounds(gather_page_ids(table, layout), *self._pool_pages[group.swa])))
        return out

    @staticmethod
    def _qo_indptr(batch: AttentionBatch) -> tuple[int, ...]:
        per_request = (1,) * batch.bs if batch.forward_mode.is_decode_like else batch.extend_seq_lens_cpu
        out = [0]
        for n in per_request:
            out.append(out[-1] + n)
        return tuple(out)

    # ---- eager --------------------------------------------------------------------------------------
    def build(self, batch: AttentionBatch) -> FlashInferMetadata:
        dev, decode = self.device, batch.forward_mode.is_decode_like
        qo_indptr = self._qo_indptr(batch)
        groups = []
        for i, (group, (layout, indices)) in enumerate(zip(self.groups, self._lists(batch), strict=True)):
            window_left = group.window_left
            if group.swa and not decode and "swa_prefill_plan_without_window" in self.faults:
                # the prefill plan leaves window_left at its default and the layers run what was planned
                window_left = -1
            handle = NO_WRAPPER if self._planner is None else self._planner.plan_eager(
                i, decode=decode, qo_indptr=qo_indptr, layout=layout, indices=indices, window_left=window_left)
            groups.append(PagedKV(indptr=host_tensor(layout.indptr).to(dev), indices=indices,
                                  last_page_len=host_tensor(layout.last_page_len).to(dev),
                                  window_left=window_left, int_workspace=self._int_workspaces[i],
                                  wrapper=handle))
        return FlashInferMetadata(groups=tuple(groups), qo_indptr=host_tensor(qo_indptr).to(dev),
                                  float_workspace=self._float_workspace, max_kv_len=self.width,
                                  out_cache_loc_swa=self.pool.translate_loc_from_full_to_swa(batch.out_cache_loc))

    # ---- graphs -------------------------------------------------------------------------------------
    def init_graph_state(self, max_bs: int) -> None:
        dev = self.device
        pages_per_request = -(-self.width // self.pool.page_size)
        self._cg_lists = tuple(
            _GraphLists(indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=dev),
                        indices=torch.zeros(max_bs * pages_per_request, dtype=torch.int32, device=dev),
                        last_page_len=torch.ones(max_bs, dtype=torch.int32, device=dev))
            for _ in self.groups)
        # the eager path's index buffers, which the indices_in_eager_buffer fault refreshes instead
        self._eager_indices = (tuple(torch.zeros_like(g.indices) for g in self._cg_lists)
                               if "indices_in_eager_buffer" in self.faults else ())
        self._cg_qo_indptr = torch.arange(max_bs + 1, dtype=torch.int32, device=dev)  # one token per row
        self._cg_swa_loc = torch.zeros(max_bs, dtype=torch.int32, device=dev)

    def static_tensors(self) -> list[torch.Tensor]:
        lists = [t for group in self._cg_lists for t in (group.indptr, group.indices, group.last_page_len)]
        workspaces = [w for w in (self._float_workspace, *self._int_workspaces) if w.numel()]
        return [*lists, self._cg_qo_indptr, self._cg_swa_loc, *workspaces]

    def build_for_graph_capture(self, batch: AttentionBatch) -> FlashInferMetadata:
        bs = batch.bs
        views = [_GraphLists(indptr=g.indptr[: bs + 1], indices=g.indices, last_page_len=g.last_page_len[:bs])
                 for g in self._cg_lists]
        handles = [NO_WRAPPER if self._planner is None else self._planner.graph_wrapper(bs, i, view)
                   for i, view in enumerate(views)]
        # planned for the capture batch (every row padding) before capture, as every replay is planned before it runs
        self._fill_graph_buffers(batch, replay=False)
        groups = tuple(PagedKV(indptr=view.indptr, indices=view.indices, last_page_len=view.last_page_len,
                               window_left=group.window_left, int_workspace=self._int_workspaces[i], wrapper=handle)
                       for i, (group, view, handle) in enumerate(zip(self.groups, views, handles, strict=True)))
        md = self._graph_metadata[bs] = FlashInferMetadata(
            groups=groups, qo_indptr=self._cg_qo_indptr[: bs + 1], float_workspace=self._float_workspace,
            max_kv_len=self.width, out_cache_loc_swa=self._cg_swa_loc[:bs])
        return md

    def refresh_for_graph_replay(self, batch: AttentionBatch) -> FlashInferMetadata:
        self._fill_graph_buffers(batch, replay=True)
        return self._graph_metadata[batch.bs]

    def _fill_graph_buffers(self, batch: AttentionBatch, *, replay: bool) -> None:
        """Copy the batch's lists into the static buffers and plan the bucket's wrappers, outside the graph."""
        bs, num_real, out_cache_loc = batch.bs, batch.num_real, batch.out_cache_loc
        for i, (static, (layout, indices)) in enumerate(zip(self._cg_lists, self._lists(batch), strict=True)):
            static.indptr[: bs + 1].copy_(host_tensor(layout.indptr))
            # the page ids are built in the graph-bound buffer, and the plan is handed that buffer (FlashInfer's
            # plan copies its indices argument into the buffer the wrapper was built on, here onto itself)
            target = self._eager_indices[i] if replay and "indices_in_eager_buffer" in self.faults else static.indices
            target[: layout.num_pages].copy_(indices)
            static.last_page_len[:bs].copy_(host_tensor(layout.last_page_len))
            if self._planner is not None and not (replay and "skip_replan_before_replay" in self.faults):
                self._planner.plan_graph(bs, i, layout=layout, indices=static.indices[: layout.num_pages])
        self._refill_swa_loc(self._cg_swa_loc, out_cache_loc, num_real)


class FlashInferImpl(AttentionImpl):
    """Attention through the paged-attention op: FlashInfer's kernel on a GPU, its dense stand-in on the CPU."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.num_heads = self.model_spec.num_heads
        self.scale = self.head_dim**-0.5
        self._group_of = {layer: i for i, g in enumerate(window_groups(self.model_spec)) for layer in g.layers}
        self._fp8 = self.pool.kv_dtype == "fp8_e4m3"

    def _pages(self, buf: torch.Tensor) -> torch.Tensor:
        """[pages, page_size, Hkv, D] view of a pool buffer (NHD pages), FP8 bytes as ``float8_e4m3fn``."""
        p = self.pool.page_size
        paged = buf.view(buf.shape[0] // p, p, *buf.shape[1:])
        return paged.view(torch.float8_e4m3fn) if self._fp8 else paged

    def attend(
        self, layer_id: int, q: torch.Tensor, forward_batch: ForwardBatch, metadata: FlashInferMetadata
    ) -> torch.Tensor:
        md = metadata
        paged = md.groups[self._group_of[layer_id]]
        k_buf, v_buf = self.pool.get_kv_buffer(layer_id)
        k_scale, v_scale = self.pool.kv_scales[layer_id] if self._fp8 else (1.0, 1.0)
        t = q.shape[0]
        q3 = q.view(t, self.num_heads, self.head_dim)
        out = torch.empty_like(q3)
        paged_attention(out, q3, self._pages(k_buf), self._pages(v_buf), md.qo_indptr, paged.indptr, paged.indices,
                        paged.last_page_len, paged.int_workspace, md.float_workspace, paged.wrapper,
                        paged.window_left, self.scale, float(k_scale), md.max_kv_len)
        if v_scale != 1.0:
            # outside the op, as FlashInfer scales after its kernel: the op's own work stays out of sight
            out.mul_(v_scale)
        return out.view(t, -1)


def missing_requirements(backend: str = "flashinfer") -> tuple[str, ...]:
    """What this machine lacks to run FlashInfer's kernels (for ``backend``, which runs them); empty when it
    has both."""
    out = []
    if importlib.util.find_spec("flashinfer") is None:
        out.append(f"backend {backend} needs flashinfer-python, the optional extra gpu (make test-gpu, or "
                   "pip install -e '.[gpu]')")
    if not torch.cuda.is_available():
        out.append(f"backend {backend} needs a CUDA GPU; this machine has none")
    return tuple(out)


class FlashInferBackend(AttentionBackend):
    """FlashInfer's paged prefill and decode kernels; CUDA only, decode batches captured whole."""

    name = "flashinfer"
    # decode wrappers are captured per bucket on static lists; a prefill plan is sized from the extend
    # lengths on the host, so prefill graphs keep attention an island
    graph_support = GraphSupport.DECODE_ONLY
    devices = frozenset({Device.CUDA})
    # the kernels take any page size; these are the ones the pool supports and the list builders are tested at
    page_sizes = frozenset(SUPPORTED_PAGE_SIZES)
    kv_layouts = frozenset({KVLayout.NHD})
    known_faults = frozenset({"skip_replan_before_replay", "indices_in_eager_buffer", "swa_prefill_plan_without_window"})
    pad_seq_len = 1
    builder_cls = FlashInferMetadataBuilder
    impl_cls = FlashInferImpl

    @classmethod
    def unsupported(cls, **case) -> tuple[str, ...]:
        """The declaration's reasons, the model and pool its kernels cannot take, and what this machine lacks
        (FlashInfer, a GPU)."""
        model = case.get("model")
        kernels = () if model is None else kernel_problems(model, case.get("kv_dtype", "float32"), backend=cls.name)
        return (*super().unsupported(**case), *kernels, *missing_requirements())

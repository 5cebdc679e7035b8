"""The installed SGLang's SWA memory layer as a serving stack: its ``SWAKVPool``, ``SWATokenToKVPoolAllocator``
and ``ReqToTokenPool``, built on the CPU, behind the operations the harness uses.

Every slot, request row, free and translation is SGLang's own. What the harness's designs and backends see
as ``pool`` is the miniature's pool class over SGLang's buffers: its K/V tensors *are* the real pool's
per-layer buffers and its ``full_to_swa_index_mapping`` *is* the real allocator's, so whatever a design
writes lands in the real pool, and the snapshots and the diff read the real pool slot by slot, as SGLang's two
KV groups, ``full`` and ``swa`` (``serving.stack.HybridSWAStack``). Backends are constructed with the stack;
a design, handed only the pool, finds the stack through the view (``installed_stack``).

Units agree once converted: SGLang's ``size`` excludes the dummy page and its buffers have ``size +
page_size`` rows, which is the harness's ``full_size`` (dummy included). A pool's ``free_order`` must be
the order SGLang reuses in (``SGLANG_FREE_ORDER``); another order, FP8 pools and prefix caches are not
expressible against 0.5.23 through this stack and ``unsupported()`` says why.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from ..serving.pool import HybridSWAKVPool, PoolExhausted, ReqToTokenPool
from ..serving.stack import HybridSWAStack, ServingStack, StackSpec
from .installed import SGLangAPI, load

SGLANG_FREE_ORDER = {1: "fifo"}
"""the order SGLang 0.5.23 (``need_sort`` off) reuses freed slots in, by page size: at pages of one token freed
slots join the tail of the free list; with pages, freed pages join its head (``lifo``)"""


def free_order(page_size: int) -> str:
    """The harness's name for the order SGLang reuses freed slots (pages) in at ``page_size``."""
    return SGLANG_FREE_ORDER.get(page_size, "lifo")


def unsupported(spec: StackSpec) -> str | None:
    """Why ``spec`` cannot run on the installed SGLang through this stack, or None when it can."""
    pool = spec.pool
    if pool.kv_dtype == "fp8_e4m3":
        return "fp8 pools: SGLang's FP8 MHA pool quantizes in its own set_kv_buffer, which the harness's fused " \
               "write designs do not go through; not adapted"
    if pool.free_order != free_order(pool.page_size):
        return f"pool.free_order {pool.free_order!r}: SGLang 0.5.23 reuses freed slots " \
               f"{free_order(pool.page_size)!r} at page_size {pool.page_size} (need_sort orders only when a pool " \
               "runs short)"
    if not any(spec.layer_is_swa) or all(spec.layer_is_swa):
        return "models of one layer kind: the adapter builds SWAKVPool for hybrid models (full and sliding-window " \
               "layers) only"
    return None


class InstalledPoolView(HybridSWAKVPool):
    """The miniature's pool surface over SGLang's buffers, as the stack hands it to backends and designs;
    ``installed`` is the stack it belongs to, for a design (handed only the pool) that builds SGLang's own
    objects from it."""

    installed: SGLangStack


def installed_stack(pool: object) -> SGLangStack:
    """The SGLang stack whose view ``pool`` is: what a design over the installed pool (``designs.py``) builds
    SGLang's own objects from. ValueError for a pool of another stack."""
    if not isinstance(pool, InstalledPoolView):
        raise ValueError(_NEEDS_SGLANG)
    return pool.installed


def require_installed(stack: ServingStack) -> SGLangStack:
    """``stack`` as the SGLang stack a backend over the installed pool (``backend.py``) runs on; ValueError
    for another stack."""
    if not isinstance(stack, SGLangStack):
        raise ValueError(_NEEDS_SGLANG)
    return stack


_NEEDS_SGLANG = ("this backend runs the installed SGLang's code over its own pool: it needs [serving] "
                 "stack = \"sglang\" in the scenario (the pool given is another stack's)")


class _RealRows(ReqToTokenPool):
    """The harness's request-row view of SGLang's ``ReqToTokenPool``: the same ``req_to_token`` tensor,
    rows handed out and taken back by SGLang (highest free row first; a freed row is not zeroed there)."""

    def __init__(self, real: object) -> None:  # noqa: D107 - no ReqToTokenPool.__init__: the table is SGLang's
        self.real = real
        self.req_to_token = real.req_to_token  # type: ignore[attr-defined]
        self.max_context_len = real.max_context_len  # type: ignore[attr-defined]

    def alloc(self) -> int:
        rows = self.real.alloc_rows(1)  # type: ignore[attr-defined]
        if rows is None:
            raise PoolExhausted("max_running_requests", "req_to_token rows: none free in SGLang's ReqToTokenPool")
        return int(rows[0])

    def free(self, row: int) -> None:
        self.real.free_rows([row])  # type: ignore[attr-defined]


class SGLangStack(HybridSWAStack):
    """SGLang 0.5.23's pool, allocator and request rows (``installed.SUPPORTED_VERSION``): SGLang's two
    groups, ``full`` and ``swa``."""

    name = "sglang"
    # SGLang's own backends write through SGLang's set_kv_buffer, which keeps no harness write log
    keeps_write_log = False

    def __init__(self, *, api: SGLangAPI, spec: StackSpec, kv_pool: object, allocator: object,
                 rows: _RealRows, view: InstalledPoolView) -> None:
        self.api = api
        self.spec = spec
        self.kv_pool = kv_pool
        """SGLang's ``SWAKVPool``"""
        self.allocator = allocator
        """SGLang's ``SWATokenToKVPoolAllocator``"""
        self.req_to_token_pool = rows
        self.pool = view
        self.groups = self.kv_groups(spec)
        view.installed = self

    @classmethod
    def build(cls, spec: StackSpec) -> SGLangStack:
        reason = unsupported(spec)
        if reason is not None:
            raise ValueError(f"the SGLang stack cannot run this pool: {reason}")
        api = load()
        p = spec.pool.page_size
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[spec.pool.kv_dtype]
        swa_ids = [i for i, swa in enumerate(spec.layer_is_swa) if swa]
        full_ids = [i for i, swa in enumerate(spec.layer_is_swa) if not swa]
        kv_pool = api.SWAKVPool(
            size=spec.pool.full_size - p, size_swa=spec.pool.swa_size - p, page_size=p, dtype=dtype,
            head_num=spec.num_kv_heads, head_dim=spec.head_dim, swa_attention_layer_ids=swa_ids,
            full_attention_layer_ids=full_ids, device=spec.device, enable_memory_saver=False,
        )
        allocator = api.SWATokenToKVPoolAllocator(
            size=spec.pool.full_size - p, size_swa=spec.pool.swa_size - p, page_size=p, dtype=dtype,
            device=spec.device, kvcache=kv_pool, need_sort=False,
        )
        real_rows = api.ReqToTokenPool(size=spec.pool.max_running_requests, max_context_len=spec.pool.max_context_len,
                                       device=spec.device, enable_memory_saver=False)
        view = InstalledPoolView(spec=spec.pool, layer_is_swa=spec.layer_is_swa, num_kv_heads=spec.num_kv_heads,
                               head_dim=spec.head_dim, kv_scales=spec.kv_scales, device=spec.device)
        full, swa = kv_pool.full_kv_pool, kv_pool.swa_kv_pool
        view.full_k_buffer, view.full_v_buffer = list(full.k_buffer), list(full.v_buffer)
        view.swa_k_buffer, view.swa_v_buffer = list(swa.k_buffer), list(swa.v_buffer)
        view.full_to_swa_index_mapping = allocator.full_to_swa_index_mapping
        return cls(api=api, spec=spec, kv_pool=kv_pool, allocator=allocator, rows=_RealRows(real_rows), view=view)

    # ---- request rows ----------------------------------------------------------------------------------
    def alloc_req_row(self) -> int:
        return self.req_to_token_pool.alloc()

    def free_req_row(self, row: int) -> None:
        self.req_to_token_pool.free(row)

    def write_req_to_token(self, row: int, start: int, slots: torch.Tensor) -> None:
        end = start + slots.numel()
        if end > self.req_to_token_pool.max_context_len:
            raise PoolExhausted("max_context_len", f"req_to_token: request needs {end} positions, max_context_len "
                                                   f"is {self.req_to_token_pool.max_context_len}")
        self.req_to_token_pool.real.write((row, slice(start, end)), slots.to(torch.int32))

    # ---- token slots -----------------------------------------------------------------------------------
    def alloc_extend(self, *, prefix_lens: Sequence[int], extend_lens: Sequence[int],
                     last_locs: Sequence[int]) -> torch.Tensor:
        p = self.page_size
        total = sum(extend_lens)
        device = self.device
        if p == 1:
            out = self.allocator.alloc(total)
        else:
            seq_lens = [pre + n for pre, n in zip(prefix_lens, extend_lens)]
            # a request without a prefix has no last slot: SGLang passes -1 (the mapping's trailing entry)
            last = torch.tensor([loc if pre else -1 for pre, loc in zip(prefix_lens, last_locs)], dtype=torch.int64,
                                device=device)
            seq = torch.tensor(seq_lens, dtype=torch.int64)
            if all(n == 1 for n in extend_lens) and all(prefix_lens):
                out = self.allocator.alloc_decode(seq.to(device), seq, last)
            else:
                pre = torch.tensor(list(prefix_lens), dtype=torch.int64)
                out = self.allocator.alloc_extend(pre.to(device), pre, seq.to(device), seq, last, total)
        if out is None:
            full_free, swa_free = self.allocator.full_available_size(), self.allocator.swa_available_size()
            field, what, free, size = (("swa_size", "SWA KV pool", swa_free, self.spec.pool.swa_size)
                                       if swa_free < total or swa_free <= full_free else
                                       ("full_size", "full KV pool", full_free, self.spec.pool.full_size))
            raise PoolExhausted(field, f"{what} (SGLang): need up to {total} slots, {free} free of {size - p}")
        # the harness's memo over this pool drops its entry whenever the mapping changes, as PR 25824's allocator
        # made it (0.5.23 has no memo of its own)
        self.pool.invalidate_translate_cache()
        return out.to(torch.int64)

    def free(self, full_slots: torch.Tensor) -> None:
        """A request's row leaves through ``free_kv_row_segments``, as SGLang frees a finished request: the
        positions its eviction already freed (a leading run, mapped to 0) go back full-side only."""
        if full_slots.numel() == 0:
            return
        full_slots = full_slots.to(torch.int64)
        swa = self._swa_pages(full_slots)
        mapped = (self.allocator.full_to_swa_index_mapping[full_slots] > 0).tolist()
        evicted = mapped.index(True) if True in mapped else len(mapped)
        self.api.free_kv_row_segments(self.allocator, [(full_slots, 0)], swa_evicted_seqlen=evicted)
        self.pool.invalidate_translate_cache()
        self._poison(full_pages=sorted(set((full_slots // self.page_size).tolist())), swa_pages=swa)

    def free_swa(self, full_slots: torch.Tensor) -> None:
        """Evict through ``free_swa_segment``, the call SGLang's eviction makes: the slots are a run of one
        request's positions from a page boundary (SGLang asserts that boundary)."""
        if full_slots.numel() == 0:
            return
        full_slots = full_slots.to(torch.int64)
        swa = self._swa_pages(full_slots)
        self.allocator.free_swa_segment(full_slots, start_pos=int(full_slots[0]) % self.page_size)
        self.pool.invalidate_translate_cache()
        self._poison(full_pages=[], swa_pages=swa)

    @contextlib.contextmanager
    def free_group(self) -> Iterator[None]:
        self.allocator.free_group_begin()
        try:
            yield
        finally:
            self.allocator.free_group_end()

    def translate(self, full_slots: torch.Tensor) -> torch.Tensor:
        return self.kv_pool.translate_loc_from_full_to_swa(full_slots.to(torch.int64)).to(torch.int32)

    # ---- what snapshots and checks read -----------------------------------------------------------------
    def hybrid_free_slots(self) -> tuple[frozenset[int], frozenset[int]]:
        return self._free_of(self.allocator.full_attn_allocator), self._free_of(self.allocator.swa_attn_allocator)

    # ---- internals -------------------------------------------------------------------------------------
    def _free_of(self, inner: object) -> frozenset[int]:
        p = self.page_size
        staged = getattr(inner, "release_pages", None)
        ids = [*inner.free_pages.tolist(), *(staged.tolist() if staged is not None else [])]  # type: ignore[attr-defined]
        return frozenset(int(i) * p + k for i in ids for k in range(p))

    def _swa_pages(self, full_slots: torch.Tensor) -> list[int]:
        swa = self.allocator.full_to_swa_index_mapping[full_slots]
        return sorted(set((swa[swa > 0] // self.page_size).tolist()))

    def _poison(self, *, full_pages: list[int], swa_pages: list[int]) -> None:
        if not self.spec.poison_freed:
            return
        p = self.page_size
        self.pool.poison_slots([pg * p + k for pg in full_pages for k in range(p)],
                               [pg * p + k for pg in swa_pages for k in range(p)])

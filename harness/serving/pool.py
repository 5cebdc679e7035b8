"""Hybrid sliding-window KV pool: a full pool and a smaller SWA pool, as SGLang's SWAKVPool keeps them.

Layout (drawn for page size 1, one row per token slot; with pages of P tokens, page k is slots kP .. kP+P-1
and page 0, slots 0 .. P-1, is the dummy page)::

    full pool   slot:  0 (dummy) | 1 | 2 | 3 | ... | full_size-1        <- full-attention layers
    SWA pool    slot:  0 (dummy) | 1 | 2 | ... | swa_size-1              <- sliding-window layers

    full_to_swa_index_mapping (length full_size + 1):
        index:  0    1    2    3   ...  full_size-1   full_size
        value:  0    s1   0    s3  ...  ...            -1
                ^ dummy  ^ evicted (SWA slot freed)    ^ trailing entry: index -1 maps to -1

Every token owns a full slot (``out_cache_loc``); while it is inside the window of a live request it also
owns an SWA slot, found by gathering through the mapping (``translate_loc_from_full_to_swa``). Padded rows
of a graph batch write to slot 0 of each pool, which is why slot 0 is never handed out.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

import torch

from .pool_spec import (  # noqa: F401 - the pool's vocabulary too
    FREE_ORDERS,
    KV_DTYPES,
    POOL_SIZE_LIMIT,
    SUPPORTED_PAGE_SIZES,
    PoolSpec,
)

# Poison is NaN with a payload arithmetic never produces, so "never written" and "computed NaN" differ.
# FP8 e4m3fn has no payload bits (NaN is S.1111.111): there poison is the negative NaN byte.
POISON_BITS = {torch.float32: (torch.int32, 0x7FC0BEEF), torch.bfloat16: (torch.int16, 0x7FCB),
               torch.float16: (torch.int16, 0x7E5B), torch.uint8: (torch.uint8, 0xFF)}


NEVER_WRITTEN = -1
"""a write-log entry (``HybridSWAKVPool.full_last_write``): nothing wrote the slot since it was poisoned"""


def poison_(buf: torch.Tensor) -> None:
    int_dtype, bits = POISON_BITS[buf.dtype]
    buf.view(int_dtype).fill_(bits)


def is_poison(row: torch.Tensor) -> bool:
    """Every element of ``row`` still holds the poison pattern."""
    int_dtype, bits = POISON_BITS[row.dtype]
    return bool((row.contiguous().view(int_dtype) == bits).all())


def storage_dtype(kv_dtype: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "fp8_e4m3": torch.uint8}[kv_dtype]


def quantize_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Scale and cast to e4m3, returned as the raw bytes the pool stores."""
    return (x.float() / scale).to(torch.float8_e4m3fn).view(torch.uint8)


def quantize_fp8_fused(x: torch.Tensor, inv_scale: float) -> torch.Tensor:
    """The fused write kernel's quantization: times the reciprocal scale, which the kernel takes precomputed,
    rather than divided by the scale. Rounding may differ from ``quantize_fp8`` by one e4m3 step."""
    return (x.float() * inv_scale).to(torch.float8_e4m3fn).view(torch.uint8)


def dequantize_fp8(raw: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    return (raw.view(torch.float8_e4m3fn).float() * scale).to(dtype)


def in_bounds(index: torch.Tensor, size: int, what: str) -> torch.Tensor:
    """``index`` itself, once every entry addresses one of ``size`` rows of ``what`` (Python-style negative
    indices included); otherwise it fails as a GPU kernel does, with a device-side assert, saying so.
    ``what`` names the buffer and its size, e.g. "the SWA pool (40 slots)".

    A CPU index past a buffer raises a bare IndexError, a GPU's kernel asserts on the device (an ``error``
    verdict either way, but only the assert is what a run on a GPU reports). The check is graph-capturable:
    on a GPU inside a capture it is the device assert itself; outside one it is checked on the host, so the
    failing run does not leave the CUDA context unusable for the runs after it.
    """
    message = f"device-side assert: out-of-bounds index into {what}; a GPU kernel reports 'device-side assert triggered'"
    inside = ((index < size) & (index >= -size)).all()
    if index.is_cuda and not torch.cuda.is_current_stream_capturing():
        if not bool(inside):
            raise RuntimeError(message)
    else:
        torch._assert_async(inside, message)
    return index


class DraftKVPool:
    """The draft model's own KV pool, as SGLang's EAGLE draft worker keeps it: a plain full-attention pool (every
    draft layer keeps every token) addressed by the *target's* full-pool slot ids, since the draft worker shares
    the target's allocator and ``req_to_token``. So it must hold at least the target's full pool; SGLang PR 17630
    fixed a draft pool sized by the token count before the hybrid SWA adjustment, below the full pool, whose
    draft writes ran past its end (an out-of-bounds index kernel assert).

    In the miniature the draft model is the target model, so a draft forward writes every layer's new K/V here
    as well as into the target's pools (the K/V the diff compares); its attention still reads the target's, and
    nothing reads this pool back. Slot 0 is the dummy slot padded rows write."""

    def __init__(self, *, size: int, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.size = size
        shape = (size, num_kv_heads, head_dim)
        self.k_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write the draft layer's K/V at ``loc``, the target's full-pool slots of the draft tokens."""
        loc = in_bounds(loc, self.size, f"the draft KV pool ({self.size} slots)")
        self.k_buffer[layer_id][loc] = k.to(self.k_buffer[layer_id].dtype)
        self.v_buffer[layer_id][loc] = v.to(self.v_buffer[layer_id].dtype)

    def buffers(self) -> list[torch.Tensor]:
        return [*self.k_buffer, *self.v_buffer]


def draft_pool_size(spec: PoolSpec, layer_is_swa: Sequence[bool], *, before_swa_adjustment: bool = False) -> int:
    """Slots of the draft model's pool next to a target pool of ``spec``. SGLang PR 17630's rule: never fewer than
    the target's full pool, whose slot ids the draft writes at. ``before_swa_adjustment``: the size before that
    fix, the token count the same KV memory holds when every target layer keeps every token (the count a pool
    configurator starts from before its hybrid SWA adjustment gives the full layers more), which is below the
    full pool whenever the SWA pool is smaller."""
    layers = len(layer_is_swa)
    n_swa = sum(1 for swa in layer_is_swa if swa)
    before = (spec.full_size * (layers - n_swa) + spec.swa_size * n_swa) // max(layers, 1)
    before -= before % spec.page_size
    return before if before_swa_adjustment else max(before, spec.full_size)


class HybridSWAKVPool:
    """K/V buffers of both pools, the full->SWA slot mapping and the stateful ``swa_loc`` shortcut."""

    def __init__(
        self,
        *,
        spec: PoolSpec,
        layer_is_swa: Sequence[bool],
        num_kv_heads: int,
        head_dim: int,
        kv_scales: Sequence[tuple[float, float]] | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        if spec.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {KV_DTYPES}, got {spec.kv_dtype!r}")
        self.spec = spec
        self.device = torch.device(device)
        self.kv_dtype = spec.kv_dtype
        self.store_dtype = storage_dtype(spec.kv_dtype)
        self.full_size = spec.full_size
        self.swa_size = spec.swa_size
        self.page_size = spec.page_size
        self.layers_mapping: dict[int, tuple[int, bool]] = {}
        n_full = n_swa = 0
        for layer_id, is_swa in enumerate(layer_is_swa):
            self.layers_mapping[layer_id] = (n_swa if is_swa else n_full, bool(is_swa))
            if is_swa:
                n_swa += 1
            else:
                n_full += 1
        shape = (num_kv_heads, head_dim)
        self.full_k_buffer = [self._alloc(self.full_size, shape) for _ in range(n_full)]
        self.full_v_buffer = [self._alloc(self.full_size, shape) for _ in range(n_full)]
        self.swa_k_buffer = [self._alloc(self.swa_size, shape) for _ in range(n_swa)]
        self.swa_v_buffer = [self._alloc(self.swa_size, shape) for _ in range(n_swa)]
        # The write log: per layer, the step that last wrote each slot since it was last poisoned (-1: not
        # since). It is written by a tensor op beside every K/V write, so graph replays keep it too (Python
        # does not run at replay), and it tells "written with bits equal to poison" (NaN payloads survive
        # arithmetic) from "never written".
        self.write_step = torch.full((1,), NEVER_WRITTEN, dtype=torch.int32, device=self.device)
        """the step the next writes are logged as (``begin_step``)"""
        self.full_last_write = [self._log(self.full_size) for _ in range(n_full)]
        self.swa_last_write = [self._log(self.swa_size) for _ in range(n_swa)]
        num_layers = len(layer_is_swa)
        self.kv_scales: list[tuple[float, float]] = (
            list(kv_scales) if kv_scales is not None else [(1.0, 1.0)] * num_layers
        )
        self.full_to_swa_index_mapping = torch.zeros(self.full_size + 1, dtype=torch.int64, device=self.device)
        self.full_to_swa_index_mapping[-1] = -1
        self.swa_loc: torch.Tensor | None = None
        self.draft: DraftKVPool | None = None
        """the draft model's own pool, in a run that speculates (``attach_draft_pool``)"""
        self.memoize_reads = False
        """the read path's page-table translations go through the memo too (``translate_for_read``), as they did
        in SGLang PR 25824's pool, where every caller of the translation shared its one cached entry; a run of the
        ``memoized`` design turns it on"""
        self._memo_key: tuple[int, int] | None = None
        self._memo_value: torch.Tensor | None = None

    def _alloc(self, size: int, shape: tuple[int, int]) -> torch.Tensor:
        return torch.zeros((size, *shape), dtype=self.store_dtype, device=self.device)

    def _log(self, size: int) -> torch.Tensor:
        return torch.full((size,), NEVER_WRITTEN, dtype=torch.int32, device=self.device)

    # ---- write log --------------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """Log the writes from now on as step ``step`` (in place: captured graphs read this tensor)."""
        self.write_step.fill_(step)

    def log_write(self, layer_id: int, loc: torch.Tensor) -> None:
        """Record that the layer's K/V rows at ``loc`` (its own pool's slots) were written in this step."""
        index, is_swa = self.layers_mapping[layer_id]
        (self.swa_last_write if is_swa else self.full_last_write)[index][loc] = self.write_step

    # ---- location mapping -------------------------------------------------------------------------
    def translate_loc_from_full_to_swa(self, locs: torch.Tensor) -> torch.Tensor:
        """Gather SWA slots for full-pool slots; -1 maps to -1, evicted or dummy slots to 0."""
        return self.full_to_swa_index_mapping[locs.long()].to(torch.int32)

    def translate_memoized(self, locs: torch.Tensor) -> torch.Tensor:
        """Translation cached on (storage pointer, numel), as SGLang PR 25824 did; valid until invalidated.

        One entry for every caller, the write path's and (with ``memoize_reads``) the read path's: a translation
        of another key replaces it. The key is the storage's address, not the view's: the row views of one tensor
        (a draft's step rows of ``out_cache_loc``, the step backends' rows of one page-table buffer) share it, so
        only an invalidation between them keeps one from being served the translation of another."""
        key = (locs.untyped_storage().data_ptr(), locs.numel())
        if key != self._memo_key or self._memo_value is None:
            self._memo_key = key
            self._memo_value = self.translate_loc_from_full_to_swa(locs)
        return self._memo_value

    def translate_for_read(self, locs: torch.Tensor) -> torch.Tensor:
        """The read path's translation (a backend's SWA page table from the full one): through the memo when
        ``memoize_reads`` is on, else translated afresh."""
        if self.memoize_reads:
            return self.translate_memoized(locs)
        return self.translate_loc_from_full_to_swa(locs)

    def invalidate_translate_cache(self) -> None:
        """Drop the memo. SGLang PR 25824 calls it once per forward (the model runner, every graph runner before
        each metadata init and at the top of each captured forward) and from the allocator whenever it changes
        the mapping; a path that forgets it serves another batch's locations."""
        self._memo_key = None
        self._memo_value = None

    def set_swa_loc(self, loc: torch.Tensor | None) -> None:
        self.swa_loc = loc

    # ---- buffers ----------------------------------------------------------------------------------
    def is_swa_layer(self, layer_id: int) -> bool:
        return self.layers_mapping[layer_id][1]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        index, is_swa = self.layers_mapping[layer_id]
        return (self.swa_k_buffer if is_swa else self.full_k_buffer)[index]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        index, is_swa = self.layers_mapping[layer_id]
        return (self.swa_v_buffer if is_swa else self.full_v_buffer)[index]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write K/V rows at ``loc``, already resolved to the layer's own pool (SWA slots for SWA layers)."""
        k_buf, v_buf = self.get_kv_buffer(layer_id)
        if self.kv_dtype == "fp8_e4m3":
            k_scale, v_scale = self.kv_scales[layer_id]
            k = quantize_fp8(k, k_scale)
            v = quantize_fp8(v, v_scale)
        else:
            k = k.to(self.store_dtype)
            v = v.to(self.store_dtype)
        # index_put_ with a Python-style negative index wraps to the last slot: vLLM issue 43810.
        k_buf[loc] = k
        v_buf[loc] = v
        self.log_write(layer_id, loc)

    def read_kv(self, layer_id: int, slots: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather K/V rows at ``slots`` (any shape) in the compute dtype, dequantizing FP8."""
        k_buf, v_buf = self.get_kv_buffer(layer_id)
        k = k_buf[slots]
        v = v_buf[slots]
        if self.kv_dtype == "fp8_e4m3":
            k_scale, v_scale = self.kv_scales[layer_id]
            return dequantize_fp8(k, k_scale, dtype), dequantize_fp8(v, v_scale, dtype)
        return k.to(dtype), v.to(dtype)

    def attach_draft_pool(self, size: int, *, num_layers: int, dtype: torch.dtype) -> DraftKVPool:
        """Give the pool its draft model's pool of ``size`` slots (``draft_pool_size``), K/V rows like the target's."""
        row = (self.full_k_buffer or self.swa_k_buffer)[0].shape[1:]
        self.draft = DraftKVPool(size=size, num_layers=num_layers, num_kv_heads=row[0], head_dim=row[1], dtype=dtype,
                                 device=self.device)
        return self.draft

    def buffers(self) -> list[torch.Tensor]:
        """Every tensor the pool owns, for registering as graph inputs (the draft pool's too)."""
        return [
            *self.full_k_buffer,
            *self.full_v_buffer,
            *self.swa_k_buffer,
            *self.swa_v_buffer,
            *self.full_last_write,
            *self.swa_last_write,
            self.write_step,
            self.full_to_swa_index_mapping,
            *(self.draft.buffers() if self.draft is not None else ()),
        ]

    def poison_slots(self, full_slots: list[int], swa_slots: list[int]) -> None:
        """Re-poison freed slots: a correct run never reads them again, so stale reads show as poison."""
        for slots, buffers, logs in ((full_slots, (*self.full_k_buffer, *self.full_v_buffer), self.full_last_write),
                                     (swa_slots, (*self.swa_k_buffer, *self.swa_v_buffer), self.swa_last_write)):
            if slots:
                index = torch.tensor(slots, dtype=torch.int64, device=self.device)
                for buf in buffers:
                    rows = buf.new_empty((len(slots), *buf.shape[1:]))
                    poison_(rows)
                    buf[index] = rows
                for log in logs:
                    log[index] = NEVER_WRITTEN

    def poison(self) -> None:
        """Fill every slot but the dummy page with NaN so that slots a run never wrote show up as unwritten.

        The dummy page stays zero: masked attention still multiplies its rows by zero weights (a page table
        reads whole pages, the dummy page for every column past a request's length), and a NaN there would
        leak into every padded read (that leak is what the pad_seq_len_zero fault provokes).
        """
        p = self.page_size
        for buf in (*self.full_k_buffer, *self.full_v_buffer, *self.swa_k_buffer, *self.swa_v_buffer):
            poison_(buf[p:])
            buf[:p] = 0
        for log in (*self.full_last_write, *self.swa_last_write):
            log.fill_(NEVER_WRITTEN)


class PoolExhausted(RuntimeError):
    """The timeline needs more of a pool than the pool spec provides.

    ``field`` names the ``PoolSpec`` field to raise, so a caller can point at the scenario key without
    reading the message.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(field, message)
        self.field = field
        self.message = message

    def __str__(self) -> str:
        return self.message


class FreeList:
    """Free ids (slots or pages) in the order they are handed out; id 0 is the reserved dummy, never free.

    ``unit`` is how many token slots one id stands for (the page size), so that messages count slots.
    """

    def __init__(self, size: int, what: str, field: str, *, unit: int = 1, order: str = "lowest") -> None:
        if order not in FREE_ORDERS:
            raise ValueError(f"{what}: free order must be one of {FREE_ORDERS}, got {order!r}")
        self._free = list(range(1, size))
        self._unit = unit
        self._order = order
        self._capacity = (size - 1) * unit
        self._what = what
        self._field = field
        self._held: list[int] | None = None

    def __len__(self) -> int:
        return len(self._free)

    def __iter__(self):
        return iter(self._free)

    def take(self, n: int) -> list[int]:
        if n > len(self._free):
            raise PoolExhausted(
                self._field,
                f"{self._what}: need {n * self._unit} slots, {len(self._free) * self._unit} free of {self._capacity}",
            )
        taken, self._free = self._free[:n], self._free[n:]
        return taken

    def hold(self) -> None:
        """Until ``release_held``, ids given back wait, in the order given (a group of frees)."""
        self._held = []

    def release_held(self) -> None:
        """The held ids go back in one give-back, in the order they were given."""
        held, self._held = self._held, None
        if held:
            self.give_back(held)

    def give_back(self, ids: list[int]) -> None:
        for i in ids:
            if i <= 0:
                raise ValueError(f"{self._what}: cannot free reserved slot {i * self._unit}")
        if self._held is not None:
            self._held.extend(ids)
            return
        if self._order == "lowest":
            for i in ids:
                bisect.insort(self._free, i)
        elif self._order == "fifo":
            self._free.extend(ids)
        else:
            self._free[:0] = ids


class ReqToTokenPool:
    """``req_to_token[req_pool_index, position] -> full-pool slot``; row 0 is the dummy row padded rows use."""

    def __init__(self, *, max_running_requests: int, max_context_len: int, device: torch.device | str = "cpu"):
        self.req_to_token = torch.zeros(
            (max_running_requests + 1, max_context_len), dtype=torch.int32, device=device
        )
        self.max_context_len = max_context_len
        self._rows = FreeList(max_running_requests + 1, "req_to_token rows", "max_running_requests")

    def alloc(self) -> int:
        return self._rows.take(1)[0]

    def free(self, row: int) -> None:
        self.req_to_token[row] = 0
        self._rows.give_back([row])

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        end = start + slots.numel()
        if end > self.max_context_len:
            raise PoolExhausted(
                "max_context_len", f"req_to_token: request needs {end} positions, max_context_len is {self.max_context_len}"
            )
        self.req_to_token[row, start:end] = slots.to(torch.int32)

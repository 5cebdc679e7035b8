"""A finding against SGLang 0.5.23: ``TorchNativeAttnBackend`` writes sliding-window layers at translated
(SWA) locations but reads them through ``req_to_token``'s full-pool ids.

``init_forward_metadata`` translates ``out_cache_loc`` into ``swa_out_cache_loc`` and the write goes through
``KVWriteLoc(loc, swa_loc)``, so the K/V of an SWA layer lands at SWA slots. The reads do not translate:
``_run_sdpa_forward_decode`` (and ``_run_sdpa_forward_extend``) take ``req_to_token[row, :seq_len]``, full-pool
slots, and index the layer's key and value buffers with them, and for an SWA layer those buffers are the
SWA pool's. While the mapping is the identity (a fresh pool, no eviction yet) nothing shows. Once it is not,
a full id past the SWA pool's rows raises ``IndexError`` and an id inside it reads another token's K/V, or a
freed slot's, with no error.

``run_decode`` drives that on the real code: the installed pool and allocator, a real eviction free, real
``RadixAttention`` over ``TorchNativeAttnBackend``, and a hand-built decode ``ForwardBatch``, and compares the
layer's output with attention over the request's own keys in the window.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch

from .installed import load

WINDOW = 4
"""keys a query sees, its own included (SGLang's ``sliding_window_size`` is one less)"""
_HEADS, _HEAD_DIM = 1, 8


CASES = ("identity", "in_range", "out_of_range")
"""how request a's window keys sit in the SWA pool when it decodes: at the same ids as in the full pool; at
other ids, all below the SWA pool's size; or at other ids with a full id past the SWA pool"""


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeRead:
    """One decode step of request ``a`` through the installed torch-native backend."""

    case: str
    identity: bool
    """the query's window keys sit at the same ids in both pools"""
    error: str | None
    """what the backend raised, if anything"""
    max_abs_err: float | None
    """largest difference from attention over the request's own window keys (None when it raised)"""


def run_decode(case: str) -> DecodeRead:
    """Prefill request a (10 tokens) and b, then decode one token of a, on the installed SGLang.

    ``identity``: a fresh pool, nothing evicted. ``in_range`` (16 slots of each kind): a's first 6 tokens
    leave the window, b (4 tokens) finishes, a decodes two tokens into the last fresh slots, and its next token
    gets full slot 11 but SWA slot 1 (free lists are first in, first out): every full id a's row holds is
    below 17, so the read returns other rows silently. ``out_of_range`` (32 full, 16 SWA, b of 6): a's first 5
    and b's first token leave the window, and a's next token gets full slot 17, SWA slot 1: full id 17 indexes
    a 17-row SWA buffer."""
    if case not in CASES:
        raise ValueError(f"case: expected one of {CASES}, got {case!r}")
    api = load()
    torch.manual_seed(0)
    size, size_swa, b_len = {"identity": (16, 16, 4), "in_range": (16, 16, 4), "out_of_range": (32, 16, 6)}[case]
    kv_pool = api.SWAKVPool(size=size, size_swa=size_swa, page_size=1, dtype=torch.float32, head_num=_HEADS,
                            head_dim=_HEAD_DIM, swa_attention_layer_ids=[0], full_attention_layer_ids=[1],
                            device="cpu", enable_memory_saver=False)
    alloc = api.SWATokenToKVPoolAllocator(size=size, size_swa=size_swa, page_size=1, dtype=torch.float32,
                                          device="cpu", kvcache=kv_pool, need_sort=False)
    rows = api.ReqToTokenPool(size=4, max_context_len=32, device="cpu", enable_memory_saver=False)
    row_a, row_b = rows.alloc_rows(2)
    layer = api.RadixAttention(_HEADS, _HEAD_DIM, scaling=_HEAD_DIM ** -0.5, num_kv_heads=_HEADS, layer_id=0,
                               sliding_window_size=WINDOW - 1)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    slots: dict[int, list[int]] = {row_a: [], row_b: []}

    def write(row: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        start = len(slots[row])
        rows.write((row, slice(start, start + len(loc))), loc.to(torch.int32))
        slots[row].extend(loc.tolist())
        if k.numel():
            # the write seam every 0.5.23 backend uses: SWA layers need the translated ids beside the full ones
            kv_pool.set_kv_buffer(layer, api.KVWriteLoc(loc, kv_pool.translate_loc_from_full_to_swa(loc)), k, v)

    def prefill(row: int, n: int) -> None:
        k, v = torch.randn(n, _HEADS, _HEAD_DIM), torch.randn(n, _HEADS, _HEAD_DIM)
        write(row, alloc.alloc(n), k, v)
        if row == row_a:
            keys.append(k)
            values.append(v)

    prefill(row_a, 10)
    prefill(row_b, b_len)
    if case == "in_range":
        alloc.free_swa_segment(torch.tensor(slots[row_a][:6]), start_pos=0)  # left the window
        alloc.free(torch.tensor(slots[row_b]))  # b finished: its full and SWA slots join the tails
        prefill(row_a, 2)  # full and SWA 15, 16: the fresh slots of both pools run out
    elif case == "out_of_range":
        alloc.free_swa_segment(torch.tensor(slots[row_a][:5]), start_pos=0)
        alloc.free_swa_segment(torch.tensor(slots[row_b][:1]), start_pos=0)
    loc = alloc.alloc(1)
    identity = bool((kv_pool.translate_loc_from_full_to_swa(loc) == loc).all())
    pos = len(slots[row_a])
    q, k, v = torch.randn(1, _HEADS * _HEAD_DIM), torch.randn(1, _HEADS, _HEAD_DIM), torch.randn(1, _HEADS, _HEAD_DIM)
    write(row_a, loc, torch.zeros(0), torch.zeros(0))  # the row only: the layer's forward writes the K/V
    batch = api.ForwardBatch(forward_mode=api.ForwardMode.DECODE, batch_size=1,
                             input_ids=torch.zeros(1, dtype=torch.int64), req_pool_indices=torch.tensor([row_a]),
                             seq_lens=torch.tensor([pos + 1]), out_cache_loc=loc, seq_lens_sum=pos + 1)
    backend = api.TorchNativeAttnBackend(types.SimpleNamespace(device="cpu", req_to_token_pool=rows,
                                                               token_to_kv_pool=kv_pool))
    backend.init_forward_metadata(batch)
    try:
        with api.forward_context(api.ForwardContext(attn_backend=backend)):
            out = layer.forward(q, k, v, batch)
    except IndexError as exc:
        return DecodeRead(case=case, identity=identity, error=f"IndexError: {exc}", max_abs_err=None)
    expected = _window_attention(q, torch.cat([*keys, k]), torch.cat([*values, v]), pos=pos)
    return DecodeRead(case=case, identity=identity, error=None,
                      max_abs_err=float((out.view(-1) - expected).abs().max()))


def _window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, pos: int) -> torch.Tensor:
    """Attention of the query at ``pos`` over the request's own keys at ``pos - WINDOW + 1 .. pos``."""
    lo = max(0, pos - WINDOW + 1)
    kk, vv = k[lo: pos + 1, 0], v[lo: pos + 1, 0]
    weights = torch.softmax((kk @ q.view(-1)) * _HEAD_DIM ** -0.5, dim=0)
    return weights @ vv

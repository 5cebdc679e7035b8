"""The gathering backend reads each token's in-window keys and nothing else: SWA layers through the mapping,
pages expanded to slots, lanes past the keys masked and pointed at a live slot; and an index past its buffer
fails as a GPU kernel's index assert does."""

import pytest
import torch

from harness.backends.base import attention_batch
from harness.backends.registry import backend_class
from harness.graphs.registry import get_engine
from harness.serving.allocator import SWATokenToKVPoolAllocator
from harness.serving.batch import ForwardMode, make_forward_batch
from harness.serving.designs import DESIGNS
from harness.serving.miniature import MiniatureStack
from harness.serving.model import model_spec
from harness.serving.pool import HybridSWAKVPool, PoolSpec, ReqToTokenPool, in_bounds

SPEC = model_spec("gpt-oss-mini")  # window 8: a query reads its own key and the 7 before it
WIDTH = 16


def _request(page_size: int, *, tokens: int = 11, swa_pages: int = 16):
    """One request of ``tokens`` tokens whose SWA slots differ from its full slots: an earlier request's SWA
    pages were evicted (its full pages kept), so this one reuses them while taking fresh full pages."""
    pool = HybridSWAKVPool(spec=PoolSpec(full_size=32 * page_size, swa_size=swa_pages * page_size,
                                                page_size=page_size),
                           layer_is_swa=SPEC.layer_is_swa, num_kv_heads=SPEC.num_kv_heads, head_dim=SPEC.head_dim)
    r2t = ReqToTokenPool(max_running_requests=2, max_context_len=WIDTH)
    alloc = SWATokenToKVPoolAllocator(pool)
    alloc.free_swa(alloc.alloc(3 * page_size))
    locs = alloc.alloc(tokens)
    row = r2t.alloc()
    r2t.write(row, 0, locs)
    return pool, r2t, row, locs


def _builder(pool, r2t, faults=()):
    backend = backend_class("torch_gather")(model_spec=SPEC, stack=MiniatureStack.over(pool, r2t),
                                            design=DESIGNS["forward_batch"], faults=faults)
    return backend.builder


def _decode(row: int, seq_len: int, page_size: int):
    return attention_batch(forward_mode=ForwardMode.DECODE, req_pool_indices=torch.tensor([row]),
                           seq_lens=torch.tensor([seq_len]), out_cache_loc=torch.zeros(1, dtype=torch.int64),
                           page_size=page_size)


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_decode_token_gathers_every_full_key_and_its_window_of_swa_slots(page_size):
    pool, r2t, row, locs = _request(page_size)
    md = _builder(pool, r2t).build(_decode(row, 11, page_size))
    full_slots = locs.tolist()
    swa_slots = pool.full_to_swa_index_mapping[locs].tolist()
    assert swa_slots != full_slots, "the setup must part the two id spaces"
    # full layers: positions 0..10, the lanes after them repeat the newest key and are masked
    assert md.full.indices[0].tolist() == full_slots + [full_slots[-1]] * (WIDTH - 11)
    assert md.full.padding[0, 0, 0].tolist() == [False] * 11 + [True] * (WIDTH - 11)
    # SWA layers: positions 3..10 (the window includes the query's own key), translated to the SWA pool
    assert md.swa.indices[0].tolist() == swa_slots[3:]
    assert not md.swa.padding.any()


def test_a_short_request_fills_only_the_head_of_its_window():
    pool, r2t, row, locs = _request(1, tokens=3)
    md = _builder(pool, r2t).build(_decode(row, 3, 1))
    swa_slots = pool.full_to_swa_index_mapping[locs].tolist()
    assert md.swa.indices[0].tolist() == swa_slots + [swa_slots[-1]] * 5
    assert md.swa.padding[0, 0, 0].tolist() == [False] * 3 + [True] * 5


def test_an_extend_token_reads_only_the_keys_before_it():
    pool, r2t, row, locs = _request(1)
    batch = attention_batch(forward_mode=ForwardMode.EXTEND, req_pool_indices=torch.tensor([row]),
                            seq_lens=torch.tensor([11]), out_cache_loc=locs[8:], page_size=1,
                            extend_seq_lens=torch.tensor([3]), extend_seq_lens_cpu=(3,))
    md = _builder(pool, r2t).build(batch)
    swa_slots = pool.full_to_swa_index_mapping[locs].tolist()
    # the tokens at positions 8, 9, 10 read windows 1..8, 2..9, 3..10
    assert md.swa.indices.tolist() == [swa_slots[1:9], swa_slots[2:10], swa_slots[3:11]]
    assert md.full.padding[:, 0, 0].sum(1).tolist() == [WIDTH - 9, WIDTH - 10, WIDTH - 11]


def test_the_untranslated_fault_hands_the_swa_layers_full_pool_slots():
    pool, r2t, row, locs = _request(1)
    md = _builder(pool, r2t, faults={"swa_read_untranslated"}).build(_decode(row, 11, 1))
    assert md.swa.indices[0].tolist() == locs[3:].tolist()


@pytest.mark.parametrize("swa_pages", [5, 6])
def test_a_translation_table_sized_by_swa_pages_runs_off_at_the_first_full_page_past_them(swa_pages):
    # the request holds full pages 4 and 5 (after three evicted ones) and SWA pages 1 and 2
    pool, r2t, row, _ = _request(4, tokens=8, swa_pages=swa_pages)
    faulty = _builder(pool, r2t, faults={"swa_table_sized_by_swa_pages"})
    if swa_pages == 6:
        faulty.build(_decode(row, 8, 4))  # six entries: page 5 still fits
        return
    with pytest.raises(RuntimeError, match=r"device-side assert: out-of-bounds index into the SWA page "
                                           r"translation table \(5 entries, one per SWA page\)"):
        faulty.build(_decode(row, 8, 4))
    _builder(pool, r2t).build(_decode(row, 8, 4))  # sized by the full pages it is indexed by: no assert


def _forward(backend_name: str, pool, r2t, row, locs):
    """One decode forward of layer 1 (a full layer) for the request's newest token."""
    backend = backend_class(backend_name)(model_spec=SPEC, stack=MiniatureStack.over(pool, r2t),
                                          design=DESIGNS["forward_batch"])
    batch = make_forward_batch(forward_mode=ForwardMode.DECODE, input_ids=torch.zeros(1, dtype=torch.int64),
                               positions=torch.tensor([len(locs) - 1]), req_pool_indices=torch.tensor([row]),
                               prefix_lens=[len(locs) - 1], extend_lens=[1], out_cache_loc=locs[-1:],
                               req_to_token_pool=r2t, pool=pool, translate=pool.translate_loc_from_full_to_swa)
    backend.init_forward_metadata(batch)
    gen = torch.Generator().manual_seed(3)
    hq, hkv, d = SPEC.num_heads, SPEC.num_kv_heads, SPEC.head_dim
    q, k, v = (torch.randn(1, h * d, generator=gen) for h in (hq, hkv, hkv))
    return backend.forward(q, k, v, 1, batch)


def test_a_nan_in_the_dummy_slot_leaks_through_dense_masking_but_not_through_the_gather():
    pool, r2t, row, locs = _request(1)
    gen = torch.Generator().manual_seed(5)
    kv = [*pool.full_k_buffer, *pool.full_v_buffer, *pool.swa_k_buffer, *pool.swa_v_buffer]
    for buf in kv:
        buf.copy_(torch.randn(buf.shape, generator=gen))
    clean = {name: _forward(name, pool, r2t, row, locs) for name in ("torch_native", "torch_gather")}
    for buf in kv:
        buf[0] = float("nan")  # what vLLM PR 38436's padded rows wrote there
    dense, gathered = (_forward(name, pool, r2t, row, locs) for name in ("torch_native", "torch_gather"))
    assert dense.isnan().all(), "the dense kernel multiplies the dummy slot by a zero weight"
    assert torch.equal(gathered, clean["torch_gather"])
    torch.testing.assert_close(clean["torch_gather"], clean["torch_native"])


def test_an_index_past_its_buffer_is_a_device_side_assert_eagerly_and_in_a_replayed_graph():
    loc = torch.tensor([1, -1])  # a Python-style negative index is inside (vLLM issue 43810 relies on it)
    assert in_bounds(loc, 4, "the SWA pool (4 slots)") is loc
    buf = torch.zeros(4, 2)

    def write():
        buf[in_bounds(loc, 4, "the SWA pool (4 slots)")] = 1.0
        return buf.sum(0)

    graph = get_engine("tape").capture(write, label="t", roots={}, static_inputs=[buf, loc])
    loc.copy_(torch.tensor([2, 3]))
    buf.zero_()  # whatever capture left there
    graph.replay()
    assert buf[:, 0].tolist() == [0.0, 0.0, 1.0, 1.0]
    loc.copy_(torch.tensor([2, 4]))
    message = r"device-side assert: out-of-bounds index into the SWA pool \(4 slots\)"
    with pytest.raises(RuntimeError, match=message):
        graph.replay()
    with pytest.raises(RuntimeError, match=message):
        in_bounds(torch.tensor([-5]), 4, "the SWA pool (4 slots)")

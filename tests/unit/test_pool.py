import pytest
import torch

from harness.serving.allocator import SWATokenToKVPoolAllocator
from harness.serving.pool import (
    HybridSWAKVPool,
    PoolExhausted,
    PoolSpec,
    ReqToTokenPool,
    is_poison,
)


def make_pool(full=16, swa=8, kv_dtype="float32"):
    pool = HybridSWAKVPool(
        spec=PoolSpec(full_size=full, swa_size=swa, kv_dtype=kv_dtype),
        layer_is_swa=(True, False, True),
        num_kv_heads=2,
        head_dim=4,
        kv_scales=[(0.5, 0.25)] * 3,
    )
    return pool, SWATokenToKVPoolAllocator(pool)


def test_layers_mapping_indexes_each_pool_separately():
    pool, _ = make_pool()
    assert pool.layers_mapping == {0: (0, True), 1: (0, False), 2: (1, True)}
    assert len(pool.swa_k_buffer) == 2 and len(pool.full_k_buffer) == 1
    assert pool.get_key_buffer(2) is pool.swa_k_buffer[1]


def test_alloc_records_swa_slot_and_never_hands_out_dummy_slot():
    pool, alloc = make_pool()
    full = alloc.alloc(7)
    assert 0 not in full.tolist()
    swa = pool.translate_loc_from_full_to_swa(full)
    assert swa.dtype == torch.int32
    assert sorted(swa.tolist()) == list(range(1, 8))


def test_minus_one_translates_to_minus_one_and_dummy_to_dummy():
    pool, alloc = make_pool()
    alloc.alloc(3)
    out = pool.translate_loc_from_full_to_swa(torch.tensor([-1, 0]))
    assert out.tolist() == [-1, 0]
    assert pool.full_to_swa_index_mapping.shape[0] == pool.full_size + 1


def test_free_swa_zeroes_mapping_and_keeps_full_slot():
    pool, alloc = make_pool()
    full = alloc.alloc(4)
    alloc.free_swa(full[:2])
    assert pool.translate_loc_from_full_to_swa(full).tolist()[:2] == [0, 0]
    assert alloc.available_size() == (16 - 1 - 4, 8 - 1 - 2)


def test_swa_slot_reused_after_eviction():
    pool, alloc = make_pool()
    first = alloc.alloc(3)
    evicted_swa = pool.translate_loc_from_full_to_swa(first[:1]).tolist()
    alloc.free_swa(first[:1])
    again = alloc.alloc(1)
    assert pool.translate_loc_from_full_to_swa(again).tolist() == evicted_swa
    assert again.tolist() != first[:1].tolist()  # the full slot stays with the evicted token


def test_free_releases_both_pools():
    pool, alloc = make_pool()
    full = alloc.alloc(5)
    alloc.free(full)
    assert alloc.available_size() == (15, 7)
    assert int(pool.full_to_swa_index_mapping[:-1].abs().sum()) == 0


@pytest.mark.parametrize("full,swa,n,which", [(4, 16, 5, "full KV pool"), (16, 4, 5, "SWA KV pool")])
def test_exhaustion_is_a_clear_error(full, swa, n, which):
    _, alloc = make_pool(full, swa)
    with pytest.raises(PoolExhausted, match=which):
        alloc.alloc(n)


def test_req_to_token_rejects_positions_past_max_context():
    r2t = ReqToTokenPool(max_running_requests=2, max_context_len=4)
    row = r2t.alloc()
    assert row == 1  # row 0 is the dummy row padded graph rows read
    with pytest.raises(PoolExhausted, match="max_context_len"):
        r2t.write(row, 2, torch.tensor([1, 2, 3]))


def test_set_kv_buffer_with_minus_one_wraps_to_last_slot():
    # vLLM issue 43810: a padding slot of -1 used as a Python index lands on the last slot.
    pool, _ = make_pool()
    k = torch.ones(1, 2, 4)
    pool.set_kv_buffer(1, torch.tensor([-1]), k, k)
    assert torch.equal(pool.full_k_buffer[0][-1], k[0])


def test_fp8_pool_stores_quantized_bytes_and_reads_back_within_quantization():
    pool, _ = make_pool(kv_dtype="fp8_e4m3")
    k = torch.linspace(-1, 1, 8).view(1, 2, 4)
    pool.set_kv_buffer(0, torch.tensor([3]), k, k)
    assert pool.swa_k_buffer[0].dtype == torch.uint8
    back, _ = pool.read_kv(0, torch.tensor([3]), torch.float32)
    assert torch.allclose(back, k, atol=0.5 * 0.07)


def test_poison_marks_every_slot_but_dummy():
    pool, _ = make_pool(kv_dtype="fp8_e4m3")
    pool.poison()
    buf = pool.swa_v_buffer[1]
    assert all(is_poison(buf[i]) for i in range(1, buf.shape[0])) and bool((buf[0] == 0).all())


def test_memoized_translation_is_served_until_invalidated():
    pool, alloc = make_pool()
    locs = alloc.alloc(2)
    first = pool.translate_memoized(locs).clone()
    pool.full_to_swa_index_mapping[locs] = 0  # a change behind the allocator's back: nothing invalidates
    assert torch.equal(pool.translate_memoized(locs), first)  # stale: same storage and numel
    pool.invalidate_translate_cache()
    assert pool.translate_memoized(locs).tolist() == [0, 0]


@pytest.mark.parametrize("change", ["alloc", "free_swa", "free"])
def test_the_allocator_invalidates_the_memo_whenever_it_changes_the_mapping(change):
    # SGLang PR 25824: every allocator method that writes full_to_swa_index_mapping drops the memo
    pool, alloc = make_pool()
    locs = alloc.alloc(2)
    pool.translate_memoized(locs)
    if change == "alloc":
        alloc.alloc(1)
    else:
        getattr(alloc, change)(locs)
    assert pool._memo_key is None
    assert pool.translate_memoized(locs).tolist() == pool.translate_loc_from_full_to_swa(locs).tolist()


def test_the_read_path_shares_the_memo_only_in_a_memoizing_pool():
    pool, alloc = make_pool()
    table = alloc.alloc(4).view(2, 2)
    out_cache_loc = alloc.alloc(2)
    assert pool.translate_for_read(table[0]).tolist() == pool.translate_loc_from_full_to_swa(table[0]).tolist()
    assert pool._memo_key is None  # not memoizing: the read path translates afresh
    pool.memoize_reads = True
    step0 = pool.translate_for_read(table[0]).tolist()
    # two page tables of one storage and one length: the second is served the first's translation
    assert pool.translate_for_read(table[1]).tolist() == step0
    # one entry for every caller: the write path's translation replaces the read path's
    assert pool.translate_memoized(out_cache_loc).tolist() == pool.translate_loc_from_full_to_swa(out_cache_loc).tolist()
    assert pool.translate_for_read(table[1]).tolist() == pool.translate_loc_from_full_to_swa(table[1]).tolist() != step0


def test_memoized_translation_keys_row_views_of_one_tensor_alike():
    # SGLang PR 25824 keys on the storage pointer: a draft's step rows share it, and their length
    pool, alloc = make_pool()
    rows = alloc.alloc(4).view(2, 2)
    step0 = pool.translate_memoized(rows[0]).tolist()
    assert pool.translate_memoized(rows[1]).tolist() == step0  # served step 0's translation
    pool.invalidate_translate_cache()
    assert pool.translate_memoized(rows[1]).tolist() == pool.translate_loc_from_full_to_swa(rows[1]).tolist() != step0
    assert pool.translate_memoized(rows.reshape(-1)).numel() == 4  # another length: another key


def test_poison_is_not_a_computed_nan():
    pool, _ = make_pool()
    pool.poison()
    assert is_poison(pool.full_k_buffer[0][1])
    pool.full_k_buffer[0][1] = float("nan")
    assert not is_poison(pool.full_k_buffer[0][1])

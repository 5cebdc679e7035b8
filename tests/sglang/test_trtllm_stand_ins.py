"""The CPU stand-ins of FlashInfer's TRT-LLM calls refuse, by name, what they do not compute (attention sinks, FP4
scale factors, speculative masks, a ragged verify's variable queries per request, the other FlashInfer wrappers): a run
reaching one fails with ``NotOnCPU``, never with attention computed without it."""

from __future__ import annotations

import pytest
import torch

from harness.sglang.trtllm_cpu import (NotOnCPU, UnusedFlashInferWrapper, trtllm_batch_context_with_kv_cache,
                                       trtllm_batch_decode_with_kv_cache)


def _decode_args(**extra):
    pages = torch.zeros(2, 1, 4, 8)  # [pages, heads, page_size, dim] (HND)
    return dict(query=torch.zeros(1, 1, 8), kv_cache=(pages, pages.clone()), workspace_buffer=torch.zeros(1),
                block_tables=torch.zeros(1, 2, dtype=torch.int32), seq_lens=torch.tensor([3], dtype=torch.int32),
                max_seq_len=8, bmm1_scale=1.0, bmm2_scale=1.0, **extra)


@pytest.mark.parametrize("extra", [{"sinks": torch.zeros(1)}, {"kv_cache_sf": torch.zeros(1)},
                                   {"mask": torch.zeros(1)}, {"cum_seq_lens_q": torch.zeros(2)}],
                         ids=lambda e: next(iter(e)))
def test_decode_refuses_each_extra_by_name(extra):
    with pytest.raises(NotOnCPU, match=next(iter(extra))):
        trtllm_batch_decode_with_kv_cache(**_decode_args(**extra))


def test_decode_refuses_a_ragged_verify():
    with pytest.raises(NotOnCPU, match="fixed q_len_per_req"):
        trtllm_batch_decode_with_kv_cache(**_decode_args(q_len_per_req=None))


def test_a_verify_of_three_queries_per_request_is_three_decodes_at_its_positions():
    """The TRT-LLM-GEN rule for ``q_len_per_req`` > 1: query j of a request sees its keys up to its own position
    (``seq_len - q_len + j``), inside the window of that position: causal within the draft."""
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(4, 2, 4, 8, generator=g), torch.randn(4, 2, 4, 8, generator=g)  # 4 pages of 4, 2 kv heads
    tables = torch.tensor([[2, 0, 3], [1, 3, 0]], dtype=torch.int32)
    lens = torch.tensor([9, 6], dtype=torch.int32)
    query = torch.randn(2 * 3, 4, 8, generator=g)
    common = dict(kv_cache=(k, v), workspace_buffer=torch.zeros(1), max_seq_len=12, bmm1_scale=0.3,
                  bmm2_scale=1.0, window_left=3)
    verify = trtllm_batch_decode_with_kv_cache(query=query, block_tables=tables, seq_lens=lens, q_len_per_req=3,
                                               **common)
    rows = query.view(2, 3, 4, 8)
    for j in range(3):
        one = trtllm_batch_decode_with_kv_cache(query=rows[:, j], block_tables=tables, seq_lens=lens - (2 - j),
                                                **common)
        torch.testing.assert_close(verify.view(2, 3, 4, 8)[:, j], one, rtol=0, atol=0)
    # not the same as every query over all the keys: the rule is what the comparison above tests
    last_only = trtllm_batch_decode_with_kv_cache(query=rows[:, 0], block_tables=tables, seq_lens=lens, **common)
    assert not torch.equal(verify.view(2, 3, 4, 8)[:, 0], last_only)


def test_decode_without_extras_computes():
    out = trtllm_batch_decode_with_kv_cache(**_decode_args())
    assert out.shape == (1, 1, 8) and torch.isfinite(out).all()


def test_context_refuses_sinks_and_the_wrappers_refuse_every_use():
    pages = torch.zeros(2, 1, 4, 8)
    with pytest.raises(NotOnCPU, match="sinks"):
        trtllm_batch_context_with_kv_cache(
            query=torch.zeros(1, 1, 8), kv_cache=(pages, pages), workspace_buffer=torch.zeros(1),
            block_tables=torch.zeros(1, 2, dtype=torch.int32), seq_lens=torch.tensor([1], dtype=torch.int32),
            max_q_len=1, max_kv_len=8, bmm1_scale=1.0, bmm2_scale=1.0, batch_size=1,
            cum_seq_lens_q=torch.tensor([0, 1], dtype=torch.int32), cum_seq_lens_kv=torch.tensor([0, 1], dtype=torch.int32),
            sinks=torch.zeros(1))
    with pytest.raises(NotOnCPU, match=r"\.plan"):
        UnusedFlashInferWrapper(object(), kv_layout="HND").plan()

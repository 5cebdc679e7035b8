"""Metadata builders shared by attention backends: page tables and per-token row/length indices.

Page size is 1, so a request's page table row is its ``req_to_token`` row: column j holds the full-pool
slot of position j. Columns at or past ``seq_len`` hold 0, the dummy slot, so that a kernel that reads
the whole row and masks (as the torch-native backend does) only ever touches written or dummy rows.
"""

from __future__ import annotations

import torch


def build_page_table(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, width: int
) -> torch.Tensor:
    """[bs, width] int64 full-pool slots of each request, 0 past its length."""
    rows = req_to_token[req_pool_indices.long(), :width].long()
    cols = torch.arange(width, device=rows.device)
    return torch.where(cols[None, :] < seq_lens[:, None], rows, torch.zeros_like(rows))


def extend_token_rows(extend_seq_lens_cpu: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Batch row of every token of an extend batch (eager only: it sizes a tensor from Python ints)."""
    return torch.repeat_interleave(
        torch.arange(len(extend_seq_lens_cpu), device=device),
        torch.tensor(extend_seq_lens_cpu, device=device),
        output_size=sum(extend_seq_lens_cpu),
    )


def extend_token_kv_lens(
    seq_lens: torch.Tensor, extend_seq_lens: torch.Tensor, token_rows: torch.Tensor
) -> torch.Tensor:
    """Keys visible to each new token: its request's cached prefix plus the new tokens up to itself.

    Derived from ``seq_lens`` as real kernels derive kv lengths, not from positions, so that a wrong
    ``seq_lens`` shows in the attention.
    """
    starts = torch.cumsum(extend_seq_lens, 0) - extend_seq_lens
    index_in_extend = torch.arange(token_rows.numel(), device=token_rows.device) - starts[token_rows]
    return seq_lens[token_rows] - extend_seq_lens[token_rows] + index_in_extend + 1

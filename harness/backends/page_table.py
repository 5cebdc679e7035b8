"""Metadata builders shared by attention backends: page tables and per-token row/length indices.

``req_to_token`` maps every position of a request to its full-pool slot. With ``page_size`` tokens per
page, slot ``s`` lies in page ``s // page_size`` at offset ``s % page_size``, and a request's pages are
the pages of its positions 0, page_size, 2 * page_size, ... (an allocator hands out whole pages). A page
table row lists those page ids; ``page_table_slots`` expands it back to one slot per position for a kernel
that gathers token rows. Entries past a request's length hold 0, the dummy page (whose slots include the
dummy slot 0), so that a kernel that reads the whole row and masks (as the torch-native backend does)
only ever touches written or dummy rows.
"""

from __future__ import annotations

import torch

from ..serving.draft_tree import DraftTree
from ..serving.pool import in_bounds


def build_page_table(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, width: int, *,
    page_size: int,
) -> torch.Tensor:
    """[bs, num_pages(width)] int64 page ids of each request's pages, 0 past its last page."""
    first_slots = req_to_token[req_pool_indices.long(), :width:page_size].long()
    pages = first_slots // page_size
    cols = torch.arange(pages.shape[1], device=pages.device)
    used = -(-seq_lens // page_size)
    return torch.where(cols[None, :] < used[:, None], pages, torch.zeros_like(pages))


def swa_page_translation(full_to_swa_index_mapping: torch.Tensor, full_size: int, *, page_size: int) -> torch.Tensor:
    """[full pages] the SWA page id of each full-pool page (0 where evicted), read at the page's first slot.

    The slot is translated, not the page id (SGLang PR 16267): the mapping is per token slot.
    """
    return full_to_swa_index_mapping[:full_size:page_size] // page_size


def translate_pages(table: torch.Tensor, pages: torch.Tensor, *, per: str = "full") -> torch.Tensor:
    """``table[pages]``, once every page id addresses an entry of ``table`` (one entry ``per`` pool page)."""
    n = table.shape[0]
    return table[in_bounds(pages, n, f"the SWA page translation table ({n} entries, one per {per} page)")]


def page_table_slots(page_table: torch.Tensor, seq_lens: torch.Tensor, width: int, *, page_size: int) -> torch.Tensor:
    """[bs, width] int64 full-pool slot of each position through its page, 0 past each request's length."""
    pos = torch.arange(width, device=page_table.device)
    slots = page_table[:, pos // page_size] * page_size + pos % page_size
    return torch.where(pos[None, :] < seq_lens[:, None], slots, torch.zeros_like(slots))


def position_slots(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, lens: torch.Tensor,
    key_pos: torch.Tensor, *, page_size: int,
) -> torch.Tensor:
    """``page_table_slots(build_page_table(..., seq_lens, ...), lens, ...)``: [bs, width] int64 full-pool slot of
    each position (``key_pos``: 0..width-1), 0 past its request's pages or ``lens``.

    With pages of one slot the page table is the request's row of ``req_to_token`` itself: the same values in
    a fifth of the ops (a backend builds this table for every forward, eager or replayed)."""
    if page_size != 1:
        width = key_pos.numel()
        pages = build_page_table(req_to_token, req_pool_indices, seq_lens, width, page_size=page_size)
        return page_table_slots(pages, lens, width, page_size=page_size)
    rows = req_to_token[req_pool_indices.long(), : key_pos.numel()].long()
    bound = seq_lens if lens is seq_lens else torch.minimum(seq_lens, lens)
    return torch.where(key_pos[None, :] < bound[:, None], rows, torch.zeros_like(rows))


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


def tree_slot_table(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, tree: DraftTree,
                    kv_lens: torch.Tensor, width: int) -> torch.Tensor:
    """[rows, width] int64 full-pool slot of each key of each query row of a tree draft or its verify (pages
    of one token): the request's own columns, then its branch's run (``serving/draft_tree.py``), 0 past the
    row's ``kv_lens``. Every op is a gather, so a graph's replay refresh can run it."""
    pos = torch.arange(width, device=req_to_token.device)
    cols = pos[None, :] + tree.shift[:, None] * (pos[None, :] >= tree.branch_from[:, None])
    slots = req_to_token[req_pool_indices.long()].long().gather(1, cols.clamp(max=width - 1))
    return torch.where(pos[None, :] < kv_lens[:, None], slots, torch.zeros_like(slots))


def tree_swa_slot_table(slots: torch.Tensor, swa_slots: torch.Tensor, tree: DraftTree, *,
                        untranslated: bool) -> torch.Tensor:
    """The SWA layers' table of a tree: ``swa_slots`` (``slots`` translated), or, for the fault
    ``draft_tree_swa_untranslated`` (SGLang PR 24617's family), the tree's own keys (the branch part, from each
    row's ``prefix`` on) left at their full-pool ids while the request's own part is translated."""
    if not untranslated:
        return swa_slots
    pos = torch.arange(slots.shape[1], device=slots.device)
    return torch.where(pos[None, :] >= tree.prefix[:, None], slots, swa_slots)

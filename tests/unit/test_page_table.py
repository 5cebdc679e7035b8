"""The page-table builders read the page size: page ids per request, expanded back to one slot per position."""

import pytest
import torch

from harness.backends.page_table import build_page_table, page_table_slots


def _req_to_token(page_size: int, width: int) -> tuple[torch.Tensor, list[list[int]]]:
    """Two requests over whole pages handed out out of order (request 1 gets pages 3, 1; request 2 pages 2, 5, 4)."""
    pages = [[3, 1], [2, 5, 4]]
    table = torch.zeros(3, width, dtype=torch.int32)
    for row, owned in enumerate(pages, start=1):
        slots = [page * page_size + offset for page in owned for offset in range(page_size)][:width]
        table[row, : len(slots)] = torch.tensor(slots, dtype=torch.int32)
    return table, pages


@pytest.mark.parametrize("page_size", [1, 2, 4])
def test_page_ids_and_their_slots_for_any_page_size(page_size):
    width = 3 * page_size
    req_to_token, pages = _req_to_token(page_size, width)
    req_pool_indices = torch.tensor([1, 2, 0])
    seq_lens = torch.tensor([page_size + 1, 3 * page_size, 1])  # a part page, whole pages, the dummy row
    table = build_page_table(req_to_token, req_pool_indices, seq_lens, width, page_size=page_size)
    # request 1 uses 2 pages; request 2 all 3; the dummy row its one dummy page
    assert table.tolist() == [[3, 1, 0], [2, 5, 4], [0, 0, 0]]
    slots = page_table_slots(table, seq_lens, width, page_size=page_size)
    positions = torch.arange(width)
    expected = torch.where(positions[None, :] < seq_lens[:, None], req_to_token[req_pool_indices].long(), 0)
    assert torch.equal(slots, expected)
    assert slots.dtype == torch.int64


def test_page_size_one_keeps_the_req_to_token_row_masked_at_each_length():
    req_to_token = torch.tensor([[0, 0, 0, 0], [7, 3, 9, 4], [5, 6, 0, 0]], dtype=torch.int32)
    seq_lens = torch.tensor([3, 2])
    table = build_page_table(req_to_token, torch.tensor([1, 2]), seq_lens, 4, page_size=1)
    assert table.tolist() == [[7, 3, 9, 0], [5, 6, 0, 0]]
    assert torch.equal(page_table_slots(table, seq_lens, 4, page_size=1), table)


@pytest.mark.parametrize("page_size", [1, 2, 4])
@pytest.mark.parametrize("tail", ["lengths", "whole last page", "shorter"])
def test_position_slots_is_the_page_table_expanded_whatever_the_page_size(page_size, tail):
    from harness.backends.page_table import position_slots

    width = 3 * page_size
    req_to_token, _ = _req_to_token(page_size, width)
    req_to_token[0] = torch.arange(width) + 7  # a dummy row with stale entries: masked, never read
    req_pool_indices = torch.tensor([1, 2, 0], dtype=torch.int32)
    seq_lens = torch.tensor([page_size + 1, 3 * page_size - 1, 1])
    lens = {"lengths": seq_lens, "whole last page": (seq_lens + page_size - 1) // page_size * page_size,
            "shorter": seq_lens - 1}[tail]
    key_pos = torch.arange(width)
    got = position_slots(req_to_token, req_pool_indices, seq_lens, lens, key_pos, page_size=page_size)
    pages = build_page_table(req_to_token, req_pool_indices, seq_lens, width, page_size=page_size)
    want = page_table_slots(pages, lens, width, page_size=page_size)
    assert got.dtype == want.dtype == torch.int64 and torch.equal(got, want)

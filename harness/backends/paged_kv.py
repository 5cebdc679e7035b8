"""FlashInfer's paged-KV lists: ``kv_indptr`` / ``kv_indices`` / ``kv_last_page_len`` for one window group.

FlashInfer's paged wrappers are handed, per request, a run of page ids in CSR form: request ``r`` reads
pages ``kv_indices[kv_indptr[r]:kv_indptr[r + 1]]``, all full but the last, which holds
``kv_last_page_len[r]`` tokens (1 to ``page_size``). Its kv length is therefore
``(pages - 1) * page_size + last_page_len``, and the kernel aligns the queries with the end of that run
(causal from the bottom right), so a run may start anywhere on a page boundary.

A full-attention layer's run is every page of the request. A sliding-window layer's run starts at the page
holding the oldest key any of the forward's new tokens can see (``window`` keys, the query's own included:
FlashInfer's ``window_left`` is ``window - 1``), and its page ids are SWA-pool pages: the window's tokens are
all a kernel reads of the SWA pool, as SGLang's FlashInfer backend hands its SWA wrapper. At ``page_size`` > 1
the first page may hold keys older than the window; they were written (they share the page of an in-window
key, which keeps the page alive) and ``window_left`` masks them.

The lengths are laid out on the host, from the batch's ``seq_lens_cpu``, because ``plan()`` sizes its work
on the CPU; only the page ids are gathered on the device, at host-computed positions, so no step reads a
device tensor back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class PagedKVLayout:
    """One window group's runs of pages for every request of a forward, on the host."""

    page_size: int
    indptr: tuple[int, ...]
    """[bs + 1] the CSR offsets: request r's pages are entries indptr[r] .. indptr[r + 1] - 1"""
    first_page: tuple[int, ...]
    """[bs] the page-table column of each request's first page in the run"""
    last_page_len: tuple[int, ...]
    """[bs] tokens in each request's last page, 1 .. page_size (0 for a request of no tokens)"""

    @property
    def num_pages(self) -> int:
        """Entries of ``kv_indices`` the runs use."""
        return self.indptr[-1]

    @property
    def kv_lens(self) -> tuple[int, ...]:
        """Tokens each request's run covers, as the kernel derives them."""
        return tuple(max(0, (self.indptr[r + 1] - self.indptr[r] - 1) * self.page_size + self.last_page_len[r])
                     for r in range(len(self.last_page_len)))


def paged_kv_layout(seq_lens_cpu: tuple[int, ...], new_tokens_cpu: tuple[int, ...], *, page_size: int,
                    window: int | None) -> PagedKVLayout:
    """The runs of pages of requests of ``seq_lens_cpu`` tokens that add ``new_tokens_cpu`` tokens this
    forward, every page for a full layer (``window`` None), the pages of the new tokens' windows otherwise."""
    indptr, first_pages, last_lens = [0], [], []
    for seq_len, new in zip(seq_lens_cpu, new_tokens_cpu, strict=True):
        used = -(-seq_len // page_size)
        oldest = 0 if window is None else max(0, seq_len - new - window + 1)
        first = min(oldest // page_size, used)
        indptr.append(indptr[-1] + used - first)
        first_pages.append(first)
        last_lens.append(seq_len - (used - 1) * page_size if used else 0)
    return PagedKVLayout(page_size=page_size, indptr=tuple(indptr), first_page=tuple(first_pages),
                         last_page_len=tuple(last_lens))


def gather_page_ids(page_table: torch.Tensor, layout: PagedKVLayout) -> torch.Tensor:
    """[num_pages] int32 ``kv_indices``: the page ids of every request's run, read from its row of
    ``page_table`` ([bs, pages] page ids of one pool) at positions laid out on the host."""
    counts = torch.tensor([b - a for a, b in zip(layout.indptr, layout.indptr[1:])], dtype=torch.int64)
    rows = torch.repeat_interleave(torch.arange(len(counts)), counts)
    starts = torch.tensor(layout.indptr[:-1], dtype=torch.int64)
    cols = torch.tensor(layout.first_page, dtype=torch.int64)[rows] + torch.arange(layout.num_pages) - starts[rows]
    dev = page_table.device
    return page_table[rows.to(dev), cols.to(dev)].to(torch.int32)


def host_tensor(values: tuple[int, ...]) -> torch.Tensor:
    """int32 CPU tensor of ``values``: what ``plan()`` reads its lengths from without a device sync."""
    return torch.tensor(values, dtype=torch.int32)


def paged_kv_slots(kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor, *,
                   page_size: int, lanes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[bs, lanes] the pool slot of each request's key j (its run's j-th token) and [bs] its kv length.

    Shapes are static and nothing is read back to the host, so graphs capture it. Lanes past a request's
    run point at a clamped entry of ``kv_indices`` (a page id of the same pool) and must be masked.
    """
    kv_lens = ((kv_indptr[1:] - kv_indptr[:-1] - 1) * page_size + kv_last_page_len).clamp(min=0).long()
    lane = torch.arange(lanes, device=kv_indices.device)
    entry = (kv_indptr[:-1, None].long() + lane // page_size).clamp(max=max(kv_indices.shape[0] - 1, 0))
    slots = kv_indices[entry].long() * page_size + lane % page_size
    return slots, kv_lens

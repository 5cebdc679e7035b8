"""SGLang's EAGLE draft-location kernels (0.5.23, ``sglang/kernels/ops/speculative/cache_locs.py``) run on a CPU.

Two pieces of SGLang's speculative path decide which KV slots a draft writes and reads:

* ``assign_draft_cache_locs_contiguous_func``: after the worker's ``alloc_token_slots(bs * topk * steps)`` has
  been written into ``req_to_token``, the draft's ``out_cache_loc`` is copied out of each request's row from
  its ``seq_lens`` on, ``topk * steps`` slots a request (``EAGLEWorker.draft``, ``eagle_worker_common``);
* ``generate_draft_decode_kv_indices``: the keys each draft row reads at each step (FlashInfer's and the
  Triton backend's multi-step draft metadata): the request's own ``seq_lens`` columns, then its branch's run,
  ``seq_lens + topk_id * steps + [0, step]``, optionally translated through a page-level table (``v2p``).

Both are ``@triton.jit`` kernels, launched here through SGLang's own wrapper or with SGLang's own launch
arguments, in Triton's interpreter (``triton_interpreter.interpreted``). The harness's draft allocation and
its tree-draft key tables (``serving/draft_tree.py``, ``backends/page_table.tree_slot_table``) are checked
against what they return (``tests/sglang/test_eagle_layout.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .installed import load
from .triton_interpreter import interpreted

__all__ = ["DraftReads", "assign_draft_cache_locs", "draft_decode_kv_indices"]


def _cache_locs_module():
    load()  # the import chain's stand-ins (torchvision)
    from sglang.kernels.ops.speculative import cache_locs

    return cache_locs


def _dense(**tensors: torch.Tensor) -> None:
    """A kernel reads a tensor from its data pointer, as a device kernel does: a strided view (a batch's
    ``req_pool_indices[::topk]``) would be read as the storage's first rows. Refused by name."""
    strided = [name for name, t in tensors.items() if not t.is_contiguous()]
    if strided:
        raise ValueError(f"SGLang's draft kernels read contiguous tensors; {', '.join(strided)} is a strided view "
                         "(call .contiguous() first)")


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, (max(1, n) - 1).bit_length())


def assign_draft_cache_locs(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor, seq_lens: torch.Tensor,
                            *, topk: int, steps: int) -> torch.Tensor:
    """[bs * topk * steps] int64: SGLang's draft ``out_cache_loc``, request-major, as its worker builds it from
    ``req_to_token`` (one request's ``topk * steps`` slots from its ``seq_lens`` on)."""
    _dense(req_pool_indices=req_pool_indices, req_to_token=req_to_token, seq_lens=seq_lens)
    module = _cache_locs_module()
    bs = int(seq_lens.shape[0])
    out = torch.empty(bs * topk * steps, dtype=torch.int64)
    with interpreted(module, "assign_draft_cache_locs_contiguous"):
        module.assign_draft_cache_locs_contiguous_func(req_pool_indices, req_to_token, seq_lens, out, topk, steps)
    return out


@dataclass(frozen=True, slots=True)
class DraftReads:
    """What SGLang's ``generate_draft_decode_kv_indices`` gives one multi-step draft: per step, the flat key
    list of every row (request-major, branch-minor) and where each row's keys start."""

    kv_indices: torch.Tensor
    """[steps, capacity] int64"""
    kv_indptr: torch.Tensor
    """[steps, rows + 1] int64"""

    def keys(self, step: int, row: int) -> torch.Tensor:
        """The slots draft row ``row`` reads at draft step ``step`` (0-based)."""
        lo, hi = int(self.kv_indptr[step, row]), int(self.kv_indptr[step, row + 1])
        return self.kv_indices[step, lo:hi]


def draft_decode_kv_indices(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor, seq_lens: torch.Tensor,
                            *, topk: int, steps: int, v2p: torch.Tensor | None = None) -> DraftReads:
    """SGLang's draft-decode key lists for requests ``req_pool_indices`` with ``seq_lens`` committed tokens
    (pages of one token, no draft window), launched as its FlashInfer backend launches the single-block form:
    a grid of (steps, requests, topk). ``v2p``: a per-token translation table (``TRANSLATE``), as a read
    source with a page table maps virtual ids to physical ones."""
    _dense(req_pool_indices=req_pool_indices, req_to_token=req_to_token, seq_lens=seq_lens,
           **({} if v2p is None else {"v2p": v2p}))
    module = _cache_locs_module()
    bs = int(seq_lens.shape[0])
    rows = bs * topk
    capacity = int(seq_lens.sum()) * topk + rows * steps
    kv_indices = torch.full((steps, max(1, capacity)), -7, dtype=torch.int64)
    kv_indptr = torch.zeros((steps, rows + 1), dtype=torch.int64)
    # a draft row's position is its request's committed length (the first draft token's), branch by branch
    positions = seq_lens.to(torch.int64).repeat_interleave(topk)
    with interpreted(module, "generate_draft_decode_kv_indices"):
        module.generate_draft_decode_kv_indices[(steps, bs, topk)](
            req_pool_indices, req_to_token, seq_lens, kv_indices, kv_indptr, positions,
            req_to_token.shape[1], kv_indices.shape[1], kv_indptr.shape[1],
            _next_power_of_2(bs), _next_power_of_2(steps), _next_power_of_2(rows), 1, 0, 0,
            NUM_STEPS=0, ENTRY_PAGE_SIZE=1, v2p=v2p, TRANSLATE=v2p is not None,
        )
    return DraftReads(kv_indices=kv_indices, kv_indptr=kv_indptr)

"""A tree of drafts (top-k > 1): which ``req_to_token`` columns each query of a draft step or a verify reads.

SGLang's EAGLE worker with ``speculative_eagle_topk`` > 1 drafts ``topk`` branches of ``steps`` tokens per
request and writes every branch's slots after the request's committed tokens, branch-major
(``assign_draft_cache_locs`` over ``out_cache_loc.view(bs, topk, steps)``); the verify writes the root (the
request's last token) and then every branch the same way. A query of branch ``k`` reads the request's own
columns up to its branch and then its branch's run, never another branch's: its keys are its ancestors. For
request ``r`` with ``n`` committed tokens, 2 branches of 3 steps (``bKsI``: branch K's token I)::

    req_to_token[r]    [ 0 .. n-1 | b0s0 b0s1 b0s2 | b1s0 b1s1 b1s2 ]       (the draft's columns)
    draft step 2, b1   keys 0 .. n-1, then columns n+3, n+4, n+5             (shift 3 past branch_from = n)

    req_to_token[r]    [ 0 .. n-1 | root | b0s0 b0s1 b0s2 | b1s0 b1s1 b1s2 ]   (the verify's columns)
    verify b1s1        keys 0 .. n, then columns n+4, n+5                    (shift 3 past branch_from = n+1)

Key ``j`` of a query is column ``j + shift`` once ``j >= branch_from``, column ``j`` before: a gather that a
metadata builder runs per forward (``backends/page_table.tree_slot_table``). SGLang's FlashAttention backend
splits the same keys into a prefix part over the request's page table and an expand part over the branch's
own slots (its ``forward_metadata_spec_decode_expand``), merging the two states; the expand part of an SWA
layer must be translated to SWA ids too (SGLang PR 24617), which ``prefix`` marks: keys from there on are
the branch's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class DraftTree:
    """Per query row of one forward: where its own keys leave the request's columns for its branch's."""

    topk: int
    """branches per request"""
    prefix: torch.Tensor
    """[rows] int64 committed tokens of the row's request: keys before it are the request's own, read through
    its page table; from it on they are the tree's (the draft tokens, and in a verify the root)"""
    branch_from: torch.Tensor
    """[rows] int64 the first key read from the row's branch run: ``prefix`` in a draft step, ``prefix + 1``
    in a verify (the root comes first)"""
    shift: torch.Tensor
    """[rows] int64 columns between key ``j >= branch_from`` and its ``req_to_token`` column: ``branch *
    steps``"""
    kv_lens: torch.Tensor | None = None
    """[rows] int64 keys each row attends (a verify's: ``prefix + 1 + depth``); None: the forward's
    ``seq_lens``, which a draft step's rows already are"""

    @property
    def rows(self) -> int:
        return int(self.prefix.shape[0])

    def padded(self, rows: int) -> DraftTree:
        """The tree over a graph bucket of ``rows``: padding rows read their own columns only."""
        def pad(t: torch.Tensor, value: int) -> torch.Tensor:
            out = torch.full((rows,), value, dtype=torch.int64, device=t.device)
            out[: t.shape[0]] = t
            return out

        big = 1 << 30  # no key of a padding row reaches it: nothing shifted
        return DraftTree(topk=self.topk, prefix=pad(self.prefix, big), branch_from=pad(self.branch_from, big),
                         shift=pad(self.shift, 0), kv_lens=None if self.kv_lens is None else pad(self.kv_lens, 1))


def draft_step_tree(prefix_lens: torch.Tensor, *, topk: int, steps: int) -> DraftTree:
    """The tree of every draft step of requests with ``prefix_lens`` committed tokens: rows request-major,
    branch-minor (``bs * topk``), as SGLang's ``draft_forward`` reads one step's row of the permuted slots."""
    prefix = prefix_lens.repeat_interleave(topk)
    branch = torch.arange(topk, device=prefix.device).repeat(prefix_lens.shape[0])
    return DraftTree(topk=topk, prefix=prefix, branch_from=prefix, shift=branch * steps)


def verify_tree(prefix_lens: torch.Tensor, *, topk: int, steps: int) -> DraftTree:
    """The tree of a verify over ``1 + topk * steps`` tokens per request (root, then each branch's run)."""
    per = 1 + topk * steps
    bs = prefix_lens.shape[0]
    node = torch.arange(per, device=prefix_lens.device)
    branch = (node - 1).clamp(min=0) // steps
    depth = torch.where(node == 0, 0, (node - 1) % steps + 1)  # the root is depth 0
    prefix = prefix_lens.repeat_interleave(per)
    return DraftTree(topk=topk, prefix=prefix, branch_from=prefix + 1, shift=(branch * steps).repeat(bs),
                     kv_lens=prefix + 1 + depth.repeat(bs))


def tree_order(by_request: torch.Tensor, *, topk: int, steps: int) -> torch.Tensor:
    """[steps, bs * topk]: the draft's slots (request-major, ``[bs, topk * steps]`` as allocated) one row per
    step, SGLang's ``reshape(bs, topk, steps).permute(2, 0, 1).reshape(steps, -1)``."""
    return by_request.reshape(-1, topk, steps).permute(2, 0, 1).reshape(steps, -1)


def request_order(by_step: torch.Tensor, *, topk: int) -> torch.Tensor:
    """The inverse of ``tree_order``: the flat allocation, request-major, from one row per step."""
    steps = by_step.shape[0]
    return by_step.reshape(steps, -1, topk).permute(1, 2, 0).reshape(-1)

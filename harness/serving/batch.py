"""``ForwardBatch``: the tensors one forward pass reads, shaped like SGLang's."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from .draft_tree import DraftTree
from .loc_plan import KVLocPlan
from .pool import HybridSWAKVPool, ReqToTokenPool


class ForwardMode(enum.Enum):
    EXTEND = "extend"
    """prefill, possibly on top of a cached prefix (chunked prefill continues this way)"""
    DECODE = "decode"
    """one new token per request"""
    DRAFT = "draft"
    """speculative multi-step draft: ``draft_steps`` decode forwards, ``out_cache_loc`` reassigned per step"""
    TARGET_VERIFY = "target_verify"
    """the target model's forward over each request's last token and its draft tokens (``1 + draft_steps`` per
    request): extend-shaped for attention (causal over the new tokens, after the request's prefix)"""
    DRAFT_EXTEND = "draft_extend"
    """the draft model's forward over the tokens the target just kept (a prefill chunk's, or a verify's last
    token and accepted drafts), at the target's slots; it gives the next draft its first token, as SGLang's
    EAGLE worker runs it (``forward_draft_extend``, ``forward_draft_extend_after_decode``): extend-shaped"""

    @property
    def is_decode_like(self) -> bool:
        return self is ForwardMode.DECODE or self is ForwardMode.DRAFT

    @property
    def is_extend_like(self) -> bool:
        """Attention sees several new tokens per request: a prefill or a target verify."""
        return not self.is_decode_like


class VerifyStep(Protocol):
    """The target-verify forward that follows a draft (``batch_builder.VerifyPlan``): built once the draft
    has run, because its slots are allocated only after the draft's are given back."""

    def build(self) -> ForwardBatch:
        """Give the draft's slots back, allocate the verify's, and return its batch."""

    def accept(self) -> None:
        """After the verify ran: the kept tokens' slots at their positions of ``req_to_token``."""

    def release_rejected(self, *, full: bool = True, swa: bool = True) -> None:
        """Free the slots of the draft tokens the verify rejected: in both pools, the SWA pool only
        (``full=False``), or none."""


class DraftExtendStep(Protocol):
    """The draft-extend forward that follows a target forward (``batch_builder.DraftExtend``): built once the
    target ran (and, after a verify, once its rejected drafts went back), over the tokens the target kept; or,
    in SGLang's ``DRAFT_EXTEND_V2`` form (``before_frees``), over the verify's whole window before they go back."""

    @property
    def before_frees(self) -> bool:
        """Run right after the verify forward, before its rejected slots are freed (v2)."""

    def build(self) -> ForwardBatch:
        """The draft-extend batch: its tokens, their slots and a fresh ``out_cache_loc_swa``."""


@dataclass(slots=True, kw_only=True)
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    """[num_tokens] int64"""
    positions: torch.Tensor
    """[num_tokens] int64, position of each token inside its request"""
    req_pool_indices: torch.Tensor
    """[batch_size] int64, rows of req_to_token"""
    seq_lens: torch.Tensor
    """[batch_size] int64, tokens of each request once this forward has run (prefix included)"""
    extend_prefix_lens: torch.Tensor
    """[batch_size] int64, tokens already cached before this forward"""
    extend_seq_lens: torch.Tensor
    """[batch_size] int64, tokens this forward adds per request"""
    out_cache_loc: torch.Tensor
    """[num_tokens] int64, full-pool slot each new token writes"""
    out_cache_loc_swa: torch.Tensor | None
    """[num_tokens] int32, SWA slot each new token writes; precomputed at batch creation. A DRAFT batch's
    holds every draft step's SWA slots ([batch_size * draft_steps], request-major, as SGLang translates the
    draft's whole allocation) until the speculative worker enters a step"""
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: HybridSWAKVPool
    extend_seq_lens_cpu: tuple[int, ...] = ()
    """the same lengths as Python ints, for eager metadata builders"""
    draft_out_cache_loc: torch.Tensor | None = None
    """DRAFT only: [draft_steps, batch_size] full slots, one row per draft step"""
    draft_input_ids: torch.Tensor | None = None
    """DRAFT only: [draft_steps, batch_size] tokens fed at each draft step"""
    kv_loc_plan: KVLocPlan | None = None
    """the iteration's location plan (SGLang 0.5.23), shared by every forward of the iteration"""
    kv_loc_cols: tuple[int, int] = (0, 0)
    """this forward's columns [start, stop) of the plan's ids"""
    draft_step: int | None = None
    """DRAFT only: the draft step this forward runs once the speculative worker stepped into the loop; None
    while the batch stands for the whole multi-step draft (what a draft graph runner takes as one graph)"""
    verify: VerifyStep | None = None
    """DRAFT only: the target-verify forward that follows the draft; None when drafts are kept unverified"""
    draft_extend: DraftExtendStep | None = None
    """EXTEND and TARGET_VERIFY: the draft-extend forward that follows this target forward; None without one"""
    draft_from_extend: bool = False
    """DRAFT only: the draft's first token came from the draft-extend before it, so the draft runs
    ``draft_steps - 1`` forwards over its ``draft_steps`` rows of slots (SGLang's ``draft_forward`` skips the
    last step's forward): the last row is allocated and never written"""
    draft_tree: DraftTree | None = None
    """a tree draft (top-k > 1) and its verify: which keys each row reads (its request's, then its branch's);
    its rows are the batch's (``batch_size`` counts ``requests * topk`` rows in a draft step). None for a chain"""

    @property
    def draft_topk(self) -> int:
        """Branches per request: the rows of a draft step are ``requests * draft_topk``."""
        return 1 if self.draft_tree is None else self.draft_tree.topk

    @property
    def num_requests(self) -> int:
        """Requests of the batch: a tree draft's rows are ``draft_topk`` per request; a verify's batch_size is
        its requests already."""
        if self.forward_mode is ForwardMode.DRAFT:
            return self.batch_size // self.draft_topk
        return self.batch_size

    @property
    def num_tokens(self) -> int:
        return int(self.out_cache_loc.shape[0])

    @property
    def req_to_token(self) -> torch.Tensor:
        return self.req_to_token_pool.req_to_token

    @property
    def draft_steps(self) -> int:
        return 0 if self.draft_out_cache_loc is None else int(self.draft_out_cache_loc.shape[0])

    @property
    def draft_forwards(self) -> int:
        """Forwards the whole draft runs: its steps, one fewer when a draft-extend gave its first token."""
        return max(self.draft_steps - 1, 0) if self.draft_from_extend else self.draft_steps

    def reassign_out_cache_loc(self, loc: torch.Tensor) -> None:
        """Point the batch at new write locations, as a speculative draft step does.

        The precomputed SWA locations belong to the old ``out_cache_loc``, so they are dropped and
        consumers fall back to translating (SGLang PR 24138).
        """
        self.out_cache_loc = loc
        self.out_cache_loc_swa = None

    def enter_draft_step(self, step: int, *, keep_swa_loc: bool = False) -> None:
        """Point a DRAFT batch at draft step ``step``, as SGLang's ``draft_forward`` does: every request one token
        longer per step (a decode-shaped forward), the step's tokens, the step's row of the draft's slots and
        its columns of the iteration's plan (step-major). ``keep_swa_loc``: rebind ``out_cache_loc`` only and
        keep the whole draft's ``out_cache_loc_swa`` (the fault ``stale_swa_after_reassign``)."""
        assert self.draft_out_cache_loc is not None and self.draft_input_ids is not None
        if step > 0:
            self.positions = self.positions + 1
            self.seq_lens = self.seq_lens + 1
            self.extend_prefix_lens = self.extend_prefix_lens + 1
        self.draft_step = step
        self.input_ids = self.draft_input_ids[step]
        if keep_swa_loc:
            self.out_cache_loc = self.draft_out_cache_loc[step]
        else:
            self.reassign_out_cache_loc(self.draft_out_cache_loc[step])
        self.enter_plan_columns(step * self.batch_size)

    def enter_plan_columns(self, start: int) -> None:
        """Point this forward at its own columns of the iteration's plan (a draft step's, say)."""
        self.kv_loc_cols = (start, start + self.num_tokens)


class BackendMetadata(Protocol):
    """What a design may read of the backend's per-forward metadata."""

    out_cache_loc_swa: torch.Tensor | None


class SWALocDesign(Protocol):
    """A rule for where an SWA layer writes its K/V: the seam every design in ``designs.py`` fills."""

    def __call__(
        self, forward_batch: ForwardBatch, pool: HybridSWAKVPool, metadata: BackendMetadata, layer_id: int
    ) -> torch.Tensor: ...


def make_forward_batch(
    *,
    forward_mode: ForwardMode,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: list[int],
    extend_lens: list[int],
    out_cache_loc: torch.Tensor,
    req_to_token_pool: ReqToTokenPool,
    pool: HybridSWAKVPool,
    translate: Callable[[torch.Tensor], torch.Tensor] | None,
    draft_out_cache_loc: torch.Tensor | None = None,
    draft_input_ids: torch.Tensor | None = None,
    kv_loc_plan: KVLocPlan | None = None,
) -> ForwardBatch:
    """Build a batch; ``out_cache_loc_swa`` is translated once here, as SGLang does at batch creation, by
    ``translate`` (the scheduler's serving stack's ``ServingStack.translate``: every slot through the stack);
    None for a stack without an SWA pool, whose batches carry no SWA locations."""
    device = out_cache_loc.device
    prefix = torch.tensor(prefix_lens, dtype=torch.int64, device=device)
    extend = torch.tensor(extend_lens, dtype=torch.int64, device=device)
    return ForwardBatch(
        forward_mode=forward_mode,
        batch_size=len(extend_lens),
        input_ids=input_ids,
        positions=positions,
        req_pool_indices=req_pool_indices,
        seq_lens=prefix + extend,
        extend_prefix_lens=prefix,
        extend_seq_lens=extend,
        extend_seq_lens_cpu=tuple(extend_lens),
        out_cache_loc=out_cache_loc,
        out_cache_loc_swa=translate(out_cache_loc) if translate is not None else None,
        req_to_token_pool=req_to_token_pool,
        token_to_kv_pool=pool,
        draft_out_cache_loc=draft_out_cache_loc,
        draft_input_ids=draft_input_ids,
        kv_loc_plan=kv_loc_plan,
        kv_loc_cols=(0, int(out_cache_loc.shape[0])),
    )

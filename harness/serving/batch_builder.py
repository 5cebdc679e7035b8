"""The scheduler's batch building: the next step's ``ForwardBatch`` from the running and waiting requests.

A step runs an extend batch while any request still has prompt tokens to prefill (chunked by
``chunk_size``), the ones mid-prefill first, then waiting ones after their matched prefix while the chunk
budget lasts; otherwise one decode batch of every running request (or a speculative draft batch of
``draft_steps`` forwards, its slots allocated at once per request and read step-major, as SGLang's EAGLE
worker lays them out). A timeline with ``accept_lens`` follows each draft with a target-verify forward
(``VerifyPlan``): the draft's slots go back, ``1 + steps`` slots per request are allocated for the verify,
and once it ran the rejected draft tokens' slots are freed in both pools. With ``draft_topk`` > 1 a draft is a
tree of that many branches per request (``draft_tree.py``), its verify tree-masked and accepting along one
branch. With ``draft_extend`` every target forward (a prefill chunk, a verify) is followed by a draft-extend
forward over the tokens it kept (``DraftExtend``; with ``draft_extend = "v2"``, after a verify, over its whole
window before the rejected slots are freed), and each draft runs one forward fewer than its steps. Slots,
rows and the batch's SWA locations come from the run's serving stack (``ServingStack.translate``), never a pool
directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .batch import ForwardBatch, ForwardMode, make_forward_batch
from .draft_tree import draft_step_tree, tree_order, verify_tree
from .eviction_driver import EvictionDriver
from .loc_plan import KVIndexTranslator
from .pool import PoolExhausted
from .requests import Req, RequestBook
from .stack import ServingStack
from .timeline import TimelineSpec, TokenKey


@dataclass(slots=True, kw_only=True)
class ScheduledStep:
    index: int
    batch: ForwardBatch
    forwards: tuple[tuple[TokenKey, ...], ...]
    """owner of each token row, per forward (a draft step runs several forwards)"""
    aborted: tuple[str, ...] = ()
    """requests aborted (both pools freed) before this step's batch was built"""

    @property
    def kind(self) -> str:
        return self.batch.forward_mode.value


@dataclass(slots=True, kw_only=True)
class DraftExtend:
    """The draft-extend forward after a target forward, as SGLang's EAGLE worker runs it: the draft model over
    the tokens the target kept, at the slots the target wrote them to, which gives the next draft its first
    token. After a prefill chunk that is the chunk (``forward_draft_extend``); after a verify, each request's
    last token and its accepted drafts (``forward_draft_extend_after_decode``: ``accept_length + 1`` tokens per
    request, positions ``prefix .. prefix + accepted``). The batch is built afresh, so its ``out_cache_loc_swa``
    is translated at creation, as ``ForwardBatch.init_new`` does for SGLang's draft-extend batch. The
    miniature's draft model is the target, so a correct draft-extend rewrites the K/V the target wrote.

    SGLang 0.5.23's form (``timeline.draft_extend = "v2"``, its ``DRAFT_EXTEND_V2``) runs after a verify over the
    verify's whole window instead: every request's ``1 + steps`` tokens at the verify's slots and positions
    ``prefix .. prefix + steps``, right after the verify forward and before its rejected slots are freed
    (``over_verify``), so it writes the rejected drafts' slots too while they are still held."""

    builder: BatchBuilder
    reqs: list[Req]
    prefix_lens: list[int]
    extend_lens: list[int]
    slots: torch.Tensor
    """the tokens' full slots, request-major: the kept ones (v1), or the verify's whole allocation (v2)"""
    over_verify: VerifyPlan | None = None
    """v2 only: the verify whose window this draft-extend covers; it must run before that verify's rejected
    slots go back (``VerifyPlan.release_rejected``)"""

    @property
    def before_frees(self) -> bool:
        """The speculative worker runs this draft-extend before the verify's rejected slots are freed."""
        return self.over_verify is not None

    def build(self) -> ForwardBatch:
        if self.over_verify is not None and self.over_verify.released:
            raise RuntimeError("a V2 draft-extend runs over the verify's whole window, rejected drafts included: "
                               "it must be built before the verify's rejected slots are freed")
        b, device = self.builder, self.builder.book.device
        ids = [req.tokens[pre : pre + n] for req, pre, n in zip(self.reqs, self.prefix_lens, self.extend_lens,
                                                                  strict=True)]
        positions = [torch.arange(pre, pre + n) for pre, n in zip(self.prefix_lens, self.extend_lens, strict=True)]
        return make_forward_batch(
            forward_mode=ForwardMode.DRAFT_EXTEND,
            input_ids=torch.cat(ids).to(device),
            positions=torch.cat(positions).to(device),
            req_pool_indices=torch.tensor([r.row for r in self.reqs], dtype=torch.int64, device=device),
            prefix_lens=self.prefix_lens,
            extend_lens=self.extend_lens,
            out_cache_loc=self.slots,
            req_to_token_pool=b.stack.req_to_token_pool,
            pool=b.stack.pool,
            translate=b._translate,
            kv_loc_plan=b.translator.own_plan(b.book.step, self.slots),
        )


@dataclass(slots=True, kw_only=True)
class VerifyPlan:
    """The target-verify forward of one draft iteration, as SGLang's EAGLE worker runs it after the draft.

    SGLang allocates the draft's slots with a backup of the allocator's state and restores it after the draft
    (the draft's K/V lives in the draft model's pool at those indices), then allocates ``bs * (1 + steps)``
    slots for the verify (``prepare_for_verify``): each request's last token and its draft tokens, at
    positions ``prefix .. prefix + steps``. The miniature's draft and target share one pool, so giving the
    draft's slots back frees them (both pools), and the verify's allocation reuses them. After the verify the
    first ``1 + accepted`` tokens of each request are kept as its tokens and the rest are freed in both pools
    (SGLang's ``evict_mask`` over ``out_cache_loc``). Pages of one token only: a draft continuing a page
    would give that page back with it.

    A tree draft (``topk`` > 1) verifies ``1 + topk * steps`` tokens per request: the root, then each branch's
    run, written in that order to ``req_to_token`` and attended with the tree mask (each token's keys its
    ancestors only, ``draft_tree.verify_tree``). The verify accepts along one branch (``branch``): the root and
    that branch's first ``accepted`` tokens are kept, rewritten to ``req_to_token`` at the request's next
    positions once the verify has run (SGLang re-assigns the accepted slots the same way), and every other
    slot, the other branches' included, is rejected.
    """

    builder: BatchBuilder
    reqs: list[Req]
    prefix_lens: list[int]
    steps: int
    accepted: int
    draft_slots: torch.Tensor
    """the draft's whole allocation, request-major"""
    topk: int = 1
    """branches of the draft"""
    branch: int = 0
    """the branch the verify accepts along"""
    kept: list[torch.Tensor] = field(default_factory=list)
    """per request, the verify slots it keeps (filled by ``build``)"""
    rejected: list[torch.Tensor] = field(default_factory=list)
    """per request, the verify slots of its rejected draft tokens (filled by ``build``)"""
    released: bool = False
    """``release_rejected`` ran: the rejected slots are free (or, under a fault, deliberately kept)"""

    def build(self) -> ForwardBatch:
        if self.rejected:
            raise RuntimeError("the verify of this draft is built already: its draft's slots went back then")
        b = self.builder
        b.stack.free(self.draft_slots)  # restore_state: the draft's slots go back before the verify allocates
        b.held_branches = []
        for req, pre in zip(self.reqs, self.prefix_lens, strict=True):
            del req.slots[pre:]
            req.seq_len = pre
        steps, topk = self.steps, self.topk
        per = 1 + topk * steps
        flat = b._alloc(prefix_lens=self.prefix_lens, extend_lens=[per] * len(self.reqs),
                        last_locs=[r.last_loc for r in self.reqs])
        by_request = flat.view(len(self.reqs), per)
        # the tree's nodes: the root, then each branch's run; the kept ones are the root and the accepted
        # branch's first tokens (for a chain: the first 1 + accepted)
        keep = torch.tensor([0, *range(1 + self.branch * steps, 1 + self.branch * steps + self.accepted)])
        rejected = torch.ones(per, dtype=torch.bool)
        rejected[keep] = False
        depth = torch.tensor([0, *(i + 1 for _ in range(topk) for i in range(steps))])
        vocab = b.book.vocab_size
        ids, positions = [], []
        for i, (req, pre) in enumerate(zip(self.reqs, self.prefix_lens, strict=True)):
            b.stack.write_req_to_token(req.row, pre, by_request[i])
            kept = by_request[i, keep.to(flat.device)]
            self.kept.append(kept)
            req.slots.extend(kept.tolist())
            req.seq_len = pre + len(keep)
            self.rejected.append(by_request[i, rejected.to(flat.device)])
            ids.append(torch.cat([req.tokens[pre : pre + 1],
                                  *(branch_tokens(req.tokens[pre + 1 : pre + 1 + steps], k, self.branch, vocab)
                                    for k in range(topk))]))
            positions.append(pre + depth)
        device = b.book.device
        prefix = torch.tensor(self.prefix_lens, dtype=torch.int64, device=device)
        batch = make_forward_batch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            input_ids=torch.cat(ids).to(device),
            positions=torch.cat(positions).to(device),
            req_pool_indices=torch.tensor([r.row for r in self.reqs], dtype=torch.int64, device=device),
            prefix_lens=self.prefix_lens,
            extend_lens=[per] * len(self.reqs),
            out_cache_loc=flat,
            req_to_token_pool=b.stack.req_to_token_pool,
            pool=b.stack.pool,
            translate=b._translate,
            kv_loc_plan=b.translator.own_plan(b.book.step, flat),
        )
        if topk > 1:
            batch.draft_tree = verify_tree(prefix, topk=topk, steps=steps)
        if b.timeline.draft_extend_v2:  # a chain's (a tree has no draft-extend: TimelineSpec.problems)
            # SGLang's DRAFT_EXTEND_V2: the verify's tokens, positions and every one of its slots
            batch.draft_extend = DraftExtend(builder=b, reqs=self.reqs, prefix_lens=self.prefix_lens,
                                             extend_lens=[per] * len(self.reqs), slots=flat, over_verify=self)
        elif b.timeline.draft_extend:
            batch.draft_extend = DraftExtend(builder=b, reqs=self.reqs, prefix_lens=self.prefix_lens,
                                             extend_lens=[len(keep)] * len(self.reqs), slots=torch.cat(self.kept))
        return batch

    def accept(self) -> None:
        """After the verify: the kept slots at each request's next positions of ``req_to_token`` (a chain's
        are there already; a tree's accepted branch may not be the first)."""
        if self.topk == 1:
            return
        for req, pre, kept in zip(self.reqs, self.prefix_lens, self.kept, strict=True):
            self.builder.stack.write_req_to_token(req.row, pre, kept)

    def release_rejected(self, *, full: bool = True, swa: bool = True) -> None:
        if full and not swa:
            raise ValueError("the serving stack frees full slots only together with their SWA slots")
        self.released = True
        rejected = torch.cat(self.rejected) if self.rejected else self.draft_slots[:0]
        if rejected.numel() == 0 or not swa:
            return
        if full:
            self.builder.stack.free(rejected)
        else:
            self.builder.stack.free_swa(rejected)  # the eviction's free: the full slots stay handed out


def branch_tokens(own: torch.Tensor, branch: int, accepted: int, vocab_size: int) -> torch.Tensor:
    """The tokens a tree draft's ``branch`` carries where the request's own are ``own``: those on the branch the
    verify accepts, others elsewhere (each rejected branch its own shift of them), so a query that read another
    branch's slots would attend over other K/V, which the KV diff and the dense oracle see."""
    if branch == accepted:
        return own
    return (own + 1 + branch) % vocab_size


def _owner(rid: str, pos: int, branch: int, accepted: int) -> TokenKey:
    return TokenKey(rid, pos) if branch == accepted else TokenKey(rid, pos, branch=branch)


class BatchBuilder:
    """Builds each step's batch for the scheduler, over its request book."""

    def __init__(self, book: RequestBook, *, stack: ServingStack, timeline: TimelineSpec,
                 translator: KVIndexTranslator, driver: EvictionDriver) -> None:
        self.book = book
        self.stack = stack
        self.timeline = timeline
        self.translator = translator
        self.driver = driver
        self.cache = driver.cache
        # only a stack with an SWA pool has SWA locations to precompute (SGLang's hybrid pools)
        self._translate = stack.translate if stack.asks_swa_design else None
        self._verifies = 0
        """decode iterations verified so far: the index into ``timeline.accept_lens``"""
        self.held_branches: list[tuple[Req, int, int, int]] = []
        """(request, position, branch, full slot) of each token of a tree draft's branches other than the one
        the requests' positions hold: the draft owns their slots from its batch build until its verify gives the
        draft's allocation back (``VerifyPlan.build``); empty otherwise"""

    def next_step_pages(self) -> int:
        """Pages (of each pool) the batch ``next_step`` would build now allocates."""
        page = self.stack.page_size

        def opening(pre: int, n: int) -> int:
            return -(-(pre + n) // page) - -(-pre // page)

        prefilling = [r for r in self.book.running if r.prefilling]
        if prefilling or self.book.waiting:
            return sum(opening(req.seq_len if req.row >= 0 else self.driver.matched(req), n)
                       for req, n in self._plan_extend(prefilling))
        steps = self._decode_steps(self.book.running) if self.book.running else 0
        topk = self.timeline.draft_topk if steps > 0 else 1
        return sum(opening(r.seq_len + i, 1) for i in range(steps * topk) for r in self.book.running)

    def _alloc(self, *, prefix_lens: list[int], extend_lens: list[int], last_locs: list[int]) -> torch.Tensor:
        """Slots from the stack; when a pool runs out with a prefix cache, the cache gives some back first."""
        while True:
            try:
                return self.stack.alloc_extend(prefix_lens=prefix_lens, extend_lens=extend_lens, last_locs=last_locs)
            except PoolExhausted as exc:
                if self.cache is None or not self.cache.evict(exc.field):
                    raise

    def build(self) -> ScheduledStep | None:
        self.held_branches = []
        prefilling = [r for r in self.book.running if r.prefilling]
        if prefilling or self.book.waiting:
            return self._build_extend(prefilling)
        if self.book.running:
            return self._build_decode()
        return None

    def _plan_extend(self, prefilling: list[Req]) -> list[tuple[Req, int]]:
        """The requests of the next extend batch and how many tokens each adds: the ones mid-prefill first,
        then waiting ones (after their matched prefix) while the chunk budget lasts."""
        budget = self.timeline.chunk_size or 1 << 30
        chosen: list[tuple[Req, int]] = []
        for req in prefilling:
            if budget <= 0:
                break
            n = min(req.spec.prompt_len - req.seq_len, budget)
            chosen.append((req, n))
            budget -= n
        for req in self.book.waiting:
            if budget <= 0:
                break
            n = min(req.spec.prompt_len - self.driver.matched(req), budget)
            chosen.append((req, n))
            budget -= n
        return chosen

    def _build_extend(self, prefilling: list[Req]) -> ScheduledStep:
        if self.cache is not None:
            for req in self.book.waiting:
                if req.lease is None:
                    self.driver.match(req)  # arrived while nothing ran: matched at admission
        chosen = self._plan_extend(prefilling)
        for req, _ in chosen:
            if req.row >= 0:
                continue  # already running: mid-prefill
            self.book.admit(req)
            if self.cache is not None:
                self.driver.admit_shared(req)
        self.driver.evict_batch([req for req, _ in chosen])
        ids, positions, rows, prefix_lens, extend_lens, locs, owners = [], [], [], [], [], [], []
        for req, n in chosen:
            start = req.seq_len
            slots = self._alloc(prefix_lens=[start], extend_lens=[n], last_locs=[req.last_loc])
            self.stack.write_req_to_token(req.row, start, slots)
            req.slots.extend(slots.tolist())
            ids.append(req.tokens[start : start + n])
            positions.append(torch.arange(start, start + n))
            rows.append(req.row)
            prefix_lens.append(start)
            extend_lens.append(n)
            locs.append(slots)
            owners.extend(TokenKey(req.spec.rid, p) for p in range(start, start + n))
            req.seq_len += n
        out_cache_loc = torch.cat(locs)
        batch = make_forward_batch(
            forward_mode=ForwardMode.EXTEND,
            input_ids=torch.cat(ids).to(self.book.device),
            positions=torch.cat(positions).to(self.book.device),
            req_pool_indices=torch.tensor(rows, dtype=torch.int64, device=self.book.device),
            prefix_lens=prefix_lens,
            extend_lens=extend_lens,
            out_cache_loc=out_cache_loc,
            req_to_token_pool=self.stack.req_to_token_pool,
            pool=self.stack.pool,
            translate=self._translate,
            kv_loc_plan=self.translator.own_plan(self.book.step, out_cache_loc),
        )
        if not self.timeline.draft_extend:
            return ScheduledStep(index=self.book.step, batch=batch, forwards=(tuple(owners),))
        # EAGLE's draft model extends over the chunk the target prefilled, at the same slots
        batch.draft_extend = DraftExtend(builder=self, reqs=[req for req, _ in chosen], prefix_lens=prefix_lens,
                                         extend_lens=extend_lens, slots=out_cache_loc)
        return ScheduledStep(index=self.book.step, batch=batch, forwards=(tuple(owners), tuple(owners)))

    def _build_decode(self) -> ScheduledStep:
        reqs = list(self.book.running)
        self.driver.evict_batch(reqs)
        steps = self._decode_steps(reqs)
        # a verify writes one token past the draft, so a request one token from its end decodes plainly
        draft = self.timeline.draft_steps > 0 and (steps > 0 or not self.timeline.verifies)
        steps = max(steps, 1)
        topk = self.timeline.draft_topk if draft else 1
        # SGLang's EAGLE worker allocates every draft step's slots at once (bs * topk * steps), each request's
        # run of them contiguous in req_to_token, branch after branch (``assign_draft_cache_locs``); the draft
        # loop then reads them step-major, one row of bs * topk per step (``draft_tree.tree_order``)
        flat = self._alloc(prefix_lens=[r.seq_len for r in reqs], extend_lens=[topk * steps] * len(reqs),
                           last_locs=[r.last_loc for r in reqs])
        by_request = flat.view(len(reqs), topk * steps)
        accepted_branch = self.timeline.accepted_branch(self._verifies) if topk > 1 else 0
        ids = torch.zeros((steps, len(reqs) * topk), dtype=torch.int64)
        for b, req in enumerate(reqs):
            self.stack.write_req_to_token(req.row, req.seq_len, by_request[b])
            # the request's positions hold the first branch's slots until a verify says which are kept
            req.slots.extend(by_request[b, :steps].tolist())
            self.held_branches.extend((req, req.seq_len + i, k, slot) for k in range(1, topk)
                                      for i, slot in enumerate(by_request[b, k * steps : (k + 1) * steps].tolist()))
            for k in range(topk):
                ids[:, b * topk + k] = branch_tokens(req.tokens[req.seq_len : req.seq_len + steps], k,
                                                     accepted_branch, self.book.vocab_size)
        # after a draft-extend the draft's first token is given, so its last row of slots is never written
        runs = self.timeline.draft_forwards(steps) if draft else steps
        forwards = tuple(tuple(_owner(r.spec.rid, r.seq_len + i, k, accepted_branch) for r in reqs
                               for k in range(topk)) for i in range(runs))
        verify = None
        if draft and self.timeline.verifies:
            verify = VerifyPlan(builder=self, reqs=reqs, prefix_lens=[r.seq_len for r in reqs], steps=steps,
                                accepted=self.timeline.accepted(self._verifies, steps), draft_slots=flat,
                                topk=topk, branch=accepted_branch)
            self._verifies += 1
            nodes = ((0, accepted_branch), *((i + 1, k) for k in range(topk) for i in range(steps)))
            forwards += (tuple(_owner(r.spec.rid, r.seq_len + d, k, accepted_branch) for r in reqs
                               for d, k in nodes),)
            if self.timeline.draft_extend:  # a chain's (a tree has no draft-extend: TimelineSpec.problems)
                # v2 runs over the verify's whole window, v1 over the kept tokens
                covered = 1 + (steps if self.timeline.draft_extend_v2 else verify.accepted)
                forwards += (tuple(TokenKey(r.spec.rid, r.seq_len + i) for r in reqs for i in range(covered)),)
        step_rows = tree_order(by_request, topk=topk, steps=steps)
        prefix_lens = [r.seq_len for r in reqs for _ in range(topk)]
        for req in reqs:
            req.seq_len += steps
            req.decoded += 1
        batch = make_forward_batch(
            forward_mode=ForwardMode.DRAFT if draft else ForwardMode.DECODE,
            input_ids=ids[0].to(self.book.device),
            positions=torch.tensor(prefix_lens, dtype=torch.int64, device=self.book.device),
            req_pool_indices=torch.tensor([r.row for r in reqs for _ in range(topk)], dtype=torch.int64,
                                          device=self.book.device),
            prefix_lens=prefix_lens,
            extend_lens=[1] * len(prefix_lens),
            out_cache_loc=step_rows[0],
            req_to_token_pool=self.stack.req_to_token_pool,
            pool=self.stack.pool,
            translate=self._translate,
            draft_out_cache_loc=step_rows if draft else None,
            draft_input_ids=ids.to(self.book.device) if draft else None,
            kv_loc_plan=self.translator.own_plan(self.book.step, step_rows.reshape(-1)),
        )
        batch.verify = verify
        if topk > 1:
            batch.draft_tree = draft_step_tree(torch.tensor(prefix_lens[::topk], dtype=torch.int64,
                                                            device=self.book.device), topk=topk, steps=steps)
        batch.draft_from_extend = draft and self.timeline.draft_extend
        if draft and self._translate is not None:
            # SGLang builds the draft's ForwardBatch over the whole allocation, so its out_cache_loc_swa holds
            # every step's SWA slots (request-major, as allocated) until a draft step replaces it
            batch.out_cache_loc_swa = self._translate(flat)
        return ScheduledStep(index=self.book.step, batch=batch, forwards=forwards)

    def _decode_steps(self, reqs: list[Req]) -> int:
        """Forwards of the next decode step: one, or the draft length (no request drafting past its end; with
        a verify, whose last token is one past the draft, none drafting to its end: 0 then)."""
        if self.timeline.draft_steps > 0:
            room = min(r.total_len - r.seq_len for r in reqs) - (1 if self.timeline.verifies else 0)
            return min(self.timeline.draft_steps, room)
        return 1

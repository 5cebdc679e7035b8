"""A request timeline and the token bookkeeping types every layer above the scheduler shares.

Plain data only: the scheduler turns a ``TimelineSpec`` into batches, and the checking code names tokens
by ``TokenKey`` (request id and position) without importing the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # plain data: only the token streams are tensors, drawn where they are asked for
    import torch

# Counts past this are typos for a harness whose timelines are tiny; honouring them would make the load-time
# dry run spin through millions of empty steps.
_LIMIT = 1 << 20
_TOPK_LIMIT = 64
"""branches per request past this are typos: every branch is a row of every draft step"""
SEED_MAX = (1 << 63) - 1
"""seeds go to torch.Generator.manual_seed, which takes a signed 64-bit integer"""
DRAFT_EXTEND_V2 = "v2"
"""``timeline.draft_extend``'s value for SGLang 0.5.23's draft-extend (``ForwardMode.DRAFT_EXTEND_V2``)"""
DRAFT_EXTEND_VALUES = 'true, false or "v2"'
"""what ``timeline.draft_extend`` accepts, as its error messages name it"""


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestSpec:
    rid: str
    arrive: int = 0
    """step at which the request joins the waiting queue"""
    prompt_len: int
    output_len: int = 0
    """tokens decoded after the prompt; the request finishes once they are written"""
    abort: int | None = None
    """step at which the request is aborted (before that step's batch is built)"""
    prefix_of: str | None = None
    """the rid of an earlier request whose token stream this one starts with (a shared system prompt, the
    previous turn of a conversation): what a prefix cache can match"""
    shared_len: int = 0
    """how many leading tokens it shares with ``prefix_of`` (that request's prompt and output count)"""

    def problems(self) -> list[str]:
        out = []
        if not self.rid.strip() or not self.rid.isprintable():
            out.append(f"rid: expected a non-empty printable string, got {self.rid!r}")
        for name, lo in (("arrive", 0), ("prompt_len", 1), ("output_len", 0), ("shared_len", 0)):
            value = getattr(self, name)
            if not lo <= value <= _LIMIT:
                out.append(f"{name}: expected an integer from {lo} to {_LIMIT}, got {value}")
        if self.prefix_of is None:
            if self.shared_len:
                out.append(f"shared_len: needs prefix_of, the request whose tokens are shared (got {self.shared_len})")
        elif not self.prefix_of.strip() or not self.prefix_of.isprintable():
            out.append(f"prefix_of: expected a request id, got {self.prefix_of!r}")
        elif self.prefix_of == self.rid:
            out.append(f"prefix_of: a request cannot share the prefix of itself ({self.rid!r})")
        elif self.shared_len < 1:
            out.append(f"shared_len: expected at least 1 token shared with {self.prefix_of!r}, got {self.shared_len}")
        elif self.shared_len > self.prompt_len:
            out.append(f"shared_len: must not exceed prompt_len (got {self.shared_len} > {self.prompt_len})")
        if self.abort is not None:
            if not 0 <= self.abort <= _LIMIT:
                out.append(f"abort: expected an integer from 0 to {_LIMIT}, got {self.abort}")
            elif self.abort <= self.arrive:
                out.append(f"abort: must come after arrive (got {self.abort} <= {self.arrive})")
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class TimelineSpec:
    requests: tuple[RequestSpec, ...]
    chunk_size: int | None = None
    """token budget of one extend batch; None prefills whole prompts"""
    draft_steps: int = 0
    """>0: decode runs as speculative drafts of this many forwards per step"""
    draft_topk: int = 1
    """draft branches per request (SGLang's ``speculative_eagle_topk``): >1 drafts a tree of that many branches
    of ``draft_steps`` tokens each, verified with a tree mask; needs ``accept_lens``"""
    accept_lens: tuple[int, ...] = ()
    """draft tokens the target-verify forward accepts, one entry per decode iteration (the list cycles), the
    same for every request of the iteration and capped at the draft's steps; empty: no verify forward and
    every draft kept as it was written (the flow without target-verify)"""
    draft_extend: bool | str = False
    """after each target forward (a prefill chunk, a verify) a draft-extend forward, which gives the next draft
    its first token: each draft then runs ``draft_steps - 1`` forwards, as SGLang's EAGLE worker runs them;
    needs ``accept_lens`` and two draft steps or more. ``True``: SGLang's v1 form, after a verify over each
    request's kept ``1 + accepted`` tokens once the rejected ones went back; ``"v2"`` (``DRAFT_EXTEND_V2``, the
    only form of SGLang 0.5.23): over the verify's whole window, its ``1 + steps`` tokens per request at the
    verify's slots, before the rejected ones go back. After a prefill chunk both run over the chunk."""
    seed: int = 0
    max_steps: int = 512

    def problems(self) -> list[str]:
        """Every rule the timeline breaks, as ``key.path: what is wrong`` relative to the timeline."""
        out = []
        if not 0 <= self.seed <= SEED_MAX:
            out.append(f"seed: expected an integer from 0 to {SEED_MAX}, got {self.seed}")
        if self.chunk_size is not None and not 1 <= self.chunk_size <= _LIMIT:
            out.append(f"chunk_size: expected an integer from 1 to {_LIMIT}, got {self.chunk_size}")
        if not 0 <= self.draft_steps <= _LIMIT:
            out.append(f"draft_steps: expected an integer from 0 to {_LIMIT}, got {self.draft_steps}")
        if not 1 <= self.draft_topk <= _TOPK_LIMIT:
            out.append(f"draft_topk: expected an integer from 1 to {_TOPK_LIMIT}, got {self.draft_topk}")
        elif self.draft_topk > 1 and not (self.draft_steps and self.accept_lens):
            # the branches that are not accepted are freed by the verify only: kept unverified they would leak
            out.append(f"draft_topk: a tree of drafts needs draft_steps and accept_lens (its verify frees the "
                       f"branches it rejects); got draft_topk {self.draft_topk} with draft_steps {self.draft_steps} "
                       f"and accept_lens {list(self.accept_lens)}")
        if self.accept_lens and not self.draft_steps:
            out.append(f"accept_lens: a verify needs drafts to accept; set draft_steps (got accept_lens "
                       f"{list(self.accept_lens)} with draft_steps 0)")
        elif len(self.accept_lens) > _LIMIT:
            out.append(f"accept_lens: expected at most {_LIMIT} entries, got {len(self.accept_lens)}")
        else:
            for i, n in enumerate(self.accept_lens):
                if not 0 <= n <= self.draft_steps:
                    out.append(f"accept_lens[{i}]: expected an integer from 0 to draft_steps ({self.draft_steps}), "
                               f"got {n}")
        if self.draft_extend is not True and self.draft_extend is not False and self.draft_extend != DRAFT_EXTEND_V2:
            out.append(f"draft_extend: expected {DRAFT_EXTEND_VALUES} (SGLang's DRAFT_EXTEND_V2), "
                       f"got {self.draft_extend!r}")
        elif self.draft_extend and self.draft_topk > 1:
            # the draft-extend covers a chain's kept tokens; a tree's accepted branch moves its slots first
            out.append(f"draft_extend: tree drafts (draft_topk {self.draft_topk}) with a draft-extend are not "
                       "modelled; set draft_topk to 1 or draft_extend to false")
        elif self.draft_extend and not self.verifies:
            out.append("draft_extend: a draft-extend runs over the tokens a verify kept; set accept_lens")
        elif self.draft_extend and self.draft_steps < 2:
            # the draft-extend gives the first draft token, so a one-step draft would run no forward at all
            out.append(f"draft_extend: expected draft_steps of 2 or more, got {self.draft_steps}")
        if not 1 <= self.max_steps <= _LIMIT:
            out.append(f"max_steps: expected an integer from 1 to {_LIMIT}, got {self.max_steps}")
        if not self.requests:
            out.append("requests: expected at least one request")
        first_by_rid: dict[str, int] = {}
        for i, req in enumerate(self.requests):
            at = f"requests[{i}]"
            out.extend(f"{at}.{p}" for p in req.problems())
            if req.arrive >= self.max_steps and 1 <= self.max_steps:
                # the scheduler would spin to max_steps and give up without ever admitting the request
                out.append(f"{at}.arrive: must come before timeline.max_steps (got {req.arrive} >= {self.max_steps})")
            if req.rid in first_by_rid:
                out.append(f"{at}.rid: duplicate rid {req.rid!r}; requests[{first_by_rid[req.rid]}] has it")
            else:
                first_by_rid[req.rid] = i
        for i, req in enumerate(self.requests):
            if req.prefix_of is None or req.problems():
                continue
            at = f"requests[{i}]"
            if req.prefix_of not in first_by_rid:
                out.append(f"{at}.prefix_of: no request has rid {req.prefix_of!r}")
                continue
            j = first_by_rid[req.prefix_of]
            source = self.requests[j]
            if source.arrive >= req.arrive:
                # the shared tokens are copied from the earlier stream, and only an earlier request can be cached
                out.append(f"{at}.prefix_of: requests[{j}] ({source.rid!r}) must arrive before this one "
                           f"(got {source.arrive} >= {req.arrive})")
            elif req.shared_len > source.prompt_len + source.output_len:
                out.append(f"{at}.shared_len: {source.rid!r} has only {source.prompt_len + source.output_len} tokens "
                           f"(prompt and output), got {req.shared_len}")
        return out


    @property
    def verifies(self) -> bool:
        """Each draft is followed by a target-verify forward that accepts ``accept_lens`` of its tokens."""
        return bool(self.accept_lens)

    @property
    def draft_extend_v2(self) -> bool:
        """The draft-extend after a verify runs over the verify's whole window, before its rejected slots are
        freed (SGLang's ``DRAFT_EXTEND_V2``)."""
        return self.draft_extend == DRAFT_EXTEND_V2

    def draft_forwards(self, steps: int) -> int:
        """Forwards a draft of ``steps`` tokens runs: one fewer after a draft-extend, which gave the first."""
        return steps - 1 if self.draft_extend else steps

    def accepted(self, iteration: int, steps: int) -> int:
        """Draft tokens the verify of decode iteration ``iteration`` (0-based) accepts of ``steps`` drafted."""
        return min(self.accept_lens[iteration % len(self.accept_lens)], steps)

    def accepted_branch(self, iteration: int) -> int:
        """The branch of a tree draft whose tokens the verify of iteration ``iteration`` accepts: each in turn
        (``iteration % draft_topk``), so the kept slots are not always the first branch's; 0 for a chain."""
        return iteration % self.draft_topk


@dataclass(frozen=True, slots=True)
class TokenKey:
    rid: str
    pos: int
    branch: int | None = None
    """None: the request's own token at ``pos``; a tree draft's branch (top-k > 1) that the verify rejects, whose
    rows carry other tokens than the request's (no dense oracle stream holds them)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveToken:
    rid: str
    pos: int
    slots: tuple[int, ...]
    """the slot the token holds in each KV group of its stack, in the groups' order (``kv_groups.KVGroups``;
    SGLang's: the full slot, then the SWA slot); 0 in a windowed group once evicted from it"""
    in_window: bool
    """among the W-1 latest tokens of its request, which its next query reads: its slot in every windowed
    group must hold its K/V"""
    past_frontier: bool = False
    """the eviction policy has freed this token's windowed slots by now: it must hold none"""
    shared: bool = False
    """its slots are the prefix cache's (a matched prefix, or this request's own tokens once cached): the
    request reads them, the cache owns and frees them"""
    branch: int | None = None
    """a tree draft's branch other than the one the request's positions hold (top-k > 1): its slots are the
    draft's from the batch build until the verify gives the draft's allocation back; None for the request's
    own token"""

    @property
    def who(self) -> str:
        """``rid@pos``, with the branch of a tree draft's token, as violations name a token"""
        return f"{self.rid}@{self.pos}" + (f" (draft branch {self.branch})" if self.branch is not None else "")


def request_tokens(timeline: TimelineSpec, vocab_size: int) -> dict[str, torch.Tensor]:
    """The teacher-forced token stream (prompt then output) of every request, drawn from the timeline seed;
    a request with ``prefix_of`` starts with the first ``shared_len`` tokens of that request's stream."""
    import torch

    gen = torch.Generator().manual_seed(timeline.seed)
    tokens = {
        r.rid: torch.randint(vocab_size, (r.prompt_len + r.output_len,), generator=gen) for r in timeline.requests
    }
    # every stream is drawn first, so sharing changes no other request's tokens; in arrival order, so a
    # chain (c shares b's prefix, b shares a's) copies from a stream that already holds its shared part
    for r in sorted(timeline.requests, key=lambda r: r.arrive):
        if r.prefix_of is not None:
            tokens[r.rid][: r.shared_len] = tokens[r.prefix_of][: r.shared_len]
    return tokens

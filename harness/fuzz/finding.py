"""A failure the fuzzer found: the smallest run seen that breaks the property, its verdict, and the signature
that tells two failures apart.

The signature is the first divergence's kind, not its place: the outcome and the KV group of the first bad
slot (or the error's type and message, numbers blanked). The slot's class is left out: whether a clobbered
slot reads as ``overwritten`` or ``drift`` depends on whether its bytes happen to be another live token's. Two timelines that break the same way have
one signature however their steps and slots differ, so they are one finding, shrunk once and written once.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from ..check.matrix.verdict import Verdict
from ..runspec import RunSpec
from .target import FuzzTarget

_NUMBER = re.compile(r"\d+")
_SIGNATURE_MESSAGE = 120


def signature(verdict: Verdict) -> str:
    """What kind of failure ``verdict`` is, in one line that does not depend on steps, slots or sizes."""
    if verdict.error is not None:
        message = _NUMBER.sub("N", " ".join(verdict.error.message.split()))[:_SIGNATURE_MESSAGE]
        return f"{verdict.outcome}: {verdict.error.type}: {message}"
    first = verdict.first
    if first is None:
        return str(verdict.outcome)
    where = "hidden states" if first.pool == "hidden" else f"{first.pool} pool"
    return f"{verdict.outcome} in the {where}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    target: FuzzTarget
    signature: str
    spec: RunSpec
    """the last failing run of this signature Hypothesis tried: after shrinking, its minimal one"""
    verdict: Verdict
    examples: int
    """failing runs of this signature seen, shrink steps included"""

    @property
    def key(self) -> str:
        """A short stable name of (target, signature): the regression file's suffix."""
        text = f"{self.target.label}\n{self.signature}"
        return hashlib.sha256(text.encode()).hexdigest()[:8]

    def describe(self) -> str:
        """The finding as a person reads it: the shrunk timeline in a line, and what went wrong first."""
        t = self.spec.timeline
        requests = ", ".join(
            f"{r.rid}(arrive {r.arrive}, prompt {r.prompt_len}, output {r.output_len}"
            + (f", shares {r.shared_len} of {r.prefix_of}" if r.prefix_of is not None else "")
            + (f", abort {r.abort}" if r.abort is not None else "") + ")" for r in t.requests)
        ev = self.spec.eviction
        extras = [f"chunk {t.chunk_size}" if t.chunk_size else "", f"{t.draft_steps} draft steps" if t.draft_steps else "",
                  f"a tree of {t.draft_topk} branches" if t.draft_topk > 1 else "",
                  f"verify accepts {list(t.accept_lens)}" if t.accept_lens else "",
                  ("draft-extend v2" if t.draft_extend_v2 else "draft-extend") if t.draft_extend else "",
                  "prefix cache" if ev.prefix_cache else "",
                  f"eviction {ev.policy} every {ev.interval}" if ev.policy != "tight" else "",
                  f"over {self.spec.serving}" if self.spec.serving != "miniature" else ""]
        pool = self.spec.pool
        return (f"{self.signature}\n  {self.spec.model.name}, pool {pool.full_size}/{pool.swa_size} (pages of "
                f"{pool.page_size}, {pool.free_order}), decode buckets {list(self.spec.graphs.decode_buckets)}: "
                f"{requests}{''.join(f', {e}' for e in extras if e)}\n  {self.verdict.summary()}")


__all__ = ["Finding", "signature"]

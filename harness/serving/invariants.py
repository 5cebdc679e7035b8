"""Pool invariants: the accounting that must hold after every step, whatever the design or the runner.

SGLang's invariant checker (``SGLANG_INVARIANT_CHECK``) aborts on these because each corrupts silently
otherwise: a double ``free_swa`` puts the dummy slot into the free list, and the next request writes its
keys where every padded row writes too. The harness checks them after every step of every run:

* ``owned_twice``: no slot is owned by two live tokens (in the full pool, or in the SWA pool);
* ``dummy``: the dummy page is never free and never owned by a token;
* ``free_but_owned``: a live token's slot (full, or SWA while it has one) is not on its pool's free list;
* ``window``: every token inside its request's window (the keys the next query reads) holds an SWA slot;
* ``retained``: no token the eviction policy has freed past still holds one (a skipped or short eviction
  keeps slots the pool needs: the leak that ends in an exhausted SWA pool).

A stack answers with the live tokens and its free slots; this module knows no stack.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from .timeline import LiveToken

INVARIANTS = ("owned_twice", "dummy", "free_but_owned", "window", "retained")


@dataclass(frozen=True, slots=True, kw_only=True)
class InvariantViolation:
    invariant: str
    """one of INVARIANTS"""
    pool: str
    """"full" or "swa\""""
    slot: int
    detail: str
    """what is wrong, naming the tokens (``rid@pos``) involved"""

    def __str__(self) -> str:
        return f"{self.invariant}: {self.pool} slot {self.slot}: {self.detail}"


def pool_violations(live: Sequence[LiveToken], *, free_full: Collection[int], free_swa: Collection[int],
                    page_size: int) -> list[InvariantViolation]:
    """Every invariant broken by the live tokens and the free lists as they stand, in a stable order."""
    out: list[InvariantViolation] = []
    for pool, free in (("full", free_full), ("swa", free_swa)):
        for slot in sorted(s for s in free if s < page_size):
            out.append(InvariantViolation(invariant="dummy", pool=pool, slot=slot,
                                          detail="the dummy page is on the free list"))
    owners: dict[tuple[str, int], LiveToken] = {}
    free = {"full": set(free_full), "swa": set(free_swa)}
    for t in live:
        who = f"{t.rid}@{t.pos}"
        held = [("full", t.full_slot)] + ([("swa", t.swa_slot)] if t.swa_slot > 0 else [])
        if t.in_window and t.swa_slot <= 0:
            # the token has no SWA slot to name: name its full slot
            out.append(InvariantViolation(invariant="window", pool="full", slot=t.full_slot,
                                          detail=f"{who} is inside its window but holds no SWA slot"))
        if t.past_frontier and t.swa_slot > 0:
            out.append(InvariantViolation(invariant="retained", pool="swa", slot=t.swa_slot,
                                          detail=f"{who} is behind its eviction frontier but still holds it"))
        for pool, slot in held:
            if slot < page_size:
                out.append(InvariantViolation(invariant="dummy", pool=pool, slot=slot,
                                              detail=f"{who} owns a slot of the dummy page"))
                continue
            if (pool, slot) in owners:
                first = owners[(pool, slot)]
                out.append(InvariantViolation(invariant="owned_twice", pool=pool, slot=slot,
                                              detail=f"owned by {first.rid}@{first.pos} and {who}"))
            else:
                owners[(pool, slot)] = t
            if slot in free[pool]:
                out.append(InvariantViolation(invariant="free_but_owned", pool=pool, slot=slot,
                                              detail=f"{who} owns it, and it is on the free list"))
    return out

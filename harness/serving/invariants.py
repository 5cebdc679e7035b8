"""Pool invariants: the accounting that must hold after every step, whatever the design or the runner.

SGLang's invariant checker (``SGLANG_INVARIANT_CHECK``) aborts on these because each corrupts silently
otherwise: a double ``free_swa`` puts the dummy slot into the free list, and the next request writes its
keys where every padded row writes too. The harness checks them after every step of every run:

* ``owned_twice``: no slot is owned by two live tokens (in the full pool, or in the SWA pool);
* ``dummy``: the dummy page is never free and never owned by a token;
* ``free_but_owned``: a live token's slot (full, or SWA while it has one) is not on its pool's free list;
* ``window``: every token inside its request's window (the keys the next query reads) holds an SWA slot;
* ``retained``: no token below what SGLang may retain still holds one: the bound comes from the model's
  window, the page size and the policy's declared eviction interval (``eviction.retention_bound``), never
  from the policy under test, so a policy of one's own that frees too late breaches it as a scheduler patch
  does (a skipped or short eviction keeps slots the pool needs: the leak that ends in an exhausted SWA pool);
* ``leaked``: every page a pool has handed out (not free, not the dummy page) holds a slot some live token or
  the prefix cache owns: a page no one owns is never freed again (rejected draft slots a verify keeps, or
  frees in one pool only, leak this way and end in an exhausted pool).

With a prefix cache (``prefix_cache.py``) the tokens it holds count too. Its slots are owned once, by the
cache, and shared by every live token that matched them (``LiveToken.shared``, the same position), so
sharing is not ``owned_twice``; they must not be free or in the dummy page; a token inside the window a
locked match reads must hold an SWA slot (``window``); and two more:

* ``tombstone``: the cache's tombstones agree with the SWA pool: a token it keeps as live SWA KV holds an
  SWA slot, a tombstoned one holds none (an insert that forgets what the request already freed caches
  freed slots as live: SGLang PRs 30845 and 36909);
* ``unmatchable``: every branch of the cache ends in a window of live SWA KV, the only place a later match
  can end, so a branch whose trailing window is tombstoned holds full KV no prompt can reuse (SGLang PRs
  29860 and 35515).

The invariants are said per KV group (``kv_groups.py``): ``owned_twice``, ``dummy`` and ``free_but_owned`` hold in
every group; ``window`` and ``retained`` in every windowed one (SGLang's SWA pool). A stack answers with the
live tokens, each group's free slots and what its prefix cache holds; this module knows no stack.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from .kv_groups import KVGroup, KVGroups
from .timeline import LiveToken

INVARIANTS = ("owned_twice", "dummy", "free_but_owned", "window", "retained", "tombstone", "unmatchable", "leaked")


@dataclass(frozen=True, slots=True, kw_only=True)
class CachedToken:
    """One token a prefix cache holds: its slots as the pool has them, and what the cache believes."""

    pos: int
    """its position in the cached prompt (the depth in the radix tree)"""
    full_slot: int
    swa_slot: int
    """what the pool maps its full slot to: 0 when it holds no SWA slot"""
    tombstoned: bool
    """the cache has given up its SWA KV (freed, or never cached live)"""
    read_by: tuple[str, ...] = ()
    """requests whose locked match ends within W - 1 tokens after it: their first query reads its SWA KV"""
    trailing_of: tuple[int, ...] = ()
    """end positions of the branches (leaves) whose trailing window of W - 1 tokens holds it"""


class CacheHoldings(Protocol):
    """What the invariants read of a prefix cache."""

    def cached_tokens(self) -> list[CachedToken]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class InvariantViolation:
    invariant: str
    """one of INVARIANTS"""
    pool: str
    """the KV group whose slot it names ("full" or "swa" in SGLang's layout)"""
    slot: int
    detail: str
    """what is wrong, naming the tokens (``rid@pos``) involved"""

    def __str__(self) -> str:
        return f"{self.invariant}: {self.pool} slot {self.slot}: {self.detail}"


def pool_violations(live: Sequence[LiveToken], *, groups: KVGroups, free: Mapping[str, Collection[int]],
                    cached: Sequence[CachedToken] = ()) -> list[InvariantViolation]:
    """Every invariant broken by the live tokens (their ``slots`` in ``groups``' order), each group's free
    slots and the prefix cache's tokens as they stand, in a stable order."""
    out: list[InvariantViolation] = []
    # the free lists are read, never changed: a stack's sets are used as they come (a free list holds most of a
    # pool's slots, and this runs after every step)
    free_sets = {g.name: f if isinstance((f := free[g.name]), (set, frozenset)) else set(f) for g in groups}
    for g in groups:
        fs = free_sets[g.name]
        if fs and min(fs) < g.page_size:  # min() in C first: the dummy page is almost never free
            for slot in sorted(s for s in fs if s < g.page_size):
                out.append(InvariantViolation(invariant="dummy", pool=g.name, slot=slot,
                                              detail="the dummy page is on the free list"))
    owners: dict[tuple[str, int], LiveToken] = {}
    by_cache = _cache_violations(cached, groups, free_sets, out) if cached else {}
    # a token with no slot in a windowed group is named by its slot in the first group that always holds one
    anchor = next((i for i, g in enumerate(groups) if not g.has_window), None)
    windowed = [(i, g) for i, g in enumerate(groups) if g.has_window]
    always = [(i, g) for i, g in enumerate(groups) if not g.has_window]
    for t in live:
        who = t.who
        held = [(g, t.slots[i]) for i, g in always] + [(g, t.slots[i]) for i, g in windowed if t.slots[i] > 0]
        held.sort(key=lambda h: groups.index(h[0].name))
        for i, g in windowed:
            slot = t.slots[i]
            if t.in_window and slot <= 0:
                named, at = (groups.groups[anchor].name, t.slots[anchor]) if anchor is not None else (g.name, slot)
                out.append(InvariantViolation(invariant="window", pool=named, slot=at,
                                              detail=f"{who} is inside its window but holds no {g.title} slot"))
        for i, g in windowed:
            slot = t.slots[i]
            if t.past_frontier and slot > 0:
                out.append(InvariantViolation(invariant="retained", pool=g.name, slot=slot,
                                              detail=f"{who} is below what its request may retain (the window, the "
                                                     f"page floor, the declared eviction interval) but still holds it"))
        for g, slot in held:
            pool = g.name
            if slot < g.page_size:
                out.append(InvariantViolation(invariant="dummy", pool=pool, slot=slot,
                                              detail=f"{who} owns a slot of the dummy page"))
                continue
            if (cache_owner := by_cache.get((pool, slot))) is not None:
                if not (t.shared and cache_owner.pos == t.pos):
                    detail = f"owned by the prefix cache ({_cache_who(cache_owner)}) and {who}"
                    out.append(InvariantViolation(invariant="owned_twice", pool=pool, slot=slot, detail=detail))
                continue  # the cache's slot: checked against the free list as the cache's
            if (pool, slot) in owners:
                first = owners[(pool, slot)]
                out.append(InvariantViolation(invariant="owned_twice", pool=pool, slot=slot,
                                              detail=f"owned by {first.who} and {who}"))
            else:
                owners[(pool, slot)] = t
            if slot in free_sets[pool]:
                out.append(InvariantViolation(invariant="free_but_owned", pool=pool, slot=slot,
                                              detail=f"{who} owns it, and it is on the free list"))
    out.extend(_leaks(groups, free_sets, {key for key in owners} | set(by_cache)))
    return out


def _leaks(groups: KVGroups, free: Mapping[str, set[int]], owned: set[tuple[str, int]]) -> list[InvariantViolation]:
    """A ``leaked`` violation for each handed-out page of each group that no live token or cached token owns,
    named by its first slot."""
    out = []
    for g in groups:
        p = g.page_size
        owned_pages = {slot // p for pool, slot in owned if pool == g.name}
        free_pages = free[g.name] if p == 1 else {slot // p for slot in free[g.name]}
        # set differences in C, not a Python loop over every page of the pool (most of them free)
        for page in sorted(set(range(1, g.size // p)).difference(free_pages, owned_pages)):
            out.append(InvariantViolation(invariant="leaked", pool=g.name, slot=page * p,
                                          detail="handed out, but no live token or cached token owns it: "
                                                 "nothing will free it"))
    return out


def _cache_who(c: CachedToken) -> str:
    return f"cache@{c.pos}"


def _cache_groups(groups: KVGroups) -> tuple[KVGroup, KVGroup]:
    """The groups a cached token's ``full_slot`` and ``swa_slot`` are slots of: the SWA radix cache runs on
    SGLang's layout, the first full-attention group and the first windowed one."""
    full = next((g for g in groups if not g.has_window), None)
    swa = next((g for g in groups if g.has_window), None)
    if full is None or swa is None:
        raise ValueError(f"a prefix cache needs a full-attention and a windowed KV group; the stack has "
                         f"{', '.join(groups.names)}")
    return full, swa


def _cache_violations(cached: Sequence[CachedToken], groups: KVGroups, free: dict[str, set[int]],
                      out: list[InvariantViolation]) -> dict[tuple[str, int], CachedToken]:
    """Append what the prefix cache's tokens break; return who owns each of their slots."""
    full, swa = _cache_groups(groups)
    owners: dict[tuple[str, int], CachedToken] = {}
    dead_ends: set[int] = set()
    for c in cached:
        who = _cache_who(c)
        if c.tombstoned and c.swa_slot > 0:
            out.append(InvariantViolation(invariant="tombstone", pool=swa.name, slot=c.swa_slot,
                                          detail=f"{who} is tombstoned in the prefix cache but still holds it"))
        if not c.tombstoned and c.swa_slot <= 0:
            out.append(InvariantViolation(invariant="tombstone", pool=full.name, slot=c.full_slot,
                                          detail=f"{who} is cached as live {swa.title} KV, but holds no {swa.title} slot"))
        if c.read_by and c.swa_slot <= 0:
            out.append(InvariantViolation(
                invariant="window", pool=full.name, slot=c.full_slot,
                detail=f"{who} is inside the window {', '.join(c.read_by)} reads from its matched prefix, but "
                       f"holds no {swa.title} slot"))
        for end in c.trailing_of:
            if c.tombstoned and end not in dead_ends:
                dead_ends.add(end)
                out.append(InvariantViolation(
                    invariant="unmatchable", pool=full.name, slot=c.full_slot,
                    detail=f"the cached branch ending at {end} cannot be matched: {who} in its trailing window is "
                           "tombstoned, so its full KV is held for nothing"))
        held = [(full, c.full_slot)] + ([(swa, c.swa_slot)] if c.swa_slot > 0 else [])
        for g, slot in held:
            pool = g.name
            if slot < g.page_size:
                out.append(InvariantViolation(invariant="dummy", pool=pool, slot=slot,
                                              detail=f"{who} holds a slot of the dummy page"))
                continue
            if (pool, slot) in owners:
                first = _cache_who(owners[(pool, slot)])
                out.append(InvariantViolation(invariant="owned_twice", pool=pool, slot=slot,
                                              detail=f"held by the prefix cache twice, {first} and {who}"))
            else:
                owners[(pool, slot)] = c
            if slot in free[pool]:
                out.append(InvariantViolation(invariant="free_but_owned", pool=pool, slot=slot,
                                              detail=f"the prefix cache holds it ({who}), and it is on the free list"))
    return owners

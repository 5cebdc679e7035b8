"""An SWA-aware prefix (radix) cache, as SGLang's ``SWARadixCache`` keeps one.

Finished requests are inserted instead of freed: the cache keeps their full-pool KV and, where it is still
there, their SWA KV. The part a request already evicted from the SWA pool is inserted as a *tombstone*:
full KV, no SWA KV. A chunked prefill is inserted between its chunks too (SGLang's ``cache_unfinished_req``),
and from then on its prefix is the cache's.

A prompt matches the longest cached prefix whose end a query can start from: the next query at position
``m`` reads keys ``m - W + 1 .. m``, so the ``W - 1`` tokens before ``m`` must hold live SWA KV (or every
token from the root must). The matched request reuses the prefix's full slots and, through the mapping,
its in-window SWA slots; the cache locks both while the request holds them (full slots on the whole path,
SWA slots on the window before the match end). Matches and inserts are page-aligned.

Cache pressure (the allocator running out) evicts the least recently used first. SWA pressure tombstones
an internal node outside every branch's trailing window (the only SWA KV a match can still use is a
branch's last ``W - 1`` tokens, SGLang PR 35515), and only then deletes a leaf; full pressure deletes a leaf.
A deleted leaf frees both pools; a parent left as a leaf that can no longer be matched goes with it, so
every branch keeps ending in live SWA KV (SGLang keeps no tombstoned leaves).

The cache frees through the serving stack and reads the full->SWA mapping through it; the slots it holds
are reported to the pool invariants (``CachedToken``).
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from .faults import Component, faults_acting_on
from .invariants import CachedToken


class SlotOwner(Protocol):
    """What the cache needs of the serving stack."""

    @property
    def device(self) -> torch.device: ...

    def free(self, full_slots: torch.Tensor) -> None: ...

    def free_swa(self, full_slots: torch.Tensor) -> None: ...

    def translate(self, full_slots: torch.Tensor) -> torch.Tensor: ...


class _Node:
    __slots__ = ("id", "key", "value", "parent", "children", "tombstone", "full_lock", "swa_lock", "access")

    def __init__(self, *, id: int, key: tuple[int, ...], value: list[int], parent: _Node | None,
                 tombstone: bool = False, access: int = 0) -> None:
        self.id = id
        self.key = key
        """the tokens of this edge"""
        self.value = value
        """their full-pool slots"""
        self.parent = parent
        self.children: dict[tuple[int, ...], _Node] = {}
        """by the first page of the child's key"""
        self.tombstone = tombstone
        """the SWA KV of these tokens is freed (their full KV is kept)"""
        self.full_lock = 0
        """requests holding these full slots: never deleted while above 0"""
        self.swa_lock = 0
        """requests whose window reads these SWA slots: never tombstoned while above 0"""
        self.access = access


@dataclass(frozen=True, slots=True, kw_only=True)
class Match:
    """A cached prefix handed to a request: its length and full slots, locked for ``holder`` if it has one."""

    length: int
    slots: tuple[int, ...]
    holder: str | None = None
    reads: bool = False
    """a match the request's first query reads from (not what it inserted of itself)"""
    _end: _Node | None = field(default=None, repr=False, compare=False)
    _swa_span: int = field(default=0, repr=False, compare=False)
    """tokens behind ``_end`` whose SWA slots the lock holds"""


def _weakly(stack: SlotOwner) -> SlotOwner:
    try:
        return weakref.proxy(stack)  # type: ignore[return-value]
    except TypeError:  # a stack that takes no weak reference is held
        return stack


class SWARadixCache:
    """Radix tree of cached prompts, keyed by page, holding full slots with SWA tombstones. A key is any
    sequence of hashable entries, one per cached position: tokens, or EAGLE's pairs of adjacent tokens."""

    component = Component.PREFIX_CACHE

    def __init__(self, stack: SlotOwner, *, window: int, page_size: int = 1, faults: Collection[str] = ()) -> None:
        # the stack holds this cache too (``ServingStack.hold_prefix_cache``): a weak reference back keeps the
        # two out of a cycle, which only the cyclic collector would free, and everything the stack reaches with it
        self.stack: SlotOwner = _weakly(stack)
        self.window = window
        """keys a query reads, its own included: a match needs ``window - 1`` live SWA tokens before its end"""
        self.page_size = page_size
        self.faults = frozenset(faults) & faults_acting_on(Component.PREFIX_CACHE)
        self._ids = itertools.count(1)
        self._clock = itertools.count(1)
        self._root = _Node(id=0, key=(), value=[], parent=None)
        self._locks: dict[int, Match] = {}

    # ---- what requests do -----------------------------------------------------------------------------
    def match(self, tokens: Sequence[int], *, holder: str) -> Match:
        """The longest page-aligned cached prefix of ``tokens`` that a query can continue from, locked for
        ``holder`` (length 0 and no lock when nothing matches)."""
        p = self.page_size
        key = tuple(tokens[: len(tokens) // p * p])
        need = self.window - 1
        node, pos = self._root, 0
        # live SWA tokens since the last tombstone; a path from the root without one matches at any length
        since: float = math.inf
        best, best_node = 0, self._root
        while pos < len(key) and (child := node.children.get(key[pos : pos + p])) is not None:
            if child.tombstone:
                if since >= need:
                    best, best_node = pos, node
                    since = 0
                elif "match_len_not_reset" not in self.faults:
                    since = 0
            k = self._common(child.key, key, pos)
            whole = k == len(child.key)
            if not whole:
                child = self._split(child, k)
            if not child.tombstone:
                since += k
            node, pos = child, pos + k
            if not whole:
                break
        if since >= need:
            best, best_node = pos, node
        self._touch(best_node)
        return self._lease(best_node, best, holder, reads=True)

    def insert(self, tokens: Sequence[int], slots: Sequence[int], *, cached_len: int, swa_evicted: int,
               holder: str | None = None) -> Match:
        """Cache a request's page-aligned tokens with their full slots, and return what the cache now holds of
        its prompt (locked for ``holder``, a request that goes on).

        ``cached_len`` tokens are already the cache's (the request's match); of the rest, the cache takes the
        request's slots where it has no copy and frees the request's duplicates where it has. Below
        ``swa_evicted`` the request has freed its SWA slots: those tokens are cached as a tombstone, and
        revive a tombstoned copy of the cache's where they are above it. Tokens past the returned length
        stay the request's (a partial page, or a span the insert could not take).
        """
        p = self.page_size
        aligned = len(tokens) // p * p
        key, value = tuple(tokens[:aligned]), list(slots[:aligned])
        # a page freed under a frontier inside it is freed whole
        live_from = -(-swa_evicted // p) * p
        node, pos = self._root, 0
        taken = True
        while pos < aligned and (child := node.children.get(key[pos : pos + p])) is not None:
            k = self._common(child.key, key, pos)
            for cut in (cached_len, live_from if child.tombstone else None):
                if cut is not None and pos < cut < pos + k:
                    k = cut - pos
            if k < len(child.key):
                child = self._split(child, k)
            if pos >= cached_len and not self._adopt(child, value[pos : pos + k], revive=pos >= live_from):
                taken = False
                break
            node, pos = child, pos + k
        if taken and pos < aligned:
            split = min(max(live_from, pos), aligned)
            if split > pos:
                node = self._add(node, key[pos:split], value[pos:split], tombstone=True)
            if split < aligned:
                node = self._add(node, key[split:aligned], value[split:aligned], tombstone=False)
            pos = aligned
        self._touch(node)
        return self._lease(node, pos, holder, reads=False)

    def release(self, match: Match) -> None:
        """Drop a request's lock on its prefix (when it finishes, is aborted, or matches again)."""
        if match._end is None or self._locks.pop(id(match), None) is None:
            return
        covered = 0
        for node in self._path_up(match._end):
            node.full_lock -= 1
            if covered < match._swa_span:
                node.swa_lock -= 1
                covered += len(node.key)

    def evict(self, pool: str) -> bool:
        """Free some of what the cache holds because ``pool`` ("swa_size" or "full_size", as
        ``PoolExhausted`` names it) ran out; False when nothing it holds can go."""
        nodes = list(self._nodes())
        order = {n.id: (n.access, start) for n, start in nodes}

        def lru(candidates: Iterator[_Node]) -> _Node | None:
            return min(candidates, key=lambda n: order[n.id], default=None)

        if pool == "swa_size":
            if "evict_branch_tail_first" in self.faults:
                # SGLang before PR 35515: one least-recently-used walk over every node whose SWA KV is free to go
                node = lru(n for n, _ in nodes if not n.tombstone and n.swa_lock == 0
                           and (n.children or n.full_lock == 0))
                if node is None:
                    return False
                if node.children:
                    self._tombstone(node)
                else:
                    self._delete(node)
                return True
            tails = self._tails()
            node = lru(n for n, _ in nodes if n.children and not n.tombstone and n.swa_lock == 0 and n.id not in tails)
            if node is not None:
                self._tombstone(node)
                return True
        leaf = lru(n for n, _ in nodes if not n.children and n.full_lock == 0)
        if leaf is None:
            return False
        self._delete(leaf)
        return True

    # ---- what the invariants read -----------------------------------------------------------------------
    def cached_tokens(self) -> list[CachedToken]:
        """Every token the cache holds, in tree order, with its slots as the pool maps them."""
        nodes = list(self._nodes())
        if not nodes:
            return []
        need = self.window - 1
        read_by: dict[tuple[int, int], list[str]] = {}
        for lock in self._locks.values():
            if lock.reads and lock._end is not None:
                for where in self._last_tokens(lock._end, need):
                    read_by.setdefault(where, []).append(lock.holder or "")
        trailing: dict[tuple[int, int], list[int]] = {}
        for node, start in nodes:
            if not node.children:
                for where in self._last_tokens(node, need):
                    trailing.setdefault(where, []).append(start + len(node.key))
        slots = torch.tensor([s for n, _ in nodes for s in n.value], dtype=torch.int64, device=self.stack.device)
        swa = iter(self.stack.translate(slots).tolist())
        out = []
        for node, start in nodes:
            for i, full in enumerate(node.value):
                out.append(CachedToken(pos=start + i, full_slot=full, swa_slot=next(swa), tombstoned=node.tombstone,
                                       read_by=tuple(read_by.get((node.id, i), ())),
                                       trailing_of=tuple(trailing.get((node.id, i), ()))))
        return out

    # ---- internals ----------------------------------------------------------------------------------------
    def _common(self, edge: tuple[int, ...], key: tuple[int, ...], pos: int) -> int:
        """Tokens ``edge`` and ``key[pos:]`` share, in whole pages."""
        n = 0
        for a, b in zip(edge, key[pos:]):
            if a != b:
                break
            n += 1
        return n // self.page_size * self.page_size

    def _split(self, node: _Node, k: int) -> _Node:
        """Cut ``node`` after ``k`` tokens; the new upper part (returned) inherits its locks and tombstone."""
        p = self.page_size
        upper = _Node(id=next(self._ids), key=node.key[:k], value=node.value[:k], parent=node.parent,
                      tombstone=node.tombstone, access=node.access)
        upper.full_lock, upper.swa_lock = node.full_lock, node.swa_lock
        assert node.parent is not None
        node.parent.children[node.key[:p]] = upper
        node.key, node.value, node.parent = node.key[k:], node.value[k:], upper
        upper.children[node.key[:p]] = node
        return upper

    def _add(self, parent: _Node, key: tuple[int, ...], value: list[int], *, tombstone: bool) -> _Node:
        node = _Node(id=next(self._ids), key=key, value=value, parent=parent, tombstone=tombstone)
        parent.children[key[: self.page_size]] = node
        return node

    def _adopt(self, node: _Node, mine: list[int], *, revive: bool) -> bool:
        """The inserting request's own copy of ``node``'s tokens: free it, or give it to a tombstoned node
        (``revive``: the request still holds their SWA KV). False when the node cannot take it."""
        if not (revive and node.tombstone):
            self._free(mine)  # the cache's copy stays: live, or as tombstoned as the request's own
            return True
        if node.full_lock:
            # a running request reads the node's full slots, so they cannot be swapped for the request's (SGLang
            # remaps the locked slots' SWA instead): the insert stops here, the rest stays the request's
            return False
        self._free(node.value)
        node.value, node.tombstone = list(mine), False
        return True

    def _lease(self, end: _Node, length: int, holder: str | None, *, reads: bool) -> Match:
        slots = tuple(s for node in reversed(list(self._path_up(end))) for s in node.value)
        if holder is None or end is self._root:
            return Match(length=length, slots=slots, holder=holder, reads=reads)
        covered = 0
        for node in self._path_up(end):
            node.full_lock += 1
            if covered < self.window - 1:
                node.swa_lock += 1
                covered += len(node.key)
        lease = Match(length=length, slots=slots, holder=holder, reads=reads, _end=end, _swa_span=covered)
        self._locks[id(lease)] = lease
        return lease

    def _path_up(self, node: _Node) -> Iterator[_Node]:
        while node is not self._root:
            yield node
            assert node.parent is not None
            node = node.parent

    def _last_tokens(self, end: _Node, n: int) -> Iterator[tuple[int, int]]:
        """(node id, offset) of the ``n`` tokens before the end of ``end`` (fewer near the root)."""
        for node in self._path_up(end):
            for i in range(len(node.key) - 1, -1, -1):
                if n <= 0:
                    return
                yield node.id, i
                n -= 1

    def _touch(self, end: _Node) -> None:
        """Mark the path to ``end`` used, the root side less recently than the end (so SWA pressure gives up
        a branch's oldest tokens first)."""
        for node in reversed(list(self._path_up(end))):
            node.access = next(self._clock)

    def _nodes(self) -> Iterator[tuple[_Node, int]]:
        """Every node but the root with the position it starts at, parents before children."""
        stack = [(child, 0) for child in reversed(self._root.children.values())]
        while stack:
            node, start = stack.pop()
            yield node, start
            stack.extend((child, start + len(node.key)) for child in reversed(node.children.values()))

    def _tails(self) -> set[int]:
        """Ids of the nodes holding a token of some branch's trailing window (the last W - 1 tokens of a leaf)."""
        depth: dict[int, int] = {}  # tokens from a node's end to the nearest leaf end below it

        def below(node: _Node) -> int:
            depth[node.id] = min((len(c.key) + below(c) for c in node.children.values()), default=0)
            return depth[node.id]

        for child in self._root.children.values():
            below(child)
        return {i for i, d in depth.items() if d < self.window - 1}

    def _unmatchable(self, leaf: _Node) -> bool:
        """No match can end at ``leaf``: a token of its trailing window is tombstoned."""
        covered = 0
        for node in self._path_up(leaf):
            if covered >= self.window - 1:
                return False
            if node.tombstone:
                return True
            covered += len(node.key)
        return False

    def _tombstone(self, node: _Node) -> None:
        self.stack.free_swa(self._tensor(node.value))
        node.tombstone = True

    def _delete(self, leaf: _Node) -> None:
        """Free a leaf in both pools, then every parent left as a leaf that can no longer be matched."""
        node: _Node | None = leaf
        while node is not None and node is not self._root and not node.children and node.full_lock == 0:
            self._free(node.value)
            assert node.parent is not None
            del node.parent.children[node.key[: self.page_size]]
            parent = node.parent
            node = parent if parent is not self._root and self._unmatchable(parent) else None

    def _free(self, slots: list[int]) -> None:
        if slots:
            self.stack.free(self._tensor(slots))

    def _tensor(self, slots: list[int]) -> torch.Tensor:
        return torch.tensor(slots, dtype=torch.int64, device=self.stack.device)

"""A hash join of tensor rows: which rows of one table hold exactly the bytes of rows of another.

This module knows rows of integer words and nothing else: what the rows mean, and what a caller does with
an equality once it is found, belong to the caller (the KV diff's classification rules, ``rules.py``).

The problem. Given a *hay* table of N rows and Q *query* rows, find every (hay row, query row) pair whose
bytes are equal. Q is at most N, often a tenth of it, and N is large (a million rows of 1 KiB is a GiB),
so nothing may grow with N x Q, and nothing may read a row more often than once in full unless it has to.

Rows. A table is a tuple of word tensors of the same number of rows, its *parts* (K and V for the diff);
a row is the concatenation of its parts' rows, and two rows are equal when every part is. ``words``
views any [rows, ...] tensor as the widest integers that tile a row (no copy), so equality is bitwise:
a NaN payload equals itself, -0.0 differs from 0.0. A table may be stacked from equal *blocks*, row
``block * block_rows + i`` (a caller stacks several tensors of the same shape to handle them in one pass);
rows of two blocks never join, whatever their bytes.

The algorithm, in four moves:

1. Hash. Each row gets an int64 hash, read from its first part only. The cheap one (``line_hash``) adds
   the first and the last word of the row's first cache line: it reads one line of each row, which is
   what lets a whole table be hashed for a fraction of one read of it. The strong one (``row_hash``) is
   the wrapping sum of every word of the row. Each is salted with the row's block (plus an odd constant
   times the block), so rows of two blocks share a hash only if their bytes differ.
2. Look up. The queries' distinct hashes are the *keys*. A table indexed by a hash's low bits, sixteen
   or more entries per key, holds the key of each bucket that has one (``hash_hits``): each hay row is
   dismissed, or given its only possible key, by one read of a table small enough to stay in cache. The
   few buckets two keys share are marked, and only hay rows landing in them search the sorted keys.
   Nothing is sorted by hash: sorting a million hashes costs more than the whole lookup.
3. Verify. A hash only nominates. Queries with one key share one *representative* (the lowest query), and
   every hay row the key nominates is compared byte for byte with the representative, in the hay's
   address order, first part first and the next parts only where the first is equal (``verify``). A query
   whose bytes differ from its representative's (two contents with one hash) waits for a later round with a
   representative of its own: k distinct contents under one hash cost k rounds, and a row repeated many
   times in the hay (poison, zeros) is verified once per distinct query content, not once per query.
4. Fall back. Line hashes can be useless: rows alike in their first cache line and unlike after it (a
   model with a dead first head). A lookup whose verifications fail more than ``_LINE_MISSES`` plus one
   per query, or that needs more than ``_LINE_ROUNDS`` rounds, starts over on whole-row hashes, so the time
   the line hash saves is never paid back worse than one extra pass. A collision of whole-row hashes costs
   rounds, never a wrong answer: the answer is always the byte comparison's.

The result (``Matches``) lists each verified pair as (hay row, content group), every query naming its
group, and reduces over a query's matches (the lowest or highest hay row) without listing them per query.

Cost, in memory reads: one read of the first cache line of every hay row and of every query; one
comparison of each nominated (hay, representative) pair; nothing per (hay, query) pair. Row comparisons
(``rows_differ``) run in large chunks, through scratch buffers (``Scratch``) reused for a whole diff,
because a fresh large tensor pays a page fault per 4 KiB on first touch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "Matches", "Rows", "Scratch", "any_per_row", "hash_hits", "line_hash", "match", "parts_differ", "row_hash", "rows_differ",
    "salted", "salted_blocks", "streams", "take", "words",
]

Parts = tuple[torch.Tensor, ...]
"""a table's word tensors [rows, words], one per part of a row"""

# Rows are compared this many bytes at a time: per-call overhead, thread wake-ups included, vanishes at
# this size (measured: 2-8 MiB chunks cost 1.1-1.5x as much). Gathered rows go through buffers of a
# quarter of that: a gathered chunk costs the same from 4 MiB up, and every buffer is fresh memory in each
# diff, paying a page fault per 4 KiB on first touch (32 MiB buffers cost a tenth of a diff of 1 GiB).
_CHUNK_BYTES = 32 << 20
_GATHER_CHUNK_BYTES = 4 << 20
# Below this share of a table's rows, gathering the rows asked for costs less than streaming the whole
# table (measured: a gathered row costs 2.5 to 3.5 streamed rows on CPU).
_GATHER_BELOW = 0.4

# A row's first cache line is all the line hash reads (a sixteenth of a 1 KiB row's bytes), and in K data
# it already tells rows apart.
_LINE_BYTES = 64
# A lookup whose line hashes prove useless (rows alike in their first line, unlike further on) starts
# over with whole-row hashes once its failed byte comparisons pass this many plus one per query, or it
# needs more than this many rounds.
_LINE_MISSES = 1024
_LINE_ROUNDS = 4
_BLOCK_SALT = 0x9E3779B97F4A7C15 - (1 << 64)  # odd, as int64
_SHARED = -2  # a bucket of ``hash_hits``'s table that more than one key falls in


def take(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t[index]`` for an integer index along the first dimension: ``index_select`` runs four times as fast
    as advanced indexing on CPU for large indices (measured), and these gathers are most of the diff's
    bookkeeping."""
    return t.index_select(0, index)


def words(rows: torch.Tensor) -> torch.Tensor:
    """[..., H, D] -> [..., words]: each row's bytes viewed as the widest integers that tile it (no copy)."""
    flat = rows.flatten(-2).view(torch.uint8)
    for dtype in (torch.int64, torch.int32, torch.int16):
        if flat.shape[-1] % dtype.itemsize == 0:
            return flat.view(dtype)
    return flat


class Pairs:
    """Whether the rows at two places differ, for the pairs of places already compared in a diff: a place is
    (the address of the tensor that holds a row, the row's index in it), [n, 2] int64, naming bytes that do
    not change while the diff runs. Kept sorted by a hash of the pair; at most ``_PAIRS`` pairs (the first
    ones asked), a few bytes each."""

    def __init__(self) -> None:
        self.hash = torch.empty(0, dtype=torch.int64)
        self.keys = torch.empty((0, 4), dtype=torch.int64)
        self.result = torch.empty(0, dtype=torch.bool)

    @staticmethod
    def _hash(keys: torch.Tensor) -> torch.Tensor:
        # odd multipliers, wrapping: any pair may share a hash with another, which ``differ`` checks
        return (keys * _PAIR_MIX).sum(1)

    def differ(self, a: torch.Tensor, b: torch.Tensor, compare) -> torch.Tensor:
        """[n] bool for the pairs of places ``a[i]``, ``b[i]``: known ones looked up, the others from
        ``compare(positions)`` and kept."""
        keys = torch.cat([a, b], 1)
        h = self._hash(keys)
        out = torch.empty(h.numel(), dtype=torch.bool)
        known = torch.zeros(h.numel(), dtype=torch.bool)
        if self.hash.numel():
            # the first entry of each hash is checked against the whole pair: a hash two pairs share at
            # most costs a comparison again, never a wrong answer
            pos = torch.searchsorted(self.hash, h).clamp_(max=self.hash.numel() - 1)
            known = (take(self.keys, pos) == keys).all(1)
            out[known] = take(self.result, pos[known])
        new = (~known).nonzero().flatten()
        if new.numel():
            out[new] = got = compare(new)
            room = _PAIRS - self.hash.numel()
            if room > 0:
                add = new[:room]
                h_all = torch.cat([self.hash, take(h, add)])
                order = torch.sort(h_all, stable=True).indices
                self.hash = take(h_all, order)
                self.keys = take(torch.cat([self.keys, take(keys, add)]), order)
                self.result = take(torch.cat([self.result, got[: add.numel()]]), order)
        return out


_PAIRS = 1 << 20
_PAIR_MIX = torch.tensor([_BLOCK_SALT, 0x632BE59BD9B4E019, 0x4F1BBCDCBFA53E0B, 1], dtype=torch.int64)


class Scratch:
    """Buffers reused for a whole diff: a fresh large tensor pays a page fault per 4 KiB on first touch,
    which costs more than the comparison done in it. Also the diff's ``Pairs``."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}
        self.pairs = Pairs()

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A buffer of ``shape`` named ``name``, its contents undefined."""
        n = math.prod(shape)
        buf = self._buffers.get((name, dtype))
        if buf is None or buf.numel() < n:
            buf = self._buffers[(name, dtype)] = torch.empty(n, dtype=dtype)
        return buf[:n].view(shape)


# ---- comparing rows -------------------------------------------------------------------------------------

def any_per_row(flags: torch.Tensor) -> torch.Tensor:
    """[n, w] bool -> [n]. ``any`` over a short last dim is slow on CPU; a sum of the flags read eight at a
    time as int64 is not, and cannot wrap to zero below 256 such words (each is at most 0x0101...01)."""
    if flags.shape[1] % 8 or flags.shape[1] // 8 > 255:
        return flags.any(1)
    return flags.view(torch.uint8).view(torch.int64).sum(1) != 0


def _chunk_rows(w: torch.Tensor, gathered: bool = False) -> int:
    return max(1, (_GATHER_CHUNK_BYTES if gathered else _CHUNK_BYTES) // max(1, w.shape[1] * w.element_size()))


def streams(rows: torch.Tensor | None, total: int) -> bool:
    """Whether comparing ``rows`` of tensors of ``total`` rows reads them all in order rather than gathering."""
    return rows is None or rows.numel() >= _GATHER_BELOW * total


def rows_differ(
    a: torch.Tensor,
    b: torch.Tensor,
    a_rows: torch.Tensor | None = None,
    b_rows: torch.Tensor | None = None,
    *,
    scratch: Scratch,
) -> torch.Tensor:
    """[n] bool: row ``a_rows[i]`` of ``a`` and row ``b_rows[i]`` of ``b`` differ (word tensors [*, w]; no
    index means row i). Indexed rows are gathered a chunk at a time, never all at once."""
    n = next((r.numel() for r in (a_rows, b_rows) if r is not None), a.shape[0])
    # a table that is not a tensor (``deltas.DeltaRows``) is always gathered, a chunk at a time
    a_rows = torch.arange(n) if a_rows is None and not isinstance(a, torch.Tensor) else a_rows
    b_rows = torch.arange(n) if b_rows is None and not isinstance(b, torch.Tensor) else b_rows
    out = torch.empty(n, dtype=torch.bool)
    chunk = _chunk_rows(a, gathered=a_rows is not None or b_rows is not None)
    for i in range(0, n, chunk):
        rows = min(chunk, n - i)
        x, y = (
            t[i : i + rows] if index is None else _select(
                t, index[i : i + rows], scratch.get(name, (rows, t.shape[1]), t.dtype)
            )
            for t, index, name in ((a, a_rows, "a"), (b, b_rows, "b"))
        )
        flags = scratch.get("flags", (rows, a.shape[1]), torch.bool)
        torch.ne(x, y, out=flags)
        out[i : i + rows] = any_per_row(flags)
    return out


def _select(t: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    if isinstance(t, torch.Tensor):
        return torch.index_select(t, 0, index, out=out)
    return t.index_select(0, index, out=out)


def parts_differ(a: Parts, a_rows: torch.Tensor, b: Parts, b_rows: torch.Tensor, *, scratch: Scratch) -> torch.Tensor:
    """[n] bool: some part of row ``a_rows[i]`` of ``a`` differs from row ``b_rows[i]`` of ``b`` (a part is
    read only where the parts before it are equal).

    Tables whose first part names where each row's bytes lie (``places``, as ``deltas.DeltaRows`` does:
    bytes that never change while a diff runs) have their answers kept in ``scratch``, per pair of places:
    a later step asking about the same pair of rows reads neither."""
    if hasattr(a[0], "places") and hasattr(b[0], "places") and a_rows.numel():
        return scratch.pairs.differ(a[0].places(a_rows), b[0].places(b_rows),
                                    lambda at: _parts_differ(a, a_rows[at], b, b_rows[at], scratch=scratch))
    return _parts_differ(a, a_rows, b, b_rows, scratch=scratch)


def _parts_differ(a: Parts, a_rows: torch.Tensor, b: Parts, b_rows: torch.Tensor, *, scratch: Scratch) -> torch.Tensor:
    out = rows_differ(a[0], b[0], a_rows, b_rows, scratch=scratch)
    for x, y in zip(a[1:], b[1:]):
        same = (~out).nonzero().flatten()
        if not same.numel():
            break
        out[same] = rows_differ(x, y, a_rows[same], b_rows[same], scratch=scratch)
    return out


# ---- hashing rows ---------------------------------------------------------------------------------------

def row_hash(w: torch.Tensor) -> torch.Tensor:
    """[n, w] integer words -> [n] int64: the wrapping sum of each row's words.

    Weak mixing is fine here: a hash only nominates candidates, each then compared byte for byte, and a
    plain sum only confuses rows whose differences cancel (words swapped between positions), which
    distinct rows of real K data rarely are. What matters is that it keeps up with memory (multiplying
    the words by constants first costs 2.5 times as much on CPUs without AVX-512).
    """
    out = torch.empty(w.shape[0], dtype=torch.int64)
    chunk = _chunk_rows(w)
    for i in range(0, w.shape[0], chunk):
        torch.sum(w[i : i + chunk], 1, dtype=torch.int64, out=out[i : i + chunk])
    return out


def line_hash(w: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """[n] int64: the wrapping sum of the first and the last word of each row's first cache line (of
    ``rows`` only).

    Reading one line of a 1 KiB row costs a sixth of reading the row, and two words of it half as much
    as summing the whole line (measured), which is what lets a table be hashed whole for every lookup.
    """
    last = max(1, min(w.shape[1], _LINE_BYTES // w.element_size())) - 1
    if not isinstance(w, torch.Tensor):
        # ``deltas.DeltaRows``: the first lines gathered, a chunk of rows at a time (not all at once: a GiB
        # pool's first lines are tens of MiB)
        rows = torch.arange(w.shape[0]) if rows is None else rows
        lines = w.narrow(1, 0, last + 1)
        chunk = 1 << 16
        return torch.cat([line_hash(lines.index_select(0, rows[i : i + chunk]), None)
                          for i in range(0, rows.numel(), chunk)]) if rows.numel() else torch.empty(0, dtype=torch.int64)
    if rows is None:
        first, end = w[:, 0], w[:, last]
    else:
        # a row's first line copied whole, a memcpy per row, costs less than two strided reads of it
        line = w.narrow(1, 0, last + 1).index_select(0, rows)
        first, end = line[:, 0], line[:, last]
    if w.dtype != torch.int64:
        first, end = first.to(torch.int64), end.to(torch.int64)
    return first + end


def salted_blocks(hashes: torch.Tensor, block_rows: int) -> torch.Tensor:
    """``salted`` for the hashes of every row of a stacked table, in order."""
    blocks = hashes.numel() // block_rows
    return (hashes.view(blocks, -1) + torch.arange(blocks)[:, None] * _BLOCK_SALT).flatten()


def salted(hashes: torch.Tensor, rows: torch.Tensor, block_rows: int) -> torch.Tensor:
    """``hashes`` of ``rows`` plus an odd constant times each row's block: rows of two blocks then share a
    hash only if their contents differ."""
    return hashes + torch.div(rows, block_rows, rounding_mode="floor") * _BLOCK_SALT


class Rows:
    """Rows ``index`` (every row when None) of a table of ``parts`` stacked from blocks of ``block_rows``
    rows, with a hash of each: the line hash of the first part (or the one given), salted with the row's
    block. ``strong()``: the same rows hashed whole, computed once when asked."""

    __slots__ = ("_strong", "block_rows", "hash", "index", "parts")

    def __init__(self, parts: Parts, index: torch.Tensor | None, block_rows: int, hash: torch.Tensor | None = None):
        self.parts = parts
        self.index = index
        self.block_rows = block_rows
        self.hash = self.salted(line_hash(parts[0], index)) if hash is None else hash
        self._strong: Rows | None = None

    def __len__(self) -> int:
        return self.hash.numel()

    def rows(self, at: torch.Tensor) -> torch.Tensor:
        """Row numbers in ``parts`` of the positions ``at``."""
        return at if self.index is None else take(self.index, at)

    def block(self, at: torch.Tensor) -> torch.Tensor:
        """The block of each of the positions ``at``."""
        return torch.div(self.rows(at), self.block_rows, rounding_mode="floor")

    def salted(self, hashes: torch.Tensor) -> torch.Tensor:
        """``hashes``, one per position, salted with the blocks of these rows."""
        if self.index is None:
            return salted_blocks(hashes, self.block_rows)
        return salted(hashes, self.index, self.block_rows)

    def strong(self) -> Rows:
        """These rows with whole-row hashes."""
        if self._strong is None:
            first = self.parts[0] if self.index is None else self.parts[0].index_select(0, self.index)
            self._strong = Rows(self.parts, self.index, self.block_rows, self.salted(row_hash(first)))
        return self._strong


# ---- joining --------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Matches:
    """Row equalities found by ``match``: hay position ``hay[i]`` equals the rows of content group ``group[i]``."""

    hay: torch.Tensor
    group: torch.Tensor
    of_query: torch.Tensor
    """[queries] content group of each query"""
    groups: int

    def reduce(self, values: torch.Tensor, how: str, empty: int) -> torch.Tensor:
        """Per query, the ``how`` ("amin" or "amax") of ``values`` (one per match) over its matches."""
        out = torch.full((self.groups,), empty, dtype=torch.int64)
        out.scatter_reduce_(0, self.group, values, how)
        return take(out, self.of_query)


def hash_hits(keys: torch.Tensor, hashes: torch.Tensor, *, scratch: Scratch) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (i, j) with ``hashes[i] == keys[j]``, for distinct sorted ``keys``.

    A table indexed by the hashes' low bits, sixteen or more entries per key, holds the key of each bucket
    that has one: a row is dismissed, or given its only possible key, by one lookup in a table small enough
    to stay in cache. The few buckets that two keys share are marked, and only the rows landing in them
    search the keys (a binary search for every row costs four times the whole lookup; sorting is what
    costs most here, so nothing is sorted).
    """
    nk = keys.numel()
    mask = (1 << max(10, (16 * nk - 1).bit_length())) - 1
    key_bucket = keys & mask
    table = scratch.get("buckets", (mask + 1,), torch.int32).fill_(-1)
    index = torch.arange(nk, dtype=torch.int32)
    table.index_put_((key_bucket,), index)
    # a key whose entry another key overwrote shares its bucket
    shared = key_bucket[take(table, key_bucket) != index]
    if shared.numel():
        table.index_fill_(0, shared, _SHARED)
    key = take(table, hashes & mask)
    rows = (key != -1).nonzero().flatten()
    key, found = take(key, rows).long(), take(hashes, rows)
    crowded = (key == _SHARED).nonzero().flatten()
    if crowded.numel():
        key[crowded] = torch.searchsorted(keys, found[crowded]).clamp_(max=nk - 1)
    hit = (take(keys, key) == found).nonzero().flatten()
    return take(rows, hit), take(key, hit)


def _verify(hay: Rows, at: torch.Tensor, queries: Rows, of: torch.Tensor, *, scratch: Scratch) -> torch.Tensor:
    """[n] bool: hay position ``at[i]`` holds the same words in every part, in the same block, as query ``of[i]``."""
    # a different block is no match, whatever its bytes
    near = (hay.block(at) == queries.block(of)).nonzero().flatten()
    equal = torch.zeros(at.numel(), dtype=torch.bool)
    # gathered in the hay's address order, which the candidates (found in hay order) seldom are
    hay_rows, order = torch.sort(hay.rows(at[near]))
    near = near[order]
    equal[near] = ~parts_differ(hay.parts, hay_rows, queries.parts, queries.rows(of[near]), scratch=scratch)
    return equal


def match(hay: Rows, queries: Rows, *, scratch: Scratch, strong: bool = False) -> Matches:
    """Every hay row whose words equal a query's, in the same block, found through hashes and verified
    byte for byte (moves 2 to 4 of the module docstring)."""
    nq = len(queries)
    if nq == 0 or len(hay) == 0:
        empty = torch.empty(0, dtype=torch.int64)
        return Matches(empty, empty, torch.zeros(nq, dtype=torch.int64), 1)
    keys, bucket = torch.unique(queries.hash, return_inverse=True)
    cand, cand_key = hash_hits(keys, hay.hash, scratch=scratch)
    # In the first round every key has a representative and is its own group; queries that collide with
    # theirs get groups of their own in later rounds.
    of_query, n_groups, key_group = bucket.clone(), keys.numel(), torch.arange(keys.numel())
    hays, groups = [], []
    pending = torch.arange(nq)
    misses = rounds = 0
    while pending.numel():
        rounds += 1
        if not strong and rounds > _LINE_ROUNDS:
            return match(hay.strong(), queries.strong(), scratch=scratch, strong=True)
        pend_key = bucket[pending]
        rep = torch.full((keys.numel(),), nq, dtype=torch.int64).scatter_reduce_(0, pend_key, pending, "amin")
        rep_of = rep[pend_key]
        same = rep_of == pending
        other = (~same).nonzero().flatten()
        if other.numel():
            q, r = pending[other], rep_of[other]
            same[other] = (queries.block(q) == queries.block(r)) & ~parts_differ(
                queries.parts, queries.rows(q), queries.parts, queries.rows(r), scratch=scratch
            )
        c, ck = cand, cand_key
        if rounds > 1:
            active = rep < nq
            key_group = torch.full((keys.numel(),), -1, dtype=torch.int64)
            key_group[active] = torch.arange(n_groups, n_groups + int(active.sum()))
            n_groups += int(active.sum())
            of_query[pending[same]] = key_group[pend_key[same]]
            sel = active[cand_key]
            c, ck = cand[sel], cand_key[sel]
        equal = _verify(hay, c, queries, rep[ck], scratch=scratch)
        misses += c.numel() - int(equal.sum())
        if not strong and misses > _LINE_MISSES + nq:
            return match(hay.strong(), queries.strong(), scratch=scratch, strong=True)
        hays.append(c[equal])
        groups.append(key_group[ck[equal]])
        pending = pending[~same]
    return Matches(torch.cat(hays), torch.cat(groups), of_query, n_groups)

"""Slot-by-slot comparison of a subject run's KV snapshots with the reference run's, and classification.

Both runs see the same schedule and the same slot assignments (the scheduler depends on the timeline
alone), so step s of one lines up with step s of the other. Comparison is over live slots only: every
token of a running request in the full pool, and in the SWA pool the tokens its next query reads. The
dummy slot 0 is never compared, but the steps in which a run changed it are counted.

A bad slot is classified by where its content came from, the first rule that applies winning:

- ``unwritten``: still poison (K and V);
- ``overwritten``: it holds another live token's row (named by request and position; the last such
  token in live order);
- ``overwritten``: it changed in a step that did not write its owner;
- ``misplaced``: the expected row is not here but sits in another slot of the same layer (the lowest);
- ``unwritten``: the token was written this step and the slot kept its old bytes;
- ``drift``: none of the above, a numeric difference (its size is reported).

Cost. Rows are compared as integer words (bitwise, so NaN payloads compare equal to themselves), a
pool at a time (its layers one after another), in large chunks; with nothing different that is the whole
diff, one read of both caches. A pool with bad rows is classified with vectors, all its layers at once:
each row of the subject's pool gets a line hash (two words of its first cache line, salted with its
layer), and two lookups by hash answer "which live token's row is this" and "where did the expected row
go" for every bad row together, so the work grows with the pool once plus the bad rows, never with their
product. Hashes only nominate candidates; every candidate is compared byte for byte, so a hash collision
costs time, never a wrong verdict, and a lookup whose line hashes nominate too many wrong rows (rows alike
in their first line) starts over on whole-row hashes. Full rows are read only for those comparisons and
for the rules that need bytes; the previous step's line hashes are kept for the previous-step rule.
Mismatch records (with their detail text) are built only for the first ``limit``; the rest are counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..serving.pool import poison_
from .snapshot import FULL_SLOT, IN_WINDOW, SWA_SLOT, KVSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class KVMismatch:
    step: int
    pool: str
    """"full", "swa" or "hidden" (a final hidden state rather than a KV slot)"""
    layer: int | None
    slot: int | None
    rid: str
    pos: int
    what: str
    """"k", "v", "kv" or "hidden\""""
    classification: str
    detail: str
    holder: str | None = None
    """``rid@pos`` of the live token whose K/V an overwritten slot holds, when one does"""
    found_in: int | None = None
    """the slot where a misplaced row's expected K/V was found"""

    def where(self) -> str:
        if self.pool == "hidden":
            return f"step {self.step}, hidden state of {self.rid}@{self.pos}"
        return f"step {self.step}, {self.pool} pool, layer {self.layer}, slot {self.slot} (owner {self.rid}@{self.pos})"


@dataclass(frozen=True, slots=True, kw_only=True)
class DiffResult:
    mismatches: tuple[KVMismatch, ...]
    """the first ``limit`` mismatches in step order"""
    total: int
    mismatched_slots: int
    """distinct (pool, slot) pairs that differed in some layer at some step"""
    classes: tuple[tuple[str, int], ...]
    dummy_writes: int
    """(step, pool, layer) triples in which the subject changed a dummy slot"""
    steps_compared: int


# Classification codes, in rule order; detail None: it names a token, a slot or a size.
POISONED, HOLDS_OTHER, CHANGED_UNWRITTEN, MISPLACED, KEPT_OLD, QUANT_DIFF, DRIFT = range(7)
_CLASSES: tuple[tuple[str, str | None], ...] = (
    ("unwritten", "slot still holds poison"),
    ("overwritten", None),
    ("overwritten", "changed in a step that did not write its owner: a padded row or a stale location"),
    ("misplaced", None),
    ("unwritten", "slot kept its previous contents"),
    ("drift", "quantized bytes differ"),
    ("drift", None),  # its detail, NaN or the size of the difference, is read only for reported rows
)
_WHAT = ("k", "v", "kv")

# Rows are compared this many bytes at a time: per-call overhead, thread wake-ups included, vanishes at
# this size (measured: 2-8 MiB chunks cost 1.1-1.5x as much). Gathered rows go through buffers of a
# quarter of that: a gathered chunk costs the same from 4 MiB up, and every buffer is fresh memory in each
# diff, paying a page fault per 4 KiB on first touch (32 MiB buffers cost a tenth of a diff of 1 GiB).
_CHUNK_BYTES = 32 << 20
_GATHER_CHUNK_BYTES = 4 << 20
# Below this share of live slots, gathering the live rows costs less than streaming the whole layer
# (measured: a gathered row costs 2.5 to 3.5 streamed rows on CPU).
_GATHER_BELOW = 0.4


# A row's first cache line is all the line hash reads (a sixteenth of a 1 KiB row's bytes), and in K data
# it already tells rows apart.
_LINE_BYTES = 64
# A lookup whose line hashes prove useless (rows alike in their first line, unlike further on) starts
# over with whole-row hashes once its failed byte comparisons pass this many plus one per query, or it
# needs more than this many rounds.
_LINE_MISSES = 1024
_LINE_ROUNDS = 4
_LAYER_SALT = 0x9E3779B97F4A7C15 - (1 << 64)  # odd, as int64
_SHARED = -2  # a bucket of ``_hash_hits``'s table that more than one key falls in


def _take(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t[index]`` for an integer index along the first dimension: ``index_select`` runs four times as fast
    as advanced indexing on CPU for large indices (measured), and these gathers are most of the diff's
    bookkeeping."""
    return t.index_select(0, index)


def _words(rows: torch.Tensor) -> torch.Tensor:
    """[..., H, D] -> [..., words]: each row's bytes viewed as the widest integers that tile it (no copy)."""
    flat = rows.flatten(-2).view(torch.uint8)
    for dtype in (torch.int64, torch.int32, torch.int16):
        if flat.shape[-1] % dtype.itemsize == 0:
            return flat.view(dtype)
    return flat


class _Scratch:
    """Buffers reused for the whole diff: a fresh large tensor pays a page fault per 4 KiB on first touch,
    which costs more than the comparison done in it."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        n = math.prod(shape)
        buf = self._buffers.get((name, dtype))
        if buf is None or buf.numel() < n:
            buf = self._buffers[(name, dtype)] = torch.empty(n, dtype=dtype)
        return buf[:n].view(shape)


def _any_per_row(flags: torch.Tensor) -> torch.Tensor:
    """[n, w] bool -> [n]. ``any`` over a short last dim is slow on CPU; a sum of the flags read eight at a
    time as int64 is not, and cannot wrap to zero below 256 such words (each is at most 0x0101...01)."""
    if flags.shape[1] % 8 or flags.shape[1] // 8 > 255:
        return flags.any(1)
    return flags.view(torch.uint8).view(torch.int64).sum(1) != 0


def _chunk_rows(words: torch.Tensor, gathered: bool = False) -> int:
    return max(1, (_GATHER_CHUNK_BYTES if gathered else _CHUNK_BYTES) // max(1, words.shape[1] * words.element_size()))


def _streams(rows: torch.Tensor | None, total: int) -> bool:
    """Whether comparing ``rows`` of tensors of ``total`` rows reads them all in order rather than gathering."""
    return rows is None or rows.numel() >= _GATHER_BELOW * total


def _rows_differ(
    a: torch.Tensor,
    b: torch.Tensor,
    a_rows: torch.Tensor | None = None,
    b_rows: torch.Tensor | None = None,
    *,
    scratch: _Scratch,
) -> torch.Tensor:
    """[n] bool: row ``a_rows[i]`` of ``a`` and row ``b_rows[i]`` of ``b`` differ (word tensors [*, w]; no
    index means row i). Indexed rows are gathered a chunk at a time, never all at once."""
    n = next((r.numel() for r in (a_rows, b_rows) if r is not None), a.shape[0])
    out = torch.empty(n, dtype=torch.bool)
    chunk = _chunk_rows(a, gathered=a_rows is not None or b_rows is not None)
    for i in range(0, n, chunk):
        rows = min(chunk, n - i)
        x, y = (
            t[i : i + rows] if index is None else torch.index_select(
                t, 0, index[i : i + rows], out=scratch.get(name, (rows, t.shape[1]), t.dtype)
            )
            for t, index, name in ((a, a_rows, "a"), (b, b_rows, "b"))
        )
        flags = scratch.get("flags", (rows, a.shape[1]), torch.bool)
        torch.ne(x, y, out=flags)
        out[i : i + rows] = _any_per_row(flags)
    return out


def _row_hash(words: torch.Tensor) -> torch.Tensor:
    """[n, w] integer words -> [n] int64: the wrapping sum of each row's words.

    Weak mixing is fine here: a hash only nominates candidates, each then compared byte for byte, and a
    plain sum only confuses rows whose differences cancel (words swapped between positions), which
    distinct rows of real K data rarely are. What matters is that it keeps up with memory (multiplying
    the words by constants first costs 2.5 times as much on CPUs without AVX-512).
    """
    out = torch.empty(words.shape[0], dtype=torch.int64)
    chunk = _chunk_rows(words)
    for i in range(0, words.shape[0], chunk):
        torch.sum(words[i : i + chunk], 1, dtype=torch.int64, out=out[i : i + chunk])
    return out


def _line_hash(words: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """[n] int64: the wrapping sum of the first and the last word of each row's first cache line (of
    ``rows`` only).

    Reading one line of a 1 KiB row costs a sixth of reading the row, and two words of it half as much
    as summing the whole line (measured), which is what lets a layer be hashed whole for every lookup.
    """
    last = max(1, min(words.shape[1], _LINE_BYTES // words.element_size())) - 1
    if rows is None:
        first, end = words[:, 0], words[:, last]
    else:
        # a row's first line copied whole, a memcpy per row, costs less than two strided reads of it
        line = words.narrow(1, 0, last + 1).index_select(0, rows)
        first, end = line[:, 0], line[:, last]
    if words.dtype != torch.int64:
        first, end = first.to(torch.int64), end.to(torch.int64)
    return first + end


class _Rows:
    """Rows ``index`` (every row when None) of a (K, V) pair of word tensors that hold a pool's layers one
    after another (row ``layer * layer_rows + slot``), with a hash of each: the line hash of K (or the
    one given), salted with the row's layer so that equal rows of different layers never share a hash.
    ``strong()``: the same rows hashed whole, computed once when asked."""

    __slots__ = ("_strong", "hash", "index", "kv", "layer_rows")

    def __init__(
        self, kv: tuple[torch.Tensor, torch.Tensor], index: torch.Tensor | None, layer_rows: int,
        hash: torch.Tensor | None = None,
    ):
        self.kv = kv
        self.index = index
        self.layer_rows = layer_rows
        self.hash = self.salted(_line_hash(kv[0], index)) if hash is None else hash
        self._strong: _Rows | None = None

    def __len__(self) -> int:
        return self.hash.numel()

    def rows(self, at: torch.Tensor) -> torch.Tensor:
        """Row numbers in ``kv`` of the positions ``at``."""
        return at if self.index is None else _take(self.index, at)

    def layer(self, at: torch.Tensor) -> torch.Tensor:
        return torch.div(self.rows(at), self.layer_rows, rounding_mode="floor")

    def salted(self, hashes: torch.Tensor) -> torch.Tensor:
        if self.index is None:
            return _salted_layers(hashes, self.layer_rows)
        return _salted(hashes, self.index, self.layer_rows)

    def strong(self) -> _Rows:
        if self._strong is None:
            k = self.kv[0] if self.index is None else self.kv[0].index_select(0, self.index)
            self._strong = _Rows(self.kv, self.index, self.layer_rows, self.salted(_row_hash(k)))
        return self._strong


def _salted_layers(hashes: torch.Tensor, layer_rows: int) -> torch.Tensor:
    """``_salted`` for the hashes of every row of a pool's stacked layers, in order."""
    layers = hashes.numel() // layer_rows
    return (hashes.view(layers, -1) + torch.arange(layers)[:, None] * _LAYER_SALT).flatten()


def _salted(hashes: torch.Tensor, rows: torch.Tensor, layer_rows: int) -> torch.Tensor:
    """``hashes`` of ``rows`` plus an odd constant times each row's layer: rows of two layers then share a
    hash only if their contents differ."""
    return hashes + torch.div(rows, layer_rows, rounding_mode="floor") * _LAYER_SALT


def _kv_differ(
    a: tuple[torch.Tensor, torch.Tensor], a_rows: torch.Tensor, b: tuple[torch.Tensor, torch.Tensor], b_rows: torch.Tensor,
    *, scratch: _Scratch,
) -> torch.Tensor:
    """[n] bool: the K or V words of row ``a_rows[i]`` of ``a`` and row ``b_rows[i]`` of ``b`` differ (V is
    read only where K is equal)."""
    out = _rows_differ(a[0], b[0], a_rows, b_rows, scratch=scratch)
    same = (~out).nonzero().flatten()
    if same.numel():
        out[same] = _rows_differ(a[1], b[1], a_rows[same], b_rows[same], scratch=scratch)
    return out


@dataclass(frozen=True, slots=True)
class _Matches:
    """Row equalities found by ``_match``: hay position ``hay[i]`` equals the rows of content group ``group[i]``."""

    hay: torch.Tensor
    group: torch.Tensor
    of_query: torch.Tensor
    """[queries] content group of each query"""
    groups: int

    def reduce(self, values: torch.Tensor, how: str, empty: int) -> torch.Tensor:
        """Per query, the ``how`` ("amin" or "amax") of ``values`` (one per match) over its matches."""
        out = torch.full((self.groups,), empty, dtype=torch.int64)
        out.scatter_reduce_(0, self.group, values, how)
        return _take(out, self.of_query)


def _hash_hits(keys: torch.Tensor, hashes: torch.Tensor, *, scratch: _Scratch) -> tuple[torch.Tensor, torch.Tensor]:
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
    shared = key_bucket[_take(table, key_bucket) != index]
    if shared.numel():
        table.index_fill_(0, shared, _SHARED)
    key = _take(table, hashes & mask)
    rows = (key != -1).nonzero().flatten()
    key, found = _take(key, rows).long(), _take(hashes, rows)
    crowded = (key == _SHARED).nonzero().flatten()
    if crowded.numel():
        key[crowded] = torch.searchsorted(keys, found[crowded]).clamp_(max=nk - 1)
    hit = (_take(keys, key) == found).nonzero().flatten()
    return _take(rows, hit), _take(key, hit)


def _verify(hay: _Rows, at: torch.Tensor, queries: _Rows, of: torch.Tensor, *, scratch: _Scratch) -> torch.Tensor:
    """[n] bool: hay position ``at[i]`` holds the same K and V words, in the same layer, as query ``of[i]``."""
    # a different layer is no match, whatever its bytes
    near = (hay.layer(at) == queries.layer(of)).nonzero().flatten()
    equal = torch.zeros(at.numel(), dtype=torch.bool)
    # gathered in the hay's address order, which the candidates (found in hay order) seldom are
    hay_rows, order = torch.sort(hay.rows(at[near]))
    near = near[order]
    equal[near] = ~_kv_differ(hay.kv, hay_rows, queries.kv, queries.rows(of[near]), scratch=scratch)
    return equal


def _match(hay: _Rows, queries: _Rows, *, scratch: _Scratch, strong: bool = False) -> _Matches:
    """Every hay row whose K and V words equal a query's, found through hashes and verified byte for byte.

    Queries with equal hashes share one representative (the lowest), so a row repeated many times in the
    hay (poison, zeros) is verified once per distinct query content, not once per query. A query whose
    bytes differ from its representative's (a hash collision) waits for a later round with a
    representative of its own (so k distinct rows sharing one hash cost k rounds). When the line hashes
    collide that much, or nominate many rows that turn out different, the lookup starts over on whole-row
    hashes: the time the line hash saves is never paid back worse than one extra pass.
    """
    nq = len(queries)
    if nq == 0 or len(hay) == 0:
        empty = torch.empty(0, dtype=torch.int64)
        return _Matches(empty, empty, torch.zeros(nq, dtype=torch.int64), 1)
    keys, bucket = torch.unique(queries.hash, return_inverse=True)
    cand, cand_key = _hash_hits(keys, hay.hash, scratch=scratch)
    # In the first round every key has a representative and is its own group; queries that collide with
    # theirs get groups of their own in later rounds.
    of_query, n_groups, key_group = bucket.clone(), keys.numel(), torch.arange(keys.numel())
    hays, groups = [], []
    pending = torch.arange(nq)
    misses = rounds = 0
    while pending.numel():
        rounds += 1
        if not strong and rounds > _LINE_ROUNDS:
            return _match(hay.strong(), queries.strong(), scratch=scratch, strong=True)
        pend_key = bucket[pending]
        rep = torch.full((keys.numel(),), nq, dtype=torch.int64).scatter_reduce_(0, pend_key, pending, "amin")
        rep_of = rep[pend_key]
        same = rep_of == pending
        other = (~same).nonzero().flatten()
        if other.numel():
            q, r = pending[other], rep_of[other]
            same[other] = (queries.layer(q) == queries.layer(r)) & ~_kv_differ(
                queries.kv, queries.rows(q), queries.kv, queries.rows(r), scratch=scratch
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
            return _match(hay.strong(), queries.strong(), scratch=scratch, strong=True)
        hays.append(c[equal])
        groups.append(key_group[ck[equal]])
        pending = pending[~same]
    return _Matches(torch.cat(hays), torch.cat(groups), of_query, n_groups)


def _stacked(pool: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """[L, S, H, D] -> [L * S, H, D]: a pool's layers one after another (a view of a snapshot's tensors)."""
    return pool[0].flatten(0, 1), pool[1].flatten(0, 1)


def _poison_words(dtype: torch.dtype, row_shape: torch.Size) -> torch.Tensor:
    """[1, w] the words of a poisoned row."""
    row = torch.empty((1, *row_shape), dtype=dtype)
    poison_(row)
    return _words(row)


@dataclass(frozen=True, slots=True)
class _Bad:
    """Bad rows of one pool in one step, classified; ``token`` indexes the snapshot's live tokens."""

    layer: torch.Tensor
    slot: torch.Tensor
    token: torch.Tensor
    what: torch.Tensor
    code: torch.Tensor
    arg: torch.Tensor
    """live index of the holder (HOLDS_OTHER), slot of the expected row (MISPLACED), else -1"""


class _Differ:
    def __init__(self, *, layer_ids: dict[str, list[int]], exact: bool, atol: float, rtol: float, limit: int):
        self.layer_ids = layer_ids
        self.exact = exact
        self.atol = atol
        self.rtol = rtol
        self.limit = limit
        self.scratch = _Scratch()
        self.found: list[KVMismatch] = []
        self.total = 0
        self.seen: dict[str, torch.Tensor] = {}
        self.last_lines: dict[str, torch.Tensor | None] = {}
        """pool -> the subject's salted line hashes of every row at the last step compared, when streamed"""
        self.counts = torch.zeros(len(_CLASSES), dtype=torch.int64)
        self.hidden_classes: dict[str, int] = {}

    def bytes_only(self, dtype: torch.dtype) -> bool:
        return self.exact or dtype == torch.uint8

    def differs(self, a: torch.Tensor, b: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """[n] bool per row of ``a``, ``b`` [S, H, D] (only ``rows``): bytes differ, or beyond tolerance.
        Every row is read in order when ``rows`` cover enough of them (``_streams``), else only ``rows``."""
        wa, wb = _words(a), _words(b)
        if _streams(rows, a.shape[0]):
            bad = _rows_differ(wa, wb, scratch=self.scratch)
            bad = bad if rows is None else _take(bad, rows)
        else:
            bad = _rows_differ(wa, wb, rows, rows, scratch=self.scratch)
        if self.bytes_only(a.dtype) or not bool(bad.any()):
            return bad
        # Equal bytes are always close (equal_nan), so tolerance is only ever checked where bytes differ.
        at = bad.nonzero().flatten()
        index = at if rows is None else rows[at]
        close = torch.isclose(
            a[index].float(), b[index].float(), atol=self.atol, rtol=self.rtol, equal_nan=True
        ).flatten(1).all(1)
        bad[at[close]] = False
        return bad

    def compare_pool(
        self,
        pool: str,
        sub: tuple[torch.Tensor, torch.Tensor],
        ref: tuple[torch.Tensor, torch.Tensor],
        prev: tuple[torch.Tensor, torch.Tensor] | None,
        tokens: torch.Tensor,
        slots: torch.Tensor,
        written: torch.Tensor,
    ) -> _Bad | None:
        """Classify every bad live row of one pool; ``tokens`` are live indices, ``slots`` their slots here.

        The pool's layers are handled as one tensor of layers x slots rows (row ``layer * slots + slot``),
        so that every step below runs once per pool, however many layers the model has."""
        if slots.numel() == 0 or sub[0].shape[0] == 0:
            self.last_lines[pool] = None
            return None
        layers, size = sub[0].shape[:2]
        n = slots.numel()
        sub, ref = _stacked(sub), _stacked(ref)
        prev = _stacked(prev) if prev is not None else None
        rows = (torch.arange(layers)[:, None] * size + slots).flatten()
        total = layers * size
        bad_k = self.differs(sub[0], ref[0], rows)
        bad_v = self.differs(sub[1], ref[1], rows)
        bad = bad_k | bad_v
        if not bool(bad.any()):
            self.last_lines[pool] = None
            return None
        # Line hashes of every row cost about a tenth of the comparison, so they are taken only when
        # something differs; the subject's are kept for the previous-step rule of the next step.
        lines = _salted_layers(_line_hash(_words(sub[0])), size) if _streams(rows, total) else None
        before, self.last_lines[pool] = self.last_lines.get(pool), lines
        seen = self.seen.setdefault(pool, torch.zeros(size, dtype=torch.bool))
        if seen.numel() < size:
            seen = self.seen[pool] = torch.cat([seen, seen.new_zeros(size - seen.numel())])
        seen[slots[bad.view(layers, n).any(0)]] = True
        if prev is None or before is None or before.numel() != total:
            before = None
        at, code, arg = self._classify(bad.nonzero().flatten(), rows, n, size, sub, ref, prev, written, lines, before)
        what = _take(bad_k, at).long() + 2 * _take(bad_v, at).long() - 1
        holder = code == HOLDS_OTHER
        arg[holder] = tokens[arg[holder]]
        position = at % n
        layer = _take(torch.tensor(self.layer_ids[pool], dtype=torch.int64), torch.div(at, n, rounding_mode="floor"))
        return _Bad(layer, _take(slots, position), _take(tokens, position), what, code, arg)

    def _classify(
        self,
        at: torch.Tensor,
        rows: torch.Tensor,
        n: int,
        size: int,
        sub: tuple[torch.Tensor, torch.Tensor],
        ref: tuple[torch.Tensor, torch.Tensor],
        prev: tuple[torch.Tensor, torch.Tensor] | None,
        written: torch.Tensor,
        lines: torch.Tensor | None,
        before: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The bad rows ``at`` (positions in ``rows``: layer ``at // n``, live position ``at % n``) of a
        pool's stacked layers [layers * size, H, D], reordered by row (gathers in address order run faster),
        with their codes and arguments (a live position for a holder, a slot for a misplaced row).

        ``lines``: the salted line hashes of every row of the subject, ``before``: the same at the previous
        step; each computed here when missing.
        Full rows are read only to confirm what a line hash nominated and for the rules that need the bytes
        (poison, the previous step); everything else is decided on line hashes, where a difference
        already proves that two rows differ.
        """
        scratch = self.scratch
        g, order = torch.sort(_take(rows, at), stable=True)
        at = _take(at, order)
        m = at.numel()
        mine, theirs = (_words(sub[0]), _words(sub[1])), (_words(ref[0]), _words(ref[1]))
        code = torch.full((m,), DRIFT, dtype=torch.int64)
        arg = torch.full((m,), -1, dtype=torch.int64)
        layer = _Rows(mine, None, size, lines)

        poison = _poison_words(sub[0].dtype, sub[0].shape[1:])
        maybe = (_take(layer.hash, g) == _salted(_line_hash(poison).expand(m), g, size)).nonzero().flatten()
        if maybe.numel():
            pattern = poison.expand(maybe.numel(), -1)
            r = g[maybe]
            same = ~(_rows_differ(mine[0], pattern, r, scratch=scratch) | _rows_differ(mine[1], pattern, r, scratch=scratch))
            code[maybe[same]] = POISONED
        opened = (code != POISONED).nonzero().flatten()
        if opened.numel() == 0:
            return at, code, arg

        # Which live token's row does each bad slot hold? The last one in live order whose reference row it is.
        # Byte-exact, a token that is not bad has the same row in both runs, so the subject's hashes serve for
        # it and only the bad tokens' reference rows are hashed.
        want_hash = _Rows(theirs, g, size).hash
        if self.bytes_only(sub[0].dtype):
            live_hash = _take(layer.hash, rows).index_copy_(0, at, want_hash)
            live = _Rows(theirs, rows, size, live_hash)
        else:
            live = _Rows(theirs, rows, size)
        got = _take(g, opened)
        owners = _match(live, _Rows(mine, got, size, _take(layer.hash, got)), scratch=scratch)
        holder = owners.reduce(owners.hay % n, "amax", -1)
        held = holder >= 0
        code[opened[held]] = HOLDS_OTHER
        arg[opened[held]] = holder[held]

        todo = opened[~held]
        kept = torch.zeros(todo.numel(), dtype=torch.bool)
        if prev is not None and todo.numel():
            pg = _take(g, todo)
            before_kv = (_words(prev[0]), _words(prev[1]))
            changed = (_take(before, pg) if before is not None else _Rows(before_kv, pg, size).hash) != _take(layer.hash, pg)
            check = (~changed).nonzero().flatten()
            if check.numel():
                changed[check] = _kv_differ(before_kv, pg[check], mine, pg[check], scratch=scratch)
            was_written = _take(written, _take(at, todo) % n)
            stale = ~was_written & changed
            code[todo[stale]] = CHANGED_UNWRITTEN
            kept = (was_written & ~changed)[~stale]
            todo = todo[~stale]
        if todo.numel():
            # The bad slot itself never holds the expected row (its bytes differ), so the lowest match is elsewhere.
            found = _match(layer, _Rows(theirs, _take(g, todo), size, _take(want_hash, todo)), scratch=scratch)
            elsewhere = found.reduce(found.hay, "amin", len(layer))
            moved = elsewhere < len(layer)
            code[todo[moved]] = MISPLACED
            arg[todo[moved]] = elsewhere[moved] % size
            todo, kept = todo[~moved], kept[~moved]
        code[todo[kept]] = KEPT_OLD
        todo = todo[~kept]
        if sub[0].dtype == torch.uint8:
            code[todo] = QUANT_DIFF
        return at, code, arg

    def end_step(self, step: int, snap: KVSnapshot, ref: KVSnapshot, pools: dict[str, _Bad], hidden: list[KVMismatch]) -> None:
        """Count the step's mismatches and keep the first ones, lowest layer first (later layers read what
        it wrote, so it is the cause), then by slot; hidden states last."""
        bad = {pool: b for pool, b in pools.items() if b is not None}
        for b in bad.values():
            self.counts += torch.bincount(b.code, minlength=len(_CLASSES))
            self.total += b.code.numel()
        self.total += len(hidden)
        for m in hidden:
            self.hidden_classes[m.classification] = self.hidden_classes.get(m.classification, 0) + 1
        room = self.limit - len(self.found)
        if room <= 0 or not bad:
            self.found.extend(hidden[: max(room, 0)])
            return
        names = list(bad)
        cols = [torch.cat([getattr(bad[p], f) for p in names]) for f in ("layer", "slot", "token", "what", "code", "arg")]
        layer, slot, token, what, code, arg = cols
        pool_of = torch.cat([torch.full_like(bad[p].code, i) for i, p in enumerate(names)])
        # Order as a stable sort by (layer, slot) of rows listed pool by pool, layer by layer, token by token.
        key = (layer * (int(slot.max()) + 1) + slot) * (code.numel() + 1) + torch.arange(code.numel())
        first = torch.topk(key, min(room, key.numel()), largest=False).indices if room < key.numel() else torch.arange(key.numel())
        first = first[torch.argsort(key[first])]
        picked = list(zip(*(col[first].tolist() for col in (pool_of, layer, slot, token, what, code, arg))))
        sizes = self._drift_sizes([(names[p], l, sl) for p, l, sl, _, _, c, _ in picked if c == DRIFT], snap, ref)
        for p, l, sl, t, w, c, a in picked:
            tok = snap.live[t]
            self.found.append(
                KVMismatch(
                    step=step, pool=names[p], layer=l, slot=sl, rid=tok.rid, pos=tok.pos, what=_WHAT[w],
                    classification=_CLASSES[c][0], detail=self._detail(c, a, sizes.get((names[p], l, sl)), snap),
                    holder=f"{snap.live[a].rid}@{snap.live[a].pos}" if c == HOLDS_OTHER else None,
                    found_in=a if c == MISPLACED else None,
                )
            )
        self.found.extend(hidden[: self.limit - len(self.found)])

    def _drift_sizes(
        self, where: list[tuple[str, int, int]], sub: KVSnapshot, ref: KVSnapshot
    ) -> dict[tuple[str, int, int], float | None]:
        """(pool, layer, slot) -> the largest |difference| of K and V there; None where the subject's row holds a NaN."""
        out: dict[tuple[str, int, int], float | None] = {}
        for pool in ("full", "swa"):
            mine = [w for w in where if w[0] == pool]
            if not mine:
                continue
            index = {layer: i for i, layer in enumerate(self.layer_ids[pool])}
            li = torch.tensor([index[layer] for _, layer, _ in mine])
            sl = torch.tensor([slot for _, _, slot in mine])
            got = (sub.full_k, sub.full_v) if pool == "full" else (sub.swa_k, sub.swa_v)
            want = (ref.full_k, ref.full_v) if pool == "full" else (ref.swa_k, ref.swa_v)
            size, nan = torch.zeros(len(mine)), torch.zeros(len(mine), dtype=torch.bool)
            for g, w in zip(got, want):
                a, b = g[li, sl].float().flatten(1), w[li, sl].float().flatten(1)
                size = torch.maximum(size, (a - b).abs().amax(1))
                nan |= torch.isnan(a).any(1)
            out.update((key, None if n else s) for key, s, n in zip(mine, size.tolist(), nan.tolist()))
        return out

    def _detail(self, code: int, arg: int, size: float | None, sub: KVSnapshot) -> str:
        fixed = _CLASSES[code][1]
        if fixed is not None:
            return fixed
        if code == HOLDS_OTHER:
            holder = sub.live[arg]
            return f"holds the K/V of {holder.rid}@{holder.pos}"
        if code == MISPLACED:
            return f"expected row found in slot {arg}"
        return "computed NaN" if size is None else f"max |diff| {size:.3g}"

    def classes(self) -> tuple[tuple[str, int], ...]:
        out = dict(self.hidden_classes)
        for code, count in enumerate(self.counts.tolist()):
            if count:
                name = _CLASSES[code][0]
                out[name] = out.get(name, 0) + count
        return tuple(sorted(out.items()))


def diff_runs(
    subject: tuple[KVSnapshot, ...],
    reference: tuple[KVSnapshot, ...],
    *,
    layer_is_swa: tuple[bool, ...],
    exact: bool = True,
    atol: float = 0.0,
    rtol: float = 0.0,
    limit: int = 200,
) -> DiffResult:
    """Compare the steps both runs completed; ``exact`` demands equal bytes, else per-dtype closeness."""
    layer_ids = {
        "full": [i for i, swa in enumerate(layer_is_swa) if not swa],
        "swa": [i for i, swa in enumerate(layer_is_swa) if swa],
    }
    d = _Differ(layer_ids=layer_ids, exact=exact, atol=atol, rtol=rtol, limit=limit)
    dummy_writes = 0
    prev: KVSnapshot | None = None
    steps = min(len(subject), len(reference))
    for sub, ref in zip(subject, reference):
        if not sub.same_schedule(ref):
            raise RuntimeError(f"step {sub.step}: subject and reference schedules differ; the scheduler is not deterministic")
        table = sub.live_table
        everyone = torch.arange(table.shape[0])
        in_window = table[:, IN_WINDOW].bool()
        pools = {
            "full": d.compare_pool(
                "full", (sub.full_k, sub.full_v), (ref.full_k, ref.full_v),
                (prev.full_k, prev.full_v) if prev else None, everyone, table[:, FULL_SLOT], sub.live_written,
            ),
            "swa": d.compare_pool(
                "swa", (sub.swa_k, sub.swa_v), (ref.swa_k, ref.swa_v),
                (prev.swa_k, prev.swa_v) if prev else None, everyone[in_window], table[in_window, SWA_SLOT],
                sub.live_written[in_window],
            ),
        }
        dummy_writes += _dummy_changes(sub, prev, d.scratch)
        d.end_step(sub.step, sub, ref, pools, _hidden_mismatches(d, sub, ref))
        prev = sub
    return DiffResult(
        mismatches=tuple(d.found),
        total=d.total,
        mismatched_slots=sum(int(s.sum()) for s in d.seen.values()),
        classes=d.classes(),
        dummy_writes=dummy_writes,
        steps_compared=steps,
    )


def _hidden_mismatches(d: _Differ, sub: KVSnapshot, ref: KVSnapshot) -> list[KVMismatch]:
    if sub.hidden.shape != ref.hidden.shape or not sub.hidden.numel():
        return []
    out = []
    for row in d.differs(sub.hidden[:, None, :], ref.hidden[:, None, :]).nonzero().flatten().tolist():
        key = sub.hidden_owners[row]
        got, want = sub.hidden[row].float(), ref.hidden[row].float()
        nan = bool(torch.isnan(got).any())
        out.append(
            KVMismatch(
                step=sub.step, pool="hidden", layer=None, slot=None, rid=key.rid, pos=key.pos, what="hidden",
                classification="drift",
                detail="NaN in hidden state" if nan else f"max |diff| {float((got - want).abs().max()):.3g}",
            )
        )
    return out


def _dummy_changes(snap: KVSnapshot, prev: KVSnapshot | None, scratch: _Scratch) -> int:
    count = 0
    for now, before in ((snap.full_k, prev.full_k if prev else None), (snap.swa_k, prev.swa_k if prev else None)):
        if now.shape[0] == 0:
            continue
        base = before[:, 0] if before is not None else torch.zeros_like(now[:, 0])
        count += int(_rows_differ(_words(now[:, 0]), _words(base), scratch=scratch).sum())
    return count

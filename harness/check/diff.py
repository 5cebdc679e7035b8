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
layer at a time, in large chunks through reused buffers; with nothing different that is the whole diff,
one read of both caches. A layer with bad rows is classified with vectors: its subject rows are hashed
once, and one hash lookup answers both "which live token's row is this" and "where did the expected row
go" for every bad row at once, so the work grows with the layer once plus the bad rows, never with their
product. Hashes only nominate candidates; every candidate is compared byte for byte, so a hash collision
costs time, never a wrong verdict. Mismatch records (with their detail text) are built only for the
first ``limit``; the rest are counted.
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
POISONED, HOLDS_OTHER, CHANGED_UNWRITTEN, MISPLACED, KEPT_OLD, QUANT_DIFF, NAN, DRIFT = range(8)
_CLASSES: tuple[tuple[str, str | None], ...] = (
    ("unwritten", "slot still holds poison"),
    ("overwritten", None),
    ("overwritten", "changed in a step that did not write its owner: a padded row or a stale location"),
    ("misplaced", None),
    ("unwritten", "slot kept its previous contents"),
    ("drift", "quantized bytes differ"),
    ("drift", "computed NaN"),
    ("drift", None),
)
_WHAT = ("k", "v", "kv")

# Rows are compared and hashed this many bytes at a time: per-call overhead, thread wake-ups included,
# vanishes at this size (measured: 2-8 MiB chunks cost 1.1-1.5x as much), and the buffers stay modest.
_CHUNK_BYTES = 32 << 20
# Below this share of live slots, gathering the live rows costs less than streaming the whole layer
# (measured: a gathered row costs 2.5 to 3.5 streamed rows on CPU).
_GATHER_BELOW = 0.4


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


def _chunk_rows(words: torch.Tensor) -> int:
    return max(1, _CHUNK_BYTES // max(1, words.shape[1] * words.element_size()))


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
    if a_rows is not None and a_rows is b_rows and a_rows.numel() >= _GATHER_BELOW * a.shape[0]:
        return _rows_differ(a, b, scratch=scratch)[a_rows]
    n = next((r.numel() for r in (a_rows, b_rows) if r is not None), a.shape[0])
    out = torch.empty(n, dtype=torch.bool)
    chunk = _chunk_rows(a)
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


@dataclass(frozen=True, slots=True)
class _Matches:
    """Row equalities found by ``_match``: ``hay[i]`` equals the rows of content group ``group[i]``."""

    hay: torch.Tensor
    group: torch.Tensor
    of_query: torch.Tensor
    """[queries] content group of each query"""
    groups: int

    def reduce(self, values: torch.Tensor, how: str, empty: int) -> torch.Tensor:
        """Per query, the ``how`` ("amin" or "amax") of ``values`` (one per match) over its matches."""
        out = torch.full((self.groups,), empty, dtype=torch.int64)
        out.scatter_reduce_(0, self.group, values, how)
        return out[self.of_query]


def _hash_hits(keys: torch.Tensor, hashes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (i, j) with ``hashes[i] == keys[j]``, for distinct ``keys``.

    A table indexed by the hashes' low bits, four slots or more per key, says which buckets hold a key at
    all; most rows are dismissed by one lookup in that cache-resident table (a binary search per row, as
    ``searchsorted`` does, costs four times as much).
    """
    mask = (1 << max(10, (4 * keys.numel() - 1).bit_length())) - 1
    key_bucket = keys & mask
    by_bucket = torch.argsort(key_bucket)
    count = torch.bincount(key_bucket, minlength=mask + 1)
    start = torch.cumsum(count, 0) - count
    bucket = hashes & mask
    rows = count[bucket].nonzero().flatten()
    each = count[bucket[rows]]
    if rows.numel() and int(each.max()) > 1:
        first = torch.cumsum(each, 0) - each
        rows = torch.repeat_interleave(rows, each)
        offset = torch.arange(rows.numel()) - torch.repeat_interleave(first, each)
    else:
        offset = 0
    key = by_bucket[start[bucket[rows]] + offset]
    hit = keys[key] == hashes[rows]
    return rows[hit], key[hit]


def _match(
    hay: tuple[torch.Tensor, torch.Tensor],
    hay_hash: torch.Tensor,
    queries: tuple[torch.Tensor, torch.Tensor],
    query_hash: torch.Tensor,
    home: torch.Tensor | None = None,
    *,
    scratch: _Scratch,
) -> _Matches:
    """Every hay row whose K and V words equal a query's, found through hashes and verified byte for byte.

    Queries with equal hashes share one representative, so a row repeated many times in the hay (poison,
    zeros) is verified once per distinct query content, not once per query. A query whose bytes differ
    from its representative's (a hash collision) waits for a later round with a representative of its own
    (so k distinct rows sharing one hash cost k rounds: fine for collisions, which are rare).
    ``home[q]`` is a hay row known to equal query q (it was read from there), or -1; it is not re-read.
    """
    nq = query_hash.numel()
    if nq == 0 or hay_hash.numel() == 0:
        empty = torch.empty(0, dtype=torch.int64)
        return _Matches(empty, empty, torch.zeros(nq, dtype=torch.int64), 1)
    keys, bucket = torch.unique(query_hash, return_inverse=True)
    cand, cand_bucket = _hash_hits(keys, hay_hash)
    of_query = torch.empty(nq, dtype=torch.int64)
    hays, groups = [], []
    n_groups = 0
    pending = torch.arange(nq)
    while pending.numel():
        pend_bucket = bucket[pending]
        rep = torch.full((keys.numel(),), nq, dtype=torch.int64).scatter_reduce_(0, pend_bucket, pending, "amin")
        active = rep < nq
        group_of = torch.full((keys.numel(),), -1, dtype=torch.int64)
        group_of[active] = torch.arange(n_groups, n_groups + int(active.sum()))
        n_groups += int(active.sum())
        rep_of = rep[pend_bucket]
        same = rep_of == pending
        other = (~same).nonzero().flatten()
        if other.numel():
            q, r = pending[other], rep_of[other]
            same[other] = ~(
                _rows_differ(queries[0], queries[0], q, r, scratch=scratch)
                | _rows_differ(queries[1], queries[1], q, r, scratch=scratch)
            )
        of_query[pending[same]] = group_of[pend_bucket[same]]
        sel = active[cand_bucket]
        c, cb = cand[sel], cand_bucket[sel]
        r = rep[cb]
        equal = c == home[r] if home is not None else torch.zeros(c.numel(), dtype=torch.bool)
        check = (~equal).nonzero().flatten()
        if check.numel():
            c_check, r_check = c[check], r[check]
            equal[check] = ~(
                _rows_differ(hay[0], queries[0], c_check, r_check, scratch=scratch)
                | _rows_differ(hay[1], queries[1], c_check, r_check, scratch=scratch)
            )
        hays.append(c[equal])
        groups.append(group_of[cb[equal]])
        pending = pending[~same]
    return _Matches(torch.cat(hays), torch.cat(groups), of_query, n_groups)


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
        self.counts = torch.zeros(len(_CLASSES), dtype=torch.int64)
        self.hidden_classes: dict[str, int] = {}

    def bytes_only(self, dtype: torch.dtype) -> bool:
        return self.exact or dtype == torch.uint8

    def differs(self, a: torch.Tensor, b: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """[n] bool per row of ``a``, ``b`` [S, H, D] (only ``rows``): bytes differ, or beyond tolerance."""
        bad = _rows_differ(_words(a), _words(b), rows, rows, scratch=self.scratch)
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
        """Classify every bad live row of one pool; ``tokens`` are live indices, ``slots`` their slots here."""
        if slots.numel() == 0 or sub[0].shape[0] == 0:
            return None
        layers, size = sub[0].shape[:2]
        bad_k = torch.stack([self.differs(sub[0][l], ref[0][l], slots) for l in range(layers)])
        bad_v = torch.stack([self.differs(sub[1][l], ref[1][l], slots) for l in range(layers)])
        bad = bad_k | bad_v
        if not bool(bad.any()):
            return None
        seen = self.seen.setdefault(pool, torch.zeros(size, dtype=torch.bool))
        if seen.numel() < size:
            seen = self.seen[pool] = torch.cat([seen, seen.new_zeros(size - seen.numel())])
        seen[slots[bad.any(0)]] = True
        parts = []
        for l in bad.any(1).nonzero().flatten().tolist():
            at = bad[l].nonzero().flatten()
            at, code, arg = self._classify_layer(
                at, bad[l], slots, (sub[0][l], sub[1][l]), (ref[0][l], ref[1][l]),
                (prev[0][l], prev[1][l]) if prev is not None else None, written,
            )
            what = bad_k[l, at].long() + 2 * bad_v[l, at].long() - 1
            holder = code == HOLDS_OTHER
            arg[holder] = tokens[arg[holder]]
            parts.append((torch.full_like(at, self.layer_ids[pool][l]), slots[at], tokens[at], what, code, arg))
        return _Bad(*(torch.cat(cols) for cols in zip(*parts)))

    def _classify_layer(
        self,
        at: torch.Tensor,
        bad: torch.Tensor,
        slots: torch.Tensor,
        sub: tuple[torch.Tensor, torch.Tensor],
        ref: tuple[torch.Tensor, torch.Tensor],
        prev: tuple[torch.Tensor, torch.Tensor] | None,
        written: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The bad rows ``at`` (positions in ``slots``) of one layer [S, H, D], reordered by slot (gathers in
        address order run faster), with their codes and arguments."""
        scratch = self.scratch
        s, order = torch.sort(slots[at], stable=True)
        at = at[order]
        size, m = sub[0].shape[0], at.numel()
        layer = (_words(sub[0]), _words(sub[1]))
        code = torch.full((m,), DRIFT, dtype=torch.int64)
        arg = torch.full((m,), -1, dtype=torch.int64)

        # The layer's rows are hashed once; that serves the poison test as well as the lookups below.
        layer_hash = _row_hash(layer[0])
        got_hash = layer_hash[s]
        poison = _poison_words(sub[0].dtype, sub[0].shape[1:])
        maybe = (got_hash == _row_hash(poison)).nonzero().flatten()
        if maybe.numel():
            pattern = poison.expand(maybe.numel(), -1)
            rows = s[maybe]
            same = ~(_rows_differ(layer[0], pattern, rows, scratch=scratch) | _rows_differ(layer[1], pattern, rows, scratch=scratch))
            code[maybe[same]] = POISONED
        opened = (code != POISONED).nonzero().flatten()
        if opened.numel() == 0:
            return at, code, arg
        k, so = opened.numel(), s[opened]
        # Each row is read once: [0, m) of each buffer is what the reference has in the bad slots, [m, m + k)
        # what the subject has in those that are not poison.
        buffers = []
        for name, mine, theirs in zip(("k", "v"), layer, (_words(ref[0]), _words(ref[1]))):
            buf = scratch.get(f"bad {name}", (m + k, mine.shape[1]), mine.dtype)
            torch.index_select(theirs, 0, s, out=buf[:m])
            torch.index_select(mine, 0, so, out=buf[m:])
            buffers.append(buf)
        rows = (buffers[0], buffers[1])
        want, got = (rows[0][:m], rows[1][:m]), (rows[0][m:], rows[1][m:])
        want_hash, got_hash = _row_hash(want[0]), got_hash[opened]

        # One lookup over the layer answers, for every bad row at once, which slots hold the row it should
        # have and which hold the row it got (to name a live token whose row that is).
        in_layer = _match(
            layer, layer_hash, rows, torch.cat([want_hash, got_hash]),
            home=torch.cat([torch.full_like(s, -1), so]), scratch=scratch,
        )
        if self.bytes_only(sub[0].dtype):
            # A token that is not bad in this layer has the same bytes in both runs, so its reference row
            # is among the subject's rows; a bad token's reference row is its expected row.
            trusted = (~bad).nonzero().flatten()
            owner_at = torch.full((size,), -1, dtype=torch.int64)
            owner_at.scatter_reduce_(0, slots[trusted], trusted, "amax")
            holder = in_layer.reduce(owner_at[in_layer.hay], "amax", -1)[m:]
            among_bad = _match(want, want_hash, got, got_hash, scratch=scratch)
            holder = torch.maximum(holder, among_bad.reduce(at[among_bad.hay], "amax", -1))
        else:
            every = (_words(ref[0].index_select(0, slots)), _words(ref[1].index_select(0, slots)))
            owners = _match(every, _row_hash(every[0]), got, got_hash, scratch=scratch)
            holder = owners.reduce(owners.hay, "amax", -1)
        held = holder >= 0
        code[opened[held]] = HOLDS_OTHER
        arg[opened[held]] = holder[held]

        # Still open: ``todo`` indexes the bad rows, ``g`` the got rows.
        g = (~held).nonzero().flatten()
        todo = opened[g]
        elsewhere = in_layer.reduce(in_layer.hay, "amin", size)[:m][todo]
        kept = torch.zeros(todo.numel(), dtype=torch.bool)
        if prev is not None:
            ps = s[todo]
            before = (_words(prev[0]), _words(prev[1]))
            changed = _rows_differ(before[0], got[0], ps, g, scratch=scratch) | _rows_differ(
                before[1], got[1], ps, g, scratch=scratch
            )
            was_written = written[at[todo]]
            stale = ~was_written & changed
            code[todo[stale]] = CHANGED_UNWRITTEN
            kept = (was_written & ~changed)[~stale]
            todo, g, elsewhere = todo[~stale], g[~stale], elsewhere[~stale]
        # The bad slot itself never holds the expected row (its bytes differ), so the lowest match is elsewhere.
        moved = elsewhere < size
        code[todo[moved]] = MISPLACED
        arg[todo[moved]] = elsewhere[moved]
        todo, g, kept = todo[~moved], g[~moved], kept[~moved]
        code[todo[kept]] = KEPT_OLD
        todo, g = todo[~kept], g[~kept]
        if sub[0].dtype == torch.uint8:
            code[todo] = QUANT_DIFF
        elif todo.numel():
            nan = torch.isnan(got[0][g].view(sub[0].dtype)).any(1) | torch.isnan(got[1][g].view(sub[1].dtype)).any(1)
            code[todo[nan]] = NAN
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
        picked = zip(*(col[first].tolist() for col in (pool_of, layer, slot, token, what, code, arg)))
        for p, l, sl, t, w, c, a in picked:
            tok = snap.live[t]
            self.found.append(
                KVMismatch(
                    step=step, pool=names[p], layer=l, slot=sl, rid=tok.rid, pos=tok.pos, what=_WHAT[w],
                    classification=_CLASSES[c][0], detail=self._detail(c, a, names[p], l, sl, snap, ref),
                    holder=f"{snap.live[a].rid}@{snap.live[a].pos}" if c == HOLDS_OTHER else None,
                    found_in=a if c == MISPLACED else None,
                )
            )
        self.found.extend(hidden[: self.limit - len(self.found)])

    def _detail(self, code: int, arg: int, pool: str, layer: int, slot: int, sub: KVSnapshot, ref: KVSnapshot) -> str:
        fixed = _CLASSES[code][1]
        if fixed is not None:
            return fixed
        if code == HOLDS_OTHER:
            holder = sub.live[arg]
            return f"holds the K/V of {holder.rid}@{holder.pos}"
        if code == MISPLACED:
            return f"expected row found in slot {arg}"
        li = self.layer_ids[pool].index(layer)
        got_k, got_v = (sub.full_k, sub.full_v) if pool == "full" else (sub.swa_k, sub.swa_v)
        want_k, want_v = (ref.full_k, ref.full_v) if pool == "full" else (ref.swa_k, ref.swa_v)
        diff = torch.maximum(
            (got_k[li, slot].float() - want_k[li, slot].float()).abs().max(),
            (got_v[li, slot].float() - want_v[li, slot].float()).abs().max(),
        )
        return f"max |diff| {float(diff):.3g}"

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

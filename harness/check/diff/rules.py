"""Where a bad KV slot's contents came from: the classification rules, one function per rule.

The diff (``diff.py``) finds the bad rows of a pool at a step: (layer, live token) pairs whose slot holds
other bytes than the reference run's. Each bad row then goes to the rules in ``RULES`` order, and the first
rule that claims it names its classification:

1. ``poisoned`` (unwritten): the slot still holds poison, K and V, and the write log says nothing wrote it
   since it was poisoned (a slot written with a value computed from poisoned reads holds poison's bits
   too, since NaN payloads survive arithmetic: that is written garbage, left to the rules below);
2. ``holds_live_row`` (overwritten): it holds another live token's reference row (the last such token in
   live order), named by request and position;
3. ``changed_unwritten`` (overwritten): it changed in a step that did not write its owner;
4. ``misplaced``: the expected row is not here but in another slot of the same layer (the lowest);
5. ``kept_old`` (unwritten): the step was to write the token, nothing wrote the slot (by the write log) and
   it kept its old bytes;
6. ``quantized`` (drift): fp8 bytes differ;
7. ``drift``: none of the above, a numeric difference (its size is reported).

A rule's test is a function ``(bad: BadRows, todo) -> (claimed, arg)``: ``todo`` holds the positions
(in ``bad``) of the rows no earlier rule claimed, ``claimed`` is a bool per ``todo`` row, and ``arg`` an
int64 per claimed row that the rule's ``describe`` reads back (a live token, a slot), or None. A test
works on every open row of the pool at once, with tensor ops, and reads rows through ``BadRows``, which
hands out the pool's stacked layers as hash-join tables (``hashjoin.py``) and computes once what two
rules share (the reference rows' hashes, whether a slot changed since the previous step), whichever rule
asks first. ``describe`` runs only for the rows whose records are kept (the first ``limit`` of a diff)
and returns each record's detail text, and its holder or ``found_in`` where it has one.

Adding a rule (page-level misplacement, a slot shared through a prefix cache):

1. write its test, ``def shared_prefix(bad: BadRows, todo: torch.Tensor) -> Claim``, here or in a module
   of its own, and its ``describe`` (``fixed("...")`` for a fixed text);
2. put ``Rule(name="shared_prefix", classification="...", claims=shared_prefix, describe=...)`` into
   ``RULES`` at the place of its precedence: before the rules it must win over.

Nothing in the diff or the engine changes; ``diff_runs(rules=...)`` takes another list for one diff.
The last rule must claim every row it is given (``drift`` does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ...serving.pool import NEVER_WRITTEN, poison_
from ...serving.timeline import LiveToken
from . import hashjoin as hj

__all__ = ["RULES", "BadRows", "Finding", "Reported", "Rule", "Snapshot", "classify", "fixed"]

Pair = tuple[torch.Tensor, torch.Tensor]
"""(K, V) words of a pool's stacked layers, [layers * slots, words] each"""
Claim = tuple[torch.Tensor, torch.Tensor | None]
"""what a rule's test returns: [len(todo)] bool, and [claimed] int64 or None"""


class BadRows:
    """The bad rows of one pool at one step, what the rules read about them, and the engine to look in
    the pool with. Rows are numbered in the pool's stacked layers: row ``layer * slots + slot``.

    Positions 0..m-1 order the bad rows by row (gathers in address order run faster); ``row[i]`` is the
    row of position i, ``live[i]`` its position among the pool's live rows (``live_rows``: layer
    ``live // n``, live token ``live % n``).
    """

    def __init__(
        self, *, live: torch.Tensor, live_rows: torch.Tensor, n: int, slots: int, tokens: torch.Tensor,
        written: torch.Tensor, sub: Pair, ref: Pair, prev: Pair | None, table: hj.Rows | None,
        before: torch.Tensor | None, last_write: torch.Tensor, step: int, dtype: torch.dtype,
        row_shape: torch.Size, bytes_only: bool, scratch: hj.Scratch,
    ):
        self.row, order = torch.sort(hj.take(live_rows, live), stable=True)
        self.live = hj.take(live, order)
        self.live_rows = live_rows
        """[layers * n] row of each (layer, live token), layer by layer"""
        self.n = n
        """live tokens of the pool"""
        self.slots = slots
        """slots per layer"""
        self.tokens = tokens
        """[n] index of each live token in the snapshot's ``live``"""
        self.written = written
        """[n] bool: the step was to write the live token (its K/V were computed in this step's batch)"""
        self.last_write = last_write
        """[layers * slots] int32: the write log of the subject's pool, the step that last wrote each row since
        it was poisoned (``NEVER_WRITTEN``: none)"""
        self.step = step
        self.sub, self.ref, self.prev = sub, ref, prev
        self.table = hj.Rows(sub, None, slots) if table is None else table
        """every row of the subject's pool, with salted line hashes"""
        self.before = before
        """the same hashes at the previous step, when kept"""
        self.dtype = dtype
        self.row_shape = row_shape
        """[H, D] of a row, in ``dtype`` (``sub`` and the others are its words)"""
        self.bytes_only = bytes_only
        """rows are compared by bytes only (no tolerance): equal rows are equal reference rows"""
        self.scratch = scratch
        self._want: torch.Tensor | None = None
        self._changed: torch.Tensor | None = None
        self._known: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.row.numel()

    def want_hash(self) -> torch.Tensor:
        """[m] salted line hash of each bad row's reference row."""
        if self._want is None:
            self._want = hj.Rows(self.ref, self.row, self.slots).hash
        return self._want

    def was_written(self, at: torch.Tensor) -> torch.Tensor:
        """[len(at)] bool: the step was to write the owners of positions ``at``."""
        return hj.take(self.written, hj.take(self.live, at) % self.n)

    def logged(self, at: torch.Tensor) -> torch.Tensor:
        """[len(at)] int32: the write log's entry for the rows of positions ``at``."""
        return hj.take(self.last_write, hj.take(self.row, at))

    def changed(self, at: torch.Tensor) -> torch.Tensor:
        """[len(at)] bool: the subject's rows at ``at`` changed since the previous step (which must exist)."""
        assert self.prev is not None
        if self._changed is None:
            self._changed = torch.zeros(len(self), dtype=torch.bool)
            self._known = torch.zeros(len(self), dtype=torch.bool)
            need = at
        else:
            need = at[~hj.take(self._known, at)]
        if need.numel():
            rows = hj.take(self.row, need)
            if self.before is not None:
                before = hj.take(self.before, rows)
            else:
                before = hj.Rows(self.prev, rows, self.slots).hash
            changed = before != hj.take(self.table.hash, rows)
            # equal hashes prove nothing: their bytes decide
            check = (~changed).nonzero().flatten()
            if check.numel():
                r = rows[check]
                # rows read from the same bytes at both steps (a large pool's deltas, ``deltas.DeltaRows``)
                # are unchanged without reading them
                place = getattr(self.prev[0], "same_place", None)
                if place is not None:
                    same = place(self.sub[0], r) & self.prev[1].same_place(self.sub[1], r)
                    changed[check[same]] = False
                    check, r = check[~same], r[~same]
                if check.numel():
                    changed[check] = hj.parts_differ(self.prev, r, self.sub, r, scratch=self.scratch)
            self._changed[need] = changed
            self._known[need] = True
        return hj.take(self._changed, at)


@dataclass(frozen=True, slots=True, kw_only=True)
class Reported:
    """A classified bad row whose record is built."""

    pool: str
    """the KV group"""
    layer: int
    """index of the layer among the pool's layers (the first dimension of its tensors)"""
    slot: int
    arg: int
    """what the rule's claim gave this row, -1 for none"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """What a rule says of one reported row."""

    detail: str
    holder: str | None = None
    """``rid@pos`` of the live token whose K/V the slot holds"""
    found_in: int | None = None
    """the slot where the expected row was found"""


class PoolRows(Protocol):
    """One group's pool whole: [layers, slots, Hkv, D] K and V."""

    @property
    def k(self) -> torch.Tensor: ...
    @property
    def v(self) -> torch.Tensor: ...


class Snapshot(Protocol):
    """What a ``describe`` reads of a step's ``snapshot.Cursor`` (not imported: the rules sit on the floor
    below the snapshot's, beside the engine): its live tokens and each KV group's pool by name."""

    @property
    def live(self) -> tuple[LiveToken, ...]: ...
    def pool(self, name: str) -> PoolRows: ...


Describe = Callable[[Sequence[Reported], Snapshot, Snapshot], list[Finding]]
"""(reported rows, subject snapshot, reference snapshot) -> a finding per row"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """One classification rule: which open bad rows it claims, and how a claimed row is described."""

    name: str
    classification: str
    """what the report calls the rows it claims: "unwritten", "overwritten", "misplaced", "drift"..."""
    claims: Callable[[BadRows, torch.Tensor], Claim]
    describe: Describe


def fixed(detail: str) -> Describe:
    """A ``describe`` that says the same ``detail`` of every row."""
    return lambda rows, sub, ref: [Finding(detail=detail)] * len(rows)


def classify(bad: BadRows, rules: Sequence[Rule]) -> tuple[torch.Tensor, torch.Tensor]:
    """[m] the index in ``rules`` of the first rule claiming each bad row, and [m] its argument (-1: none)."""
    m = len(bad)
    code = torch.full((m,), -1, dtype=torch.int64)
    arg = torch.full((m,), -1, dtype=torch.int64)
    todo = torch.arange(m)
    for index, rule in enumerate(rules):
        if not todo.numel():
            break
        claimed, value = rule.claims(bad, todo)
        got = todo[claimed]
        code[got] = index
        if value is not None:
            arg[got] = value
        todo = todo[~claimed]
    if todo.numel():
        raise ValueError(f"no rule claims {todo.numel()} bad rows: the last rule must claim every row")
    return code, arg


# ---- the rules, in order --------------------------------------------------------------------------------

def poisoned(bad: BadRows, todo: torch.Tensor) -> Claim:
    """K and V are the pool's poison and the write log says nothing wrote the slot since it was poisoned."""
    claimed = torch.zeros(todo.numel(), dtype=torch.bool)
    unlogged = (bad.logged(todo) == NEVER_WRITTEN).nonzero().flatten()
    row = hj.take(bad.row, hj.take(todo, unlogged))
    poison = _poison_words(bad.dtype, bad.row_shape)
    maybe = (hj.take(bad.table.hash, row) == hj.salted(hj.line_hash(poison).expand(row.numel()), row, bad.slots))
    maybe = maybe.nonzero().flatten()
    if maybe.numel():
        pattern = poison.expand(maybe.numel(), -1)
        r = row[maybe]
        claimed[unlogged[maybe]] = ~(hj.rows_differ(bad.sub[0], pattern, r, scratch=bad.scratch)
                                     | hj.rows_differ(bad.sub[1], pattern, r, scratch=bad.scratch))
    return claimed, None


def holds_live_row(bad: BadRows, todo: torch.Tensor) -> Claim:
    """The slot holds the reference row of a live token of this layer (the last in live order); its
    argument is that token's index in the snapshot's ``live``."""
    # Byte-exact, a token that is not bad has the same row in both runs, so the subject's hashes serve for
    # it and only the bad tokens' reference rows are hashed.
    if bad.bytes_only:
        live_hash = hj.take(bad.table.hash, bad.live_rows).index_copy_(0, bad.live, bad.want_hash())
        live = hj.Rows(bad.ref, bad.live_rows, bad.slots, live_hash)
    else:
        live = hj.Rows(bad.ref, bad.live_rows, bad.slots)
    got = hj.take(bad.row, todo)
    owners = hj.match(live, hj.Rows(bad.sub, got, bad.slots, hj.take(bad.table.hash, got)), scratch=bad.scratch)
    holder = owners.reduce(owners.hay % bad.n, "amax", -1)
    held = holder >= 0
    return held, bad.tokens[holder[held]]


def changed_unwritten(bad: BadRows, todo: torch.Tensor) -> Claim:
    """The slot changed since the previous step, which did not write its owner: a padded row or a stale
    location wrote it."""
    if bad.prev is None:
        return torch.zeros(todo.numel(), dtype=torch.bool), None
    return ~bad.was_written(todo) & bad.changed(todo), None


def misplaced(bad: BadRows, todo: torch.Tensor) -> Claim:
    """The expected row sits in another slot of the same layer; its argument is the lowest such slot."""
    # The bad slot itself never holds the expected row (its bytes differ), so the lowest match is elsewhere.
    queries = hj.Rows(bad.ref, hj.take(bad.row, todo), bad.slots, hj.take(bad.want_hash(), todo))
    found = hj.match(bad.table, queries, scratch=bad.scratch)
    elsewhere = found.reduce(found.hay, "amin", len(bad.table))
    moved = elsewhere < len(bad.table)
    return moved, elsewhere[moved] % bad.slots


def kept_old(bad: BadRows, todo: torch.Tensor) -> Claim:
    """The step was to write the owner, nothing wrote the slot (by the write log), and it still holds the
    previous step's bytes."""
    if bad.prev is None:
        return torch.zeros(todo.numel(), dtype=torch.bool), None
    return bad.was_written(todo) & (bad.logged(todo) != bad.step) & ~bad.changed(todo), None


def quantized(bad: BadRows, todo: torch.Tensor) -> Claim:
    """fp8 bytes that differ: no size is read from them."""
    return torch.full((todo.numel(),), bad.dtype == torch.uint8, dtype=torch.bool), None


def drift(bad: BadRows, todo: torch.Tensor) -> Claim:
    """Anything else: a numeric difference."""
    return torch.ones(todo.numel(), dtype=torch.bool), None


def _name_holder(rows: Sequence[Reported], sub: Snapshot, ref: Snapshot) -> list[Finding]:
    out = []
    for r in rows:
        holder = sub.live[r.arg]
        out.append(Finding(detail=f"holds the K/V of {holder.rid}@{holder.pos}", holder=f"{holder.rid}@{holder.pos}"))
    return out


def _name_slot(rows: Sequence[Reported], sub: Snapshot, ref: Snapshot) -> list[Finding]:
    return [Finding(detail=f"expected row found in slot {r.arg}", found_in=r.arg) for r in rows]


def _drift_size(rows: Sequence[Reported], sub: Snapshot, ref: Snapshot) -> list[Finding]:
    """The largest |difference| of K and V of each row, NaN named as such (read for reported rows only)."""
    out: dict[int, Finding] = {}
    for pool in dict.fromkeys(r.pool for r in rows):
        mine = [i for i, r in enumerate(rows) if r.pool == pool]
        li = torch.tensor([rows[i].layer for i in mine])
        sl = torch.tensor([rows[i].slot for i in mine])
        got_pool, want_pool = sub.pool(pool), ref.pool(pool)
        got, want = (got_pool.k, got_pool.v), (want_pool.k, want_pool.v)
        size, nan = torch.zeros(len(mine)), torch.zeros(len(mine), dtype=torch.bool)
        for g, w in zip(got, want):
            a, b = g[li, sl].float().flatten(1), w[li, sl].float().flatten(1)
            size = torch.maximum(size, (a - b).abs().amax(1))
            nan |= torch.isnan(a).any(1)
        for i, s, n in zip(mine, size.tolist(), nan.tolist()):
            out[i] = Finding(detail="computed NaN" if n else f"max |diff| {s:.3g}")
    return [out[i] for i in range(len(rows))]


def _poison_words(dtype: torch.dtype, row_shape: torch.Size) -> torch.Tensor:
    """[1, w] the words of a poisoned row."""
    row = torch.empty((1, *row_shape), dtype=dtype)
    poison_(row)
    return hj.words(row)


RULES: list[Rule] = [
    Rule(name="poisoned", classification="unwritten", claims=poisoned, describe=fixed("slot still holds poison")),
    Rule(name="holds_live_row", classification="overwritten", claims=holds_live_row, describe=_name_holder),
    Rule(name="changed_unwritten", classification="overwritten", claims=changed_unwritten,
         describe=fixed("changed in a step that did not write its owner: a padded row or a stale location")),
    Rule(name="misplaced", classification="misplaced", claims=misplaced, describe=_name_slot),
    Rule(name="kept_old", classification="unwritten", claims=kept_old,
         describe=fixed("slot kept its previous contents")),
    Rule(name="quantized", classification="drift", claims=quantized, describe=fixed("quantized bytes differ")),
    Rule(name="drift", classification="drift", claims=drift, describe=_drift_size),
]
"""every classification rule, in precedence order (the first that claims a row wins)"""

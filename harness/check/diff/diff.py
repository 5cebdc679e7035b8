"""Slot-by-slot comparison of a subject run's KV snapshots with the reference run's, and its records.

The scheduler depends on the timeline alone, so both runs normally see the same schedule and the same
slot assignments, and step s of one lines up with step s of the other, slot for slot. The schedule is not
part of the answer, though: a stack or policy may hand out other slots (another free order) and be right.
Where both runs hold the same live tokens but in other slots, each live token's K/V is compared where its
own run keeps it, keyed by (request, position) and KV group (the reference's rows are moved to the
subject's slots for them, ``_Moved``), and the other schedule is a note (``DiffResult.schedule_note``), not
a mismatch; whether each run's slots are owned once and read inside the window is each run's own invariant
checks' (``serving/invariants.py``). Where the live tokens themselves differ (a fault or a design that
changes what the scheduler does: a pool run dry, another eviction), the steps are compared as far as the
schedules agree, and the step where they part is one mismatch of its own (classification ``schedule``:
which live token they disagree on, and how), the last. Comparison is over live slots only:
every token of a running request in a full-attention group (SGLang's full pool), and in a windowed group (its
SWA pool) the tokens its next query reads;
live tokens that share a slot through the prefix cache are one owner of it. The dummy slot 0 is never
compared, but the steps in which a run changed it are counted.

The snapshots hold what each step changed (``snapshot.py``); the diff rebuilds the pools of each step
whole as it goes (three ``Cursor``: the subject's at this step and the previous one, the reference's), for
small pools (a handful of ops a step). A large pool (``_LARGE_BYTES`` and up) is instead read from the
deltas where they lie (``deltas.DeltaCursor``: a slot map, no copy, so the diff's memory stays a small
share of a snapshot's), and a per-row memo of which rows differ from the reference's is brought up to date
with only the slots either run changed in the step, each side read in place from its delta where it can be.
The rules' byte comparisons of rows that lie in the deltas are kept per pair of places (``hashjoin.Pairs``),
and a row the subject's delta map places where it did a step before is unchanged without a read, so a step
that asks about the rows an earlier step compared reads neither again.

A bad slot is classified by where its content came from, by the first of the rules of ``rules.py`` that
claims it (poison, another live token's row, a stale write, a misplaced row, old bytes kept, drift).

Cost. Rows are compared as integer words (bitwise, so NaN payloads compare equal to themselves), a
pool at a time (its layers one after another), in large chunks; with nothing different that is the whole
diff, one read of both caches. A pool with bad rows is classified with vectors, all its layers at once,
by rules that look rows up through the hash join of ``hashjoin.py`` (each row of the subject's pool gets
a line hash, salted with its layer), so the work grows with the pool once plus the bad rows, never with
their product. Hashes only nominate candidates; every candidate is compared byte for byte, so a hash
collision costs time, never a wrong verdict. Full rows are read only for those comparisons and for the
rules that need bytes; the previous step's line hashes are kept for the previous-step rules.
Mismatches are counted per (step, pool, layer) with tensor ops; records (with their detail text) are
built only for the first ``limit``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from . import hashjoin as hj
from .deltas import DeltaCursor, DeltaPool, DeltaRows, Plan
from .rules import RULES, BadRows, Finding, Reported, Rule, classify
from ...serving.pool import NEVER_WRITTEN
from .snapshot import IN_WINDOW, POS, SHARED, SLOTS, Cursor, KVSnapshot, PoolDelta, WorkingPool


@dataclass(frozen=True, slots=True, kw_only=True)
class KVMismatch:
    step: int
    pool: str
    """the KV group ("full", "swa" in SGLang's layout), or "hidden" (a final hidden state rather than a KV slot)"""
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
    written_at: int | None = None
    """the step that last wrote the slot in the subject's run, by its pool's write log (None: nothing wrote it
    since it was poisoned, or a hidden state): which forward left what the slot holds"""


@dataclass(frozen=True, slots=True, kw_only=True)
class MismatchCount:
    """Mismatched slots in one (step, pool, layer): a cell of the report's heatmap."""

    step: int
    pool: str
    """the KV group, or "hidden\""""
    layer: int | None
    """None for hidden states"""
    count: int
    """slots (hidden-state rows for "hidden") that differed"""


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
    counts: tuple[MismatchCount, ...] = ()
    """every mismatch, ``limit`` or not, per (step, pool, layer): in step order, then by layer, hidden
    states last (the order in which ``mismatches`` first reaches each)"""
    schedule_note: str | None = None
    """where the two runs first kept the same live tokens in other slots (another free order, another stack's
    allocator), in words; None when every step compared had one schedule. Not a mismatch: each token's K/V
    was compared where its own run keeps it"""


_WHAT = ("k", "v", "kv")

SCHEDULE = "schedule"
"""the classification of the record that says where the two runs' schedules part"""


def _stacked(pool: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """[L, S, H, D] -> [L * S, H, D]: a pool's layers one after another (a view of a snapshot's tensors)."""
    return pool[0].flatten(0, 1), pool[1].flatten(0, 1)


@dataclass(frozen=True, slots=True)
class _Bad:
    """Bad rows of one pool in one step, classified; ``token`` indexes the snapshot's live tokens."""

    index: torch.Tensor
    """the layer's index among the pool's layers"""
    layer: torch.Tensor
    """the model's layer id"""
    slot: torch.Tensor
    token: torch.Tensor
    what: torch.Tensor
    code: torch.Tensor
    """index of the claiming rule"""
    arg: torch.Tensor
    logged: torch.Tensor
    """the subject's write-log entry of each row (``NEVER_WRITTEN``: unwritten since poisoned)"""
    """what the rule's claim gave the row, else -1"""


class _Differ:
    def __init__(
        self, *, layer_ids: dict[str, list[int]], exact: bool, atol: float, rtol: float, limit: int,
        rules: Sequence[Rule],
    ):
        self.layer_ids = layer_ids
        self.exact = exact
        self.atol = atol
        self.rtol = rtol
        self.limit = limit
        self.rules = tuple(rules)
        self.scratch = hj.Scratch()
        self.found: list[KVMismatch] = []
        self.total = 0
        self.cells: list[MismatchCount] = []
        self.seen: dict[str, torch.Tensor] = {}
        self.last_lines: dict[str, torch.Tensor | None] = {}
        """pool -> the subject's salted line hashes of every row at the last step compared, when streamed"""
        self.counts = torch.zeros(len(self.rules), dtype=torch.int64)
        self.hidden_classes: dict[str, int] = {}
        self.parted = False
        self.lines: dict[str, _Lines] = {}
        """large pools: the subject's salted line hashes of every row, brought up to date when a step needs them"""

    def part(self, m: KVMismatch) -> None:
        """The schedules part at ``m.step``: one mismatch, the last; nothing after it is compared."""
        self.parted = True
        self.total += 1
        self.hidden_classes[m.classification] = self.hidden_classes.get(m.classification, 0) + 1
        if len(self.found) < self.limit:
            self.found.append(m)

    def bytes_only(self, dtype: torch.dtype) -> bool:
        return self.exact or dtype == torch.uint8

    def differs(self, a: torch.Tensor, b: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """[n] bool per row of ``a``, ``b`` [S, H, D] (only ``rows``): bytes differ, or beyond tolerance.
        Every row is read in order when ``rows`` cover enough of them (``hj.streams``), else only ``rows``."""
        wa, wb = hj.words(a), hj.words(b)
        if hj.streams(rows, a.shape[0]):
            bad = hj.rows_differ(wa, wb, scratch=self.scratch)
            bad = bad if rows is None else hj.take(bad, rows)
        else:
            bad = hj.rows_differ(wa, wb, rows, rows, scratch=self.scratch)
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

    def differs_rows(self, a: torch.Tensor | DeltaRows, a_rows: torch.Tensor | Plan | None,
                     b: torch.Tensor | DeltaRows, b_rows: torch.Tensor | Plan | None, *, n: int, dtype: torch.dtype,
                     row_shape: torch.Size) -> torch.Tensor:
        """[n] bool: row ``a_rows[i]`` of the word table ``a`` differs from row ``b_rows[i]`` of ``b`` (no index:
        row i, read in place; a ``deltas.Plan``: the rows it was made for), bytes or beyond tolerance; gathered
        rows a chunk at a time."""
        out = torch.empty(n, dtype=torch.bool)
        chunk = max(1, (4 << 20) // max(1, a.shape[1] * a.element_size()))
        for i in range(0, n, chunk):
            m = min(chunk, n - i)
            x, y = (t[i : i + m] if index is None else
                    t.gather(index, i, m, self.scratch.get(name, (m, t.shape[1]), t.dtype)) if isinstance(index, Plan)
                    else hj._select(t, index[i : i + m], self.scratch.get(name, (m, t.shape[1]), t.dtype))
                    for t, index, name in ((a, a_rows, "delta_a"), (b, b_rows, "delta_b")))
            bad = hj.rows_differ(x, y, scratch=self.scratch)
            if not self.bytes_only(dtype) and bool(bad.any()):
                at = bad.nonzero().flatten()
                typed = [hj.take(t, at).view(torch.uint8).view(dtype).view(-1, *row_shape).float() for t in (x, y)]
                close = torch.isclose(*typed, atol=self.atol, rtol=self.rtol, equal_nan=True).flatten(1).all(1)
                bad[at[close]] = False
            out[i : i + m] = bad
        return out

    def compare_pool(
        self,
        pool: str,
        sub: tuple[torch.Tensor, torch.Tensor] | tuple[DeltaRows, DeltaRows],
        ref: tuple[torch.Tensor, torch.Tensor] | tuple[DeltaRows, DeltaRows],
        prev: tuple[torch.Tensor, torch.Tensor] | tuple[DeltaRows, DeltaRows] | None,
        log: torch.Tensor,
        step: int,
        tokens: torch.Tensor,
        slots: torch.Tensor,
        written: torch.Tensor,
        memo: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> _Bad | None:
        """Classify every bad live row of one pool; ``tokens`` are live indices, ``slots`` their slots here.

        The pool's layers are handled as one tensor of layers x slots rows (row ``layer * slots + slot``),
        so that every step below runs once per pool, however many layers the model has. A large pool comes
        as ``DeltaRows`` (read from the snapshots' deltas), with ``memo``: whether each of its rows differs
        from the reference's, kept up to date by the diff, or None to compare the live rows here."""
        virtual = isinstance(sub[0], DeltaRows)
        if slots.numel() == 0 or (sub[0].layers * sub[0].size if virtual else sub[0].shape[0]) == 0:
            self.last_lines[pool] = None
            return None
        n = slots.numel()
        if virtual:
            layers, size = sub[0].layers, sub[0].size
            dtype, row_shape = sub[0].typed, sub[0].row_shape
        else:
            layers, size = sub[0].shape[:2]
            sub, ref = _stacked(sub), _stacked(ref)
            prev = _stacked(prev) if prev is not None else None
            dtype, row_shape = sub[0].dtype, sub[0].shape[1:]
        rows = (torch.arange(layers)[:, None] * size + slots).flatten()
        total = layers * size
        if virtual and memo is not None:
            bad_k, bad_v = hj.take(memo[0], rows), hj.take(memo[1], rows)
        elif virtual:
            bad_k, bad_v = (self.differs_rows(a, rows, b, rows, n=rows.numel(), dtype=dtype, row_shape=row_shape)
                            for a, b in zip(sub, ref))
        else:
            bad_k = self.differs(sub[0], ref[0], rows)
            bad_v = self.differs(sub[1], ref[1], rows)
        bad = bad_k | bad_v
        if not bool(bad.any()):
            self.last_lines[pool] = None
            return None
        words = (lambda t: t) if virtual else hj.words
        mine = (words(sub[0]), words(sub[1]))
        # Line hashes of every row cost about a tenth of the comparison, so they are taken only when
        # something differs; the subject's are kept for the previous-step rules of the next step.
        if virtual and pool in self.lines:
            # a large pool's line hashes follow the slots each step changed (``_Lines``)
            before, now = self.lines[pool].at(step, sub[0])
            table = hj.Rows(mine, None, size, now)
        else:
            table = hj.Rows(mine, None, size) if hj.streams(rows, total) else None
            before, self.last_lines[pool] = self.last_lines.get(pool), table.hash if table is not None else None
        seen = self.seen.setdefault(pool, torch.zeros(size, dtype=torch.bool))
        if seen.numel() < size:
            seen = self.seen[pool] = torch.cat([seen, seen.new_zeros(size - seen.numel())])
        seen[slots[bad.view(layers, n).any(0)]] = True
        if prev is None or before is None or before.numel() != total:
            before = None
        found = BadRows(
            live=bad.nonzero().flatten(), live_rows=rows, n=n, slots=size, tokens=tokens, written=written,
            sub=mine, ref=(words(ref[0]), words(ref[1])),
            prev=(words(prev[0]), words(prev[1])) if prev is not None else None, table=table, before=before,
            last_write=log.flatten(), step=step, dtype=dtype, row_shape=row_shape, bytes_only=self.bytes_only(dtype),
            scratch=self.scratch,
        )
        code, arg = classify(found, self.rules)
        at = found.live
        what = hj.take(bad_k, at).long() + 2 * hj.take(bad_v, at).long() - 1
        position = at % n
        index = torch.div(at, n, rounding_mode="floor")
        layer = hj.take(torch.tensor(self.layer_ids[pool], dtype=torch.int64), index)
        return _Bad(index, layer, hj.take(slots, position), hj.take(tokens, position), what, code, arg,
                    found.logged(torch.arange(at.numel())).long())

    def end_step(self, step: int, snap: Cursor, ref: Cursor, pools: dict[str, _Bad], hidden: list[KVMismatch]) -> None:
        """Count the step's mismatches and keep the first ones, lowest layer first (later layers read what
        it wrote, so it is the cause), then by slot; hidden states last."""
        bad = {pool: b for pool, b in pools.items() if b is not None}
        cells = []
        for pool, b in bad.items():
            self.counts += torch.bincount(b.code, minlength=len(self.rules))
            self.total += b.code.numel()
            per_layer = torch.bincount(b.index, minlength=len(self.layer_ids[pool])).tolist()
            cells += [(layer, pool, n) for layer, n in zip(self.layer_ids[pool], per_layer) if n]
        # a layer belongs to one pool, so ordering by layer is the records' order of first appearance
        self.cells += [MismatchCount(step=step, pool=pool, layer=layer, count=n) for layer, pool, n in sorted(cells)]
        if hidden:
            self.cells.append(MismatchCount(step=step, pool="hidden", layer=None, count=len(hidden)))
        self.total += len(hidden)
        for m in hidden:
            self.hidden_classes[m.classification] = self.hidden_classes.get(m.classification, 0) + 1
        room = self.limit - len(self.found)
        if room <= 0 or not bad:
            self.found.extend(hidden[: max(room, 0)])
            return
        names = list(bad)
        fields = ("index", "layer", "slot", "token", "what", "code", "arg", "logged")
        index, layer, slot, token, what, code, arg, logged = (torch.cat([getattr(bad[p], f) for p in names])
                                                              for f in fields)
        pool_of = torch.cat([torch.full_like(bad[p].code, i) for i, p in enumerate(names)])
        # Order as a stable sort by (layer, slot) of rows listed pool by pool, layer by layer, token by token.
        key = (layer * (int(slot.max()) + 1) + slot) * (code.numel() + 1) + torch.arange(code.numel())
        first = torch.topk(key, min(room, key.numel()), largest=False).indices if room < key.numel() else torch.arange(key.numel())
        first = first[torch.argsort(key[first])]
        picked = list(zip(*(col[first].tolist() for col in (pool_of, index, layer, slot, token, what, code, arg,
                                                             logged))))
        for (p, _, l, sl, t, w, c, _, at_step), said in zip(picked, self._describe(picked, names, snap, ref)):
            tok = snap.live[t]
            self.found.append(
                KVMismatch(
                    step=step, pool=names[p], layer=l, slot=sl, rid=tok.rid, pos=tok.pos, what=_WHAT[w],
                    classification=self.rules[c].classification, detail=said.detail, holder=said.holder,
                    found_in=said.found_in, written_at=None if at_step == NEVER_WRITTEN else at_step,
                )
            )
        self.found.extend(hidden[: self.limit - len(self.found)])

    def _describe(
        self, picked: list[tuple[int, ...]], names: list[str], snap: Cursor, ref: Cursor
    ) -> list[Finding]:
        """Each picked row's finding, asked of its rule once for all the rows it claimed."""
        by_rule: dict[int, list[int]] = {}
        for i, row in enumerate(picked):
            by_rule.setdefault(row[6], []).append(i)
        said: dict[int, Finding] = {}
        for code, which in by_rule.items():
            reported = [Reported(pool=names[picked[i][0]], layer=picked[i][1], slot=picked[i][3], arg=picked[i][7])
                        for i in which]
            said.update(zip(which, self.rules[code].describe(reported, snap, ref)))
        return [said[i] for i in range(len(picked))]

    def classes(self) -> tuple[tuple[str, int], ...]:
        out = dict(self.hidden_classes)
        for code, count in enumerate(self.counts.tolist()):
            if count:
                name = self.rules[code].classification
                out[name] = out.get(name, 0) + count
        return tuple(sorted(out.items()))


def diff_runs(
    subject: tuple[KVSnapshot, ...],
    reference: tuple[KVSnapshot, ...],
    *,
    exact: bool = True,
    atol: float = 0.0,
    rtol: float = 0.0,
    limit: int = 200,
    rules: Sequence[Rule] | None = None,
) -> DiffResult:
    """Compare the steps both runs completed, group by group (the snapshots' KV groups); ``exact`` demands
    equal bytes, else per-dtype closeness. ``rules``: the classification rules in precedence order,
    ``rules.RULES`` when None."""
    groups = subject[0].groups if subject else reference[0].groups if reference else None
    layer_ids = {g.name: list(g.layer_ids) for g in groups} if groups is not None else {}
    d = _Differ(layer_ids=layer_ids, exact=exact, atol=atol, rtol=rtol, limit=limit,
                rules=RULES if rules is None else rules)
    dummy_writes = 0
    steps = 0
    note: str | None = None
    moved: _Moved | None = None
    large = bool(subject and reference) and _large(subject[0])
    memos: list[tuple[torch.Tensor, torch.Tensor]] = []
    if subject and reference:
        # the previous step's pools lag one snapshot behind the subject's own; large pools are read from the
        # deltas where they lie (``deltas.py``), small ones rebuilt whole (a handful of ops a step)
        start = DeltaCursor if large else Cursor
        sub_now, sub_before, ref_now = start(subject[0]), start(subject[0]), start(reference[0])
        # whether each row of a large pool differs from the reference's: blank pools agree everywhere
        memos = [(torch.zeros(p.size * p.k.shape[0], dtype=torch.bool), torch.zeros(p.size * p.k.shape[0],
                  dtype=torch.bool)) for p in subject[0].pools] if large else []
    for i, (sub, ref) in enumerate(zip(subject, reference)):
        order = None
        if not sub.same_schedule(ref):
            order = _same_tokens(sub, ref)
            if order is None:
                d.part(_parting(sub, ref))
                break
            if note is None:
                note = f"step {sub.step}: {_parting(sub, ref).detail.removeprefix(_PART)}"
        if i:
            sub_before.apply(subject[i - 1])
        sub_now.apply(sub)
        ref_now.apply(ref)
        prev = sub_before if i else None
        if large:
            _refresh(d, memos, sub, ref, sub_now, ref_now)
        theirs_now: Cursor | _Moved | DeltaCursor = ref_now
        if order is not None and large:
            to, at = _moves(sub, ref, order)
            theirs_now = ref_now.moved(to, at, tuple(ref.live[j] for j in order.tolist()))
        elif order is not None:
            moved = moved if moved is not None else _Moved(ref_now)
            theirs_now = moved.fill(ref_now, sub, ref, order)
        table = sub.live_table
        everyone = torch.arange(table.shape[0])
        in_window = table[:, IN_WINDOW].bool()
        shared = table[:, SHARED].bool()
        pools = {}
        for g_index, g in enumerate(sub.groups):
            # a windowed group holds the K/V of the tokens the next query reads; the rest may be evicted
            rows = in_window if g.has_window else None
            slots = table[:, SLOTS + g_index]
            owners = (_one_owner(everyone[rows], slots[rows], sub.live_written[rows], shared[rows]) if rows is not None
                      else _one_owner(everyone, slots, sub.live_written, shared))
            mine, theirs = sub_now.pools[g_index], theirs_now.pools[g_index]
            before = prev.pools[g_index] if prev else None
            memo = memos[g_index] if large and order is None else None
            pools[g.name] = d.compare_pool(g.name, _pair(mine), _pair(theirs), _pair(before) if before else None,
                                           mine.log, sub.step, *owners, memo=memo)
        dummy_writes += _dummy_changes(sub_now, prev, d.scratch)
        d.end_step(sub.step, sub_now, theirs_now, pools, _hidden_mismatches(d, sub, ref))
        steps += 1
    return DiffResult(
        mismatches=tuple(d.found),
        total=d.total,
        mismatched_slots=sum(int(s.sum()) for s in d.seen.values()),
        classes=d.classes(),
        dummy_writes=dummy_writes,
        steps_compared=steps if d.parted else min(len(subject), len(reference)),
        counts=tuple(d.cells),
        schedule_note=note,
    )


_LARGE_BYTES = 32 << 20
"""a run whose largest pool (K of all its layers) holds this much is read from its deltas (``deltas.py``):
three working copies of it would cost three times a snapshot's memory, and rebuilding them more than the diff"""


def _large(first: KVSnapshot) -> bool:
    return max((p.size * p.k.shape[0] * math.prod(p.k.shape[2:]) * p.k.element_size() for p in first.pools),
               default=0) >= _LARGE_BYTES


def _pair(pool: WorkingPool | DeltaPool) -> tuple:
    return (pool.wk, pool.wv) if isinstance(pool, DeltaPool) else (pool.k, pool.v)


def _refresh(d: _Differ, memos: list[tuple[torch.Tensor, torch.Tensor]], sub: KVSnapshot, ref: KVSnapshot,
             sub_now: DeltaCursor, ref_now: DeltaCursor) -> None:
    """Bring each large pool's memo (which rows differ from the reference's, slot for slot) to this step: only
    the slots either run changed are compared again. Where both deltas hold the same slots they are read in
    place; else, where the slots both hold make few runs at consecutive places in both, run by run in place;
    else the delta holding more slots is read in place against the other pool's rows of its slots,
    gathered. The few slots only the other run changed are gathered from both pools."""
    for g_index, (mine, theirs) in enumerate(zip(sub.pools, ref.pools)):
        s_slots, r_slots = mine.slots, theirs.slots
        now, their_now = sub_now.pools[g_index], ref_now.pools[g_index]
        layers, size = now.wk.layers, now.wk.size
        if not layers * size:
            continue
        d.lines.setdefault(sub.groups.groups[g_index].name, _Lines()).pending.append((sub.step, mine))
        if not (s_slots.numel() or r_slots.numel()):
            continue
        typed = dict(dtype=now.wk.typed, row_shape=now.wk.row_shape)
        layer = torch.arange(layers)[:, None]
        if torch.equal(s_slots, r_slots):  # both deltas read in place, streamed by differs_rows
            rows = (layer * size + s_slots).flatten()
            for memo, a, b in zip(memos[g_index], (mine.k, mine.v), (theirs.k, theirs.v)):
                memo[rows] = d.differs_rows(hj.words(a).reshape(rows.numel(), -1), None,
                                            hj.words(b).reshape(rows.numel(), -1), None, n=rows.numel(), **typed)
            continue
        both, at_s, at_r = _common(s_slots, r_slots, size)
        runs = _runs(at_s, at_r, both.numel()) if d.bytes_only(now.wk.typed) and both.numel() else None
        if runs is not None:
            # few runs of slots at consecutive places in both deltas: each run compared in place
            rows = (layer * size + both).flatten()
            for memo, a, b in zip(memos[g_index], (mine.k, mine.v), (theirs.k, theirs.v)):
                memo[rows] = _differs_in_runs(hj.words(a), hj.words(b), runs, both.numel(), d.scratch)
            lead = both
        else:
            # The side whose delta holds more slots is read in place, the other side's rows of those slots
            # gathered from its pool (mostly its own delta, in address order): one gather, where aligning
            # the two deltas on the slots both hold gathers both.
            subject_leads = s_slots.numel() >= r_slots.numel()
            lead = s_slots if subject_leads else r_slots
            rows = (layer * size + lead).flatten()
            gathered = (their_now if subject_leads else now).wk
            in_place = [hj.words(delta).reshape(rows.numel(), -1)
                        for delta in ((mine.k, mine.v) if subject_leads else (theirs.k, theirs.v))]
            # where the gathered rows lie is worked out once for K and V, a block of rows at a time (a plan
            # holds a few integers a row: for the whole pool at once, a share of its memory)
            for i in range(0, rows.numel(), _PLAN_ROWS):
                block = rows[i : i + _PLAN_ROWS]
                plan, m = gathered.plan(block), block.numel()
                for memo, here, a, b in zip(memos[g_index], in_place, (now.wk, now.wv), (their_now.wk, their_now.wv)):
                    here = here[i : i + m]
                    memo[block] = (d.differs_rows(here, None, b, plan, n=m, **typed) if subject_leads else
                                   d.differs_rows(a, plan, here, None, n=m, **typed))
        # the slots outside ``lead`` either run changed (distinct: ``lead`` holds the slots both changed)
        only = torch.cat([x[~_held(x, lead, size)] for x in (s_slots, r_slots)])
        if only.numel():
            rest = (layer * size + only).flatten()
            for memo, a, b in zip(memos[g_index], (now.wk, now.wv), (their_now.wk, their_now.wv)):
                memo[rest] = d.differs_rows(a, rest, b, rest, n=rest.numel(), **typed)


def _held(x: torch.Tensor, slots: torch.Tensor, size: int) -> torch.Tensor:
    """[len(x)] bool: each of ``x`` is among ``slots`` (of a pool of ``size``): a mask of the pool's slots,
    which costs a fraction of ``torch.isin``'s sort or a binary search per slot."""
    mask = torch.zeros(size, dtype=torch.bool)
    mask[slots] = True
    return hj.take(mask, x)


def _common(s_slots: torch.Tensor, r_slots: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor | None,
                                                                              torch.Tensor | None]:
    """The slots both ascending lists hold, and their places in each (None: every slot, in order)."""
    if not (s_slots.numel() and r_slots.numel()):
        empty = torch.empty(0, dtype=torch.int64)
        return empty, empty, empty
    place = torch.full((size,), -1, dtype=torch.int64)
    place[r_slots] = torch.arange(r_slots.numel())
    pos = hj.take(place, s_slots)
    hit = (pos >= 0).nonzero().flatten()
    both, at_s, at_r = hj.take(s_slots, hit), hit, hj.take(pos, hit)
    return (both, None if both.numel() == s_slots.numel() else at_s,
            None if both.numel() == r_slots.numel() else at_r)


_RUN_SLOTS = 64
"""slots both deltas hold are compared in place, run by run, where their runs average this many slots or more"""


_PLAN_ROWS = 1 << 16
"""rows of a pool gathered against a delta read in place are planned (``deltas.Plan``) this many at a time"""

_RUN_FLAG_BYTES = 4 << 20
"""the word flags of runs compared in place are reduced this many bytes at a time"""


def _runs(at_s: torch.Tensor | None, at_r: torch.Tensor | None, n: int) -> list[tuple[int, int, int, int]] | None:
    """(start, length, in the subject's delta, in the reference's) of the runs of slots both deltas hold at
    consecutive places in each (``at_*``: each slot's place in that delta, None: in order), when there are few
    enough of them to compare in place; None otherwise (gather instead)."""
    a = torch.arange(n) if at_s is None else at_s
    b = torch.arange(n) if at_r is None else at_r
    breaks = ((a[1:] - a[:-1] != 1) | (b[1:] - b[:-1] != 1)).nonzero().flatten() + 1
    if breaks.numel() + 1 > n // _RUN_SLOTS:
        return None
    starts = [0, *breaks.tolist()]
    ends = [*starts[1:], n]
    firsts_a, firsts_b = hj.take(a, torch.tensor(starts)).tolist(), hj.take(b, torch.tensor(starts)).tolist()
    return [(st, en - st, fa, fb) for st, en, fa, fb in zip(starts, ends, firsts_a, firsts_b)]


def _differs_in_runs(a: torch.Tensor, b: torch.Tensor, runs: list[tuple[int, int, int, int]], n: int,
                     scratch: hj.Scratch) -> torch.Tensor:
    """[layers * n] bool, layer by layer: the rows of the runs' slots differ bitwise between the delta words
    ``a`` and ``b`` [layers, slots, words], each run read in place."""
    layers, words = a.shape[0], a.shape[2]
    out = torch.empty((layers, n), dtype=torch.bool)
    # The runs tile 0..n in order, so their word flags are laid side by side in one buffer of a few MiB and
    # reduced a buffer at a time: one op per run (runs are short where a delta holds many slots the other
    # does not, and the ops' fixed costs were most of the comparison).
    width = min(n, max(1, _RUN_FLAG_BYTES // max(1, layers * words * a.element_size())))
    flags = scratch.get("run_flags", (layers, width, words), torch.bool)
    base = 0

    def reduce(end: int) -> None:
        m = end - base
        out[:, base:end] = hj.any_per_row(flags[:, :m].reshape(layers * m, words)).view(layers, m)

    for start, length, at_a, at_b in runs:
        i = 0
        while i < length:
            pos = start + i
            if pos - base == width:
                reduce(pos)
                base = pos
            m = min(length - i, base + width - pos)
            torch.ne(a[:, at_a + i : at_a + i + m], b[:, at_b + i : at_b + i + m],
                     out=flags[:, pos - base : pos - base + m])
            i += m
    reduce(n)
    return out.flatten()


class _Lines:
    """The subject's salted line hashes of every row of a large pool, kept as the deltas that change them until
    a step with bad rows asks (a step without costs nothing here): the rows of the slots each delta changed
    hashed again, from the delta, the others as they were."""

    def __init__(self) -> None:
        self.hash: torch.Tensor | None = None
        self.pending: list[tuple[int, PoolDelta]] = []

    def at(self, step: int, table: DeltaRows) -> tuple[torch.Tensor, torch.Tensor]:
        """(the hashes at the step before ``step``, the hashes at ``step``), every pending delta applied."""
        if self.hash is None:
            poison = hj.line_hash(table.poison).expand(table.layers * table.size)
            self.hash = hj.salted_blocks(poison.clone(), table.size)
        current = [(s, d) for s, d in self.pending if s == step and d.slots.numel()]
        for s, delta in self.pending:
            if s != step:
                self._apply(self.hash, delta, table)
        self.pending = []
        before = self.hash
        if current:
            self.hash = before.clone()
            self._apply(self.hash, current[0][1], table)
        return before, self.hash

    @staticmethod
    def _apply(hashes: torch.Tensor, delta: PoolDelta, table: DeltaRows) -> None:
        if not delta.slots.numel():
            return
        rows = (torch.arange(table.layers)[:, None] * table.size + delta.slots).flatten()
        hashes[rows] = hj.salted(hj.line_hash(hj.words(delta.k).reshape(rows.numel(), -1)), rows, table.size)


def _moves(sub: KVSnapshot, theirs: KVSnapshot, order: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per group, the subject's slots of the live tokens (inside the window, in a windowed group) and the
    reference's slots of the same tokens: where ``_Moved`` puts the reference's rows."""
    mine = sub.live_table
    in_window = mine[:, IN_WINDOW].bool()
    to, at = [], []
    for g_index, g in enumerate(sub.groups):
        rows = in_window if g.has_window else torch.ones_like(in_window)
        to.append(mine[rows, SLOTS + g_index])
        at.append(hj.take(theirs.live_table[:, SLOTS + g_index], order[rows]))
    return to, at


def _same_tokens(sub: KVSnapshot, ref: KVSnapshot) -> torch.Tensor | None:
    """Where the two runs hold the same live tokens at the same step, each as inside or outside the window
    and as the prefix cache's or not, and write the same tokens' K/V, only perhaps in other slots: [live] the
    index in ``ref.live`` of each of ``sub.live``. None where they hold other tokens (the schedules part)."""
    if (sub.step != ref.step or sub.groups.names != ref.groups.names or len(sub.live) != len(ref.live)
            or Counter(sub.hidden_owners) != Counter(ref.hidden_owners)):
        return None
    if sub.live_rids == ref.live_rids and torch.equal(sub.live_table[:, :SLOTS], ref.live_table[:, :SLOTS]):
        order = torch.arange(len(sub.live))
    else:
        theirs = {(t.rid, t.pos): i for i, t in enumerate(ref.live)}
        at = [theirs.get((t.rid, t.pos)) for t in sub.live]
        if None in at or len(set(at)) != len(at):
            return None
        order = torch.tensor(at, dtype=torch.int64)
        if not torch.equal(sub.live_table[:, POS:SLOTS], ref.live_table[order, POS:SLOTS]):
            return None
    return order


class _Moved:
    """The reference's pools at a step with each live token's rows moved to the slot the subject keeps it in
    (every group; a windowed one for the tokens inside the window): the reference as the subject's schedule
    would have laid it out, so the rules compare slot for slot. One working copy, made at the first step the
    schedules differ in slots and refilled at each such step."""

    def __init__(self, ref: Cursor) -> None:
        self.groups = ref.groups
        self.pools = tuple(WorkingPool(p.k.clone(), p.v.clone(), p.log.clone()) for p in ref.pools)
        self.live: tuple = ()

    def pool(self, name: str) -> WorkingPool:
        return self.pools[self.groups.index(name)]

    def fill(self, ref: Cursor, sub: KVSnapshot, theirs: KVSnapshot, order: torch.Tensor) -> _Moved:
        for into, src, to, at in zip(self.pools, ref.pools, *_moves(sub, theirs, order)):
            into.k.copy_(src.k)
            into.v.copy_(src.v)
            into.log.copy_(src.log)
            if into.k.shape[0] and to.numel():
                into.k[:, to] = src.k[:, at]
                into.v[:, to] = src.v[:, at]
                into.log[:, to] = src.log[:, at]
        self.live = tuple(theirs.live[j] for j in order.tolist())
        return self


def _one_owner(
    tokens: torch.Tensor, slots: torch.Tensor, written: torch.Tensor, shared: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``tokens``, ``slots``, ``written`` with one owner per slot the prefix cache shares: live tokens that
    matched a cached prefix read the slots its first owner wrote, so they are one owner (the first in live
    order, written when any of them was), not a conflict. Slots two tokens hold without the cache stay as
    they are: that is an accounting error, and each holder's row is compared."""
    if not bool(shared.any()):
        return tokens, slots, written
    at = shared.nonzero().flatten()
    uniq, group = torch.unique(hj.take(slots, at), return_inverse=True)
    first = torch.full((uniq.numel(),), tokens.numel(), dtype=torch.int64).scatter_reduce_(0, group, at, "amin")
    any_written = torch.zeros(uniq.numel(), dtype=torch.int64).scatter_reduce_(
        0, group, hj.take(written, at).long(), "amax")
    keep = ~shared
    keep[first] = True
    written = written.clone()
    written[first] = any_written.bool()
    return tokens[keep], slots[keep], written[keep]


_PART = "the schedules part: "


def _parting(sub: KVSnapshot, ref: KVSnapshot) -> KVMismatch:
    """Where the two runs' schedules part at a step: the first live token they disagree on, and how. A token
    is named by its slot in the stack's first group (SGLang's full pool)."""
    def record(pool: str, slot: int | None, rid: str, pos: int, detail: str) -> KVMismatch:
        return KVMismatch(step=sub.step, pool=pool, layer=None, slot=slot, rid=rid, pos=pos, what="schedule",
                          classification=SCHEDULE, detail=f"{_PART}{detail}")

    groups = sub.groups
    first_group = groups.groups[0]
    home, home_title = first_group.name, first_group.title
    if sub.step != ref.step or groups.names != ref.groups.names:
        first = (sub.live or ref.live or (None,))[0]
        rid, pos, slot = (first.rid, first.pos, first.slots[0]) if first is not None else ("-", 0, None)
        theirs_at = (f"the reference's step {ref.step}" if groups.names == ref.groups.names else
                     f"the reference's KV groups {', '.join(ref.groups.names)} "
                     f"(the subject's: {', '.join(groups.names)})")
        return record(home, slot, rid, pos, f"the subject's step {sub.step} meets {theirs_at}")
    theirs = {(t.rid, t.pos): t for t in ref.live}
    mine = {(t.rid, t.pos): t for t in sub.live}
    for t in sub.live:
        other = theirs.get((t.rid, t.pos))
        if other is None:
            return record(home, t.slots[0], t.rid, t.pos,
                          f"{t.rid}@{t.pos} is live in the subject ({home_title} slot {t.slots[0]}), "
                          "not in the reference")
        for i, g in enumerate(groups):
            if not g.has_window and other.slots[i] != t.slots[i]:
                return record(g.name, t.slots[i], t.rid, t.pos,
                              f"the subject keeps {t.rid}@{t.pos} in {g.title} slot {t.slots[i]}, the reference in "
                              f"{other.slots[i]}")
            if g.has_window and (other.slots[i], other.in_window) != (t.slots[i], t.in_window):
                def where(x, i=i, g=g):
                    return f"{g.title} slot {x.slots[i]}{'' if x.in_window else ' (out of the window)'}"
                return record(g.name, t.slots[i], t.rid, t.pos,
                              f"the subject keeps {t.rid}@{t.pos} in {where(t)}, the reference in {where(other)}")
        if other.shared != t.shared:
            return record(home, t.slots[0], t.rid, t.pos,
                          f"{t.rid}@{t.pos} is {'' if t.shared else 'not '}the prefix cache's in the subject, "
                          f"{'' if other.shared else 'not '}in the reference")
    for t in ref.live:
        if (t.rid, t.pos) not in mine:
            return record(home, t.slots[0], t.rid, t.pos,
                          f"{t.rid}@{t.pos} is live in the reference ({home_title} slot {t.slots[0]}), "
                          "not in the subject")
    first = sub.live[0]
    return record(home, first.slots[0], first.rid, first.pos, "the same live tokens in another order")


def _hidden_mismatches(d: _Differ, sub: KVSnapshot, ref: KVSnapshot) -> list[KVMismatch]:
    if sub.hidden.shape != ref.hidden.shape or not sub.hidden.numel():
        return []
    theirs = ref.hidden
    if sub.hidden_owners != ref.hidden_owners and Counter(sub.hidden_owners) == Counter(ref.hidden_owners):
        # the same tokens in another order (another schedule): each compared with its own hidden state
        row_of = {key: i for i, key in enumerate(ref.hidden_owners)}
        theirs = ref.hidden[torch.tensor([row_of[key] for key in sub.hidden_owners], dtype=torch.int64)]
    out = []
    for row in d.differs(sub.hidden[:, None, :], theirs[:, None, :]).nonzero().flatten().tolist():
        key = sub.hidden_owners[row]
        got, want = sub.hidden[row].float(), theirs[row].float()
        nan = bool(torch.isnan(got).any())
        out.append(
            KVMismatch(
                step=sub.step, pool="hidden", layer=None, slot=None, rid=key.rid, pos=key.pos, what="hidden",
                classification="drift",
                detail="NaN in hidden state" if nan else f"max |diff| {float((got - want).abs().max()):.3g}",
            )
        )
    return out


def _dummy_changes(snap: Cursor | DeltaCursor, prev: Cursor | DeltaCursor | None, scratch: hj.Scratch) -> int:
    count = 0
    for g_index, now in enumerate(snap.pools):
        if isinstance(now, DeltaPool):
            if not now.wk.layers * now.wk.size:
                continue
            rows = torch.arange(now.wk.layers) * now.wk.size
            base = (prev.pools[g_index].wk.index_select(0, rows) if prev else
                    torch.zeros((rows.numel(), now.wk.shape[1]), dtype=now.wk.dtype))
            count += int(hj.rows_differ(now.wk.index_select(0, rows), base, scratch=scratch).sum())
            continue
        if now.k.shape[0] == 0:
            continue
        before = prev.pools[g_index].k if prev else None
        base = before[:, 0] if before is not None else torch.zeros_like(now.k[:, 0])
        count += int(hj.rows_differ(hj.words(now.k[:, 0]), hj.words(base), scratch=scratch).sum())
    return count

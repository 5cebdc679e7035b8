"""A large pool read from a run's snapshot deltas where they lie, without rebuilding it in a working copy.

``snapshot.Cursor`` rebuilds each step's pools whole, three working copies for a diff: cheap for the
library's pools (kilobytes), three times a snapshot's memory for a large one (a 1 GiB cache took 3 GiB).
Here each slot of a pool instead names where its rows are at the cursor's step: the delta of the last step
that changed it and its index there (or nothing: the blank pool's poison). ``DeltaRows`` is the pool's
stacked layers as a table of words, read through that map: what the hash join and the rules read of a pool
(rows by number, a chunk at a time, and the first words of every row) it gathers from the deltas, so a
diff's memory is the map (two integers a slot) and its scratch buffers, whatever the pool's size.

The map also says which slots a step changed, in either run, so the diff compares only those rows again
(``diff.py``: the other rows' comparison is the previous step's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...serving.pool import NEVER_WRITTEN
from . import hashjoin as hj
from .snapshot import KVSnapshot, PoolDelta, blank_rows


@dataclass(frozen=True, slots=True)
class Plan:
    """Where some rows of a ``DeltaRows`` lie: the source (a delta's index, -1: poison) that holds most of
    them and each row's index in it (0 for the rows it does not hold), and per other source the positions of
    the rows it holds, ascending, and their indices there."""

    base: int
    rows: torch.Tensor
    others: list[tuple[int, torch.Tensor, torch.Tensor]]


class DeltaRows:
    """[layers * size, words] words of one part (K or V) of a pool's stacked layers (row ``layer * size +
    slot``), read from the deltas through the slot map ``src`` (index into ``parts``; -1: never written since
    the blank pool) and ``at`` (the slot's index in that delta). The slice of the hash join's tensor API that
    it reads: ``shape``, ``dtype``, ``element_size``, ``index_select(0, rows)``, ``narrow(1, ...)``, slices."""

    def __init__(self, parts: list[torch.Tensor], counts: list[int], poison: torch.Tensor, src: torch.Tensor,
                 at: torch.Tensor, layers: int, size: int, typed: torch.dtype, row_shape: torch.Size) -> None:
        self.parts = parts
        """per delta, [layers * n, words]: its rows, layer by layer"""
        self.counts = counts
        """per delta, its slots n"""
        self.poison = poison
        """[1, words] the blank pool's row"""
        self.src, self.at = src, at
        self.layers, self.size = layers, size
        self.typed = typed
        """the pool's storage dtype (these are its words)"""
        self.row_shape = row_shape
        """[Hkv, D] of a row"""
        self.shape = torch.Size((layers * size, poison.shape[1]))
        self.dtype = poison.dtype

    def element_size(self) -> int:
        return self.poison.element_size()

    def narrow(self, dim: int, start: int, length: int) -> DeltaRows:
        assert dim == 1
        return DeltaRows([p.narrow(1, start, length) for p in self.parts], self.counts,
                         self.poison.narrow(1, start, length), self.src, self.at, self.layers, self.size, self.typed,
                         self.row_shape)

    def index_select(self, dim: int, index: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows ``index`` as a tensor [len(index), words], gathered from the deltas that hold them."""
        assert dim == 0
        n = index.numel()
        out = torch.empty((n, self.shape[1]), dtype=self.dtype) if out is None else out
        return self.gather(self.plan(index), 0, n, out) if n else out

    def plan(self, index: torch.Tensor) -> Plan:
        """Where rows ``index`` lie, for ``gather``: worked out once for rows read a chunk at a time, and for
        K and V alike (one map)."""
        slot = index % self.size
        layer = torch.div(index, self.size, rounding_mode="floor")
        src = hj.take(self.src, slot)
        at = hj.take(self.at, slot)
        count = torch.tensor([0, *self.counts], dtype=torch.int64)
        row = layer * hj.take(count, src + 1) + at
        held = torch.bincount(src + 1)
        base = int(held.argmax()) - 1
        mine = src == base
        others = []
        for j in (held.nonzero().flatten() - 1).tolist():  # the sources present, without unique's sort
            if j != base:
                where = (src == j).nonzero().flatten()
                others.append((j, where, hj.take(row, where)))
        return Plan(base=base, rows=torch.where(mine, row, 0), others=others)

    def gather(self, plan: Plan, start: int, length: int, out: torch.Tensor) -> torch.Tensor:
        """Rows ``start .. start + length`` of the rows ``plan`` was made for, into ``out``.

        The source holding most of the rows is gathered straight into ``out`` for every row (the others' rows
        read a row of it, overwritten next), the few others scattered over it: one pass over the many rows
        rather than a gather and a scatter of each."""
        if plan.base < 0:
            out.copy_(self.poison.expand(length, -1))
        else:
            torch.index_select(self.parts[plan.base], 0, plan.rows[start : start + length], out=out)
        whole = start == 0 and length == plan.rows.numel()
        for j, where, row in plan.others:
            if whole:
                lo, hi = 0, where.numel()
            else:
                lo, hi = torch.searchsorted(where, torch.tensor([start, start + length])).tolist()
            if lo == hi:
                continue
            at = where[lo:hi] - start if start else where[lo:hi]
            out.index_copy_(0, at, self.poison.expand(hi - lo, -1) if j < 0 else hj.take(self.parts[j], row[lo:hi]))
        return out

    def places(self, rows: torch.Tensor) -> torch.Tensor:
        """[len(rows), 2] int64: where each row's bytes lie, (the address of its delta's tensor, its index
        there), the poison row's for a row never written. Equal places hold equal bytes in every part: a
        delta's K and V are appended together, so one index names a slot's K and V alike."""
        slot = rows % self.size
        layer = torch.div(rows, self.size, rounding_mode="floor")
        src = hj.take(self.src, slot)
        address = torch.tensor([self.poison.data_ptr()] + [p.data_ptr() for p in self.parts], dtype=torch.int64)
        count = torch.tensor([0, *self.counts], dtype=torch.int64)
        index = layer * hj.take(count, src + 1) + hj.take(self.at, slot)
        return torch.stack([hj.take(address, src + 1), torch.where(src < 0, 0, index)], 1)

    def same_place(self, other: DeltaRows, rows: torch.Tensor) -> torch.Tensor:
        """[len(rows)] bool: row ``rows[i]`` is read from the same bytes here as in ``other`` (the same
        delta's tensor at the same index, or poison in both): equal without reading them. ``other`` is a
        map of the same pool (another step of the same run: its deltas are appended in the same order)."""
        slot = rows % self.size
        src, other_src = hj.take(self.src, slot), hj.take(other.src, slot)
        same = (src == other_src) & (hj.take(self.at, slot) == hj.take(other.at, slot))
        # a source index names the same delta in both only where both hold the same tensor there (slot 0:
        # poison, equal bytes in both)
        shared = min(len(self.parts), len(other.parts))
        alike = torch.tensor([torch.equal(self.poison, other.poison)]
                             + [self.parts[j].data_ptr() == other.parts[j].data_ptr()
                                and self.parts[j].shape == other.parts[j].shape
                                and self.parts[j].stride() == other.parts[j].stride() for j in range(shared)],
                             dtype=torch.bool)
        return same & hj.take(alike, (src + 1).clamp_(max=shared))

    def __getitem__(self, key: slice | torch.Tensor | tuple) -> torch.Tensor:
        """Rows by a slice or an index tensor, gathered (then any further indices applied to them)."""
        rest = ()
        if isinstance(key, tuple):
            key, rest = key[0], key[1:]
        if isinstance(key, slice):
            key = torch.arange(self.shape[0])[key]
        rows = self.index_select(0, torch.as_tensor(key, dtype=torch.int64).flatten())
        return rows[(slice(None), *rest)] if rest else rows

    def typed_rows(self, index: torch.Tensor) -> torch.Tensor:
        """Rows ``index`` in the pool's dtype, [len(index), Hkv, D]."""
        return self.index_select(0, index).view(torch.uint8).view(self.typed).view(-1, *self.row_shape)


class _Typed:
    """``pool.k[layers, slots]`` in the pool's dtype, as the rules' ``describe`` reads a pool."""

    def __init__(self, rows: DeltaRows) -> None:
        self.rows = rows

    def __getitem__(self, key: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        layer, slot = key
        return self.rows.typed_rows(torch.as_tensor(layer) * self.rows.size + torch.as_tensor(slot))


class DeltaPool:
    """One group's pool at a cursor's step: its K and V as ``DeltaRows`` (``wk``, ``wv``), typed views of them
    (``k``, ``v``) and its write log [layers, slots], kept whole (an int per row)."""

    def __init__(self, wk: DeltaRows, wv: DeltaRows, log: torch.Tensor) -> None:
        self.wk, self.wv = wk, wv
        self.k, self.v = _Typed(wk), _Typed(wv)
        self.log = log


class _Map:
    """The slot map of one pool, and the deltas it points into (shared, never copied)."""

    def __init__(self, first: PoolDelta) -> None:
        layers, row_shape = first.k.shape[0], first.k.shape[2:]
        self.size, self.layers, self.row_shape, self.typed = first.size, layers, row_shape, first.k.dtype
        self.src = torch.full((first.size,), -1, dtype=torch.int64)
        self.at = torch.zeros(first.size, dtype=torch.int64)
        self.log = torch.full((layers, first.size), NEVER_WRITTEN, dtype=torch.int32)
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.counts: list[int] = []
        poison = hj.words(blank_rows((1, *row_shape), first.k.dtype))
        self.poison = poison

    def apply(self, delta: PoolDelta) -> None:
        n = delta.slots.numel()
        if not n:
            return
        self.src[delta.slots] = len(self.k)
        self.at[delta.slots] = torch.arange(n)
        self.log[:, delta.slots] = delta.last_write
        self.k.append(hj.words(delta.k).reshape(self.layers * n, -1))
        self.v.append(hj.words(delta.v).reshape(self.layers * n, -1))
        self.counts.append(n)

    def copy(self) -> _Map:
        out = object.__new__(_Map)
        out.__dict__.update(self.__dict__)
        out.src, out.at, out.log = self.src.clone(), self.at.clone(), self.log.clone()
        out.k, out.v, out.counts = list(self.k), list(self.v), list(self.counts)
        return out

    def pool(self) -> DeltaPool:
        def rows(parts: list[torch.Tensor]) -> DeltaRows:
            return DeltaRows(parts, self.counts, self.poison, self.src, self.at, self.layers, self.size, self.typed,
                             self.row_shape)
        return DeltaPool(rows(self.k), rows(self.v), self.log)


class DeltaCursor:
    """``snapshot.Cursor`` for large pools: every group's pool at the step of the last snapshot applied, as
    maps into the deltas (``DeltaPool``), not copies."""

    def __init__(self, first: KVSnapshot) -> None:
        self.groups = first.groups
        self._maps = [_Map(delta) for delta in first.pools]
        self.pools: tuple[DeltaPool, ...] = tuple(m.pool() for m in self._maps)
        self.live: tuple = ()
        self.step: int | None = None

    def pool(self, name: str) -> DeltaPool:
        return self.pools[self.groups.index(name)]

    def apply(self, snap: KVSnapshot) -> DeltaCursor:
        for delta, m in zip(snap.pools, self._maps):
            m.apply(delta)
        self.pools = tuple(m.pool() for m in self._maps)
        self.live = snap.live
        self.step = snap.step
        return self

    def moved(self, to: list[torch.Tensor], at: list[torch.Tensor], live: tuple) -> DeltaCursor:
        """This cursor with, in each group, the rows of slots ``at[g]`` moved to slots ``to[g]`` (the other
        slots as they are): ``diff._Moved`` for large pools, a copy of the maps only."""
        out = object.__new__(DeltaCursor)
        out.groups, out.step, out.live = self.groups, self.step, live
        out._maps = []
        for m, dst, src in zip(self._maps, to, at):
            c = m.copy()
            if dst.numel() and m.size:
                c.src[dst], c.at[dst], c.log[:, dst] = m.src[src], m.at[src], m.log[:, src]
            out._maps.append(c)
        out.pools = tuple(m.pool() for m in out._maps)
        return out


def changed_slots(snap: KVSnapshot, g_index: int) -> torch.Tensor:
    """The slots of group ``g_index`` that ``snap``'s step changed (its delta's)."""
    return snap.pools[g_index].slots

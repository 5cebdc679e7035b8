"""Per-step records of every KV group's pool, the live-token map and the step's hidden states, kept as deltas.

Classifying a bad slot needs the rows of every slot of its layer at that step (a misplaced row can sit in
a free or stale slot) and the previous step's contents of the slot, so the diff needs each step's pools
whole. Copying them whole at every step made memory grow with pool size times steps (pools of 2^18 slots
took a reference run to 11.5 GiB). A snapshot keeps instead what the step changed: the slots whose rows
(in any layer) or write-log entries differ from the previous step's, with their rows in every layer, found
by comparing the pools with a shadow copy of the previous step. ``Cursor`` rebuilds any step's pools
whole by applying the deltas in order to a blank pool (every row poison, nothing written), so a run holds
one shadow while it runs and the diff three working pools, whatever the number of steps.

Pools are the stack's KV groups (``serving/kv_groups.py``), in its order, named as it names them. The write
log (``kv_groups.GroupBuffers.log``) is the step that last wrote each slot since it was
poisoned; the rules read it to tell a slot written with poison's bits (NaN payloads survive arithmetic)
from one never written. A stack without one gets it inferred from the changes: a changed row was written
in that step, unless it changed to poison (a re-poisoned free slot).

The live map is also kept as tensors (``live_table``, ``live_written``), built once here, so that the
diff selects and checks live slots without a Python loop over tokens.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..serving.kv_groups import GroupBuffers, KVGroups, hybrid_swa_groups
from ..serving.pool import NEVER_WRITTEN, poison_
from ..serving.timeline import LiveToken, TokenKey
from . import hashjoin as hj


class ScheduledStepLike(Protocol):
    """The parts of the scheduler's ``ScheduledStep`` a snapshot records (no import of the scheduler)."""

    index: int
    forwards: tuple[tuple[TokenKey, ...], ...]

    @property
    def kind(self) -> str: ...

class KVBuffersLike(Protocol):
    """What a snapshot reads: a serving stack's ``kv_buffers()``, its groups and per group one [slots, Hkv, D]
    tensor per layer and the write log, one [slots] int32 tensor per layer, or None
    (``serving.kv_groups.KVBuffers``)."""

    @property
    def groups(self) -> KVGroups: ...
    @property
    def buffers(self) -> Sequence[GroupBuffers]: ...


# Columns of ``KVSnapshot.live_table``; the token's slot in group i is column ``SLOTS + i``.
RID, POS, IN_WINDOW, SHARED, SLOTS = range(5)


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolDelta:
    """What one step changed in one pool: the slots whose row (in some layer) or write-log entry differs from
    the previous step's (the blank pool's before the first step), with their rows in every layer."""

    size: int
    """slots of the pool"""
    slots: torch.Tensor
    """[n] int64, ascending"""
    k: torch.Tensor
    """[layers, n, Hkv, D] in the pool's storage dtype"""
    v: torch.Tensor
    last_write: torch.Tensor
    """[layers, n] int32: the step that last wrote the slot since it was poisoned, ``NEVER_WRITTEN`` for none"""

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.slots, self.k, self.v, self.last_write))


@dataclass(frozen=True, slots=True, kw_only=True)
class KVSnapshot:
    step: int
    kind: str
    """forward mode of the step's batch"""
    live: tuple[LiveToken, ...]
    groups: KVGroups
    """the stack's KV groups: ``pools`` and each token's ``slots`` are in their order"""
    pools: tuple[PoolDelta, ...]
    """what the step changed in each group's pool"""
    hidden: torch.Tensor
    """[tokens of the step, hidden] final hidden states, every forward of the step concatenated"""
    hidden_owners: tuple[TokenKey, ...]
    live_rids: tuple[str, ...] = field(init=False, repr=False, compare=False)
    """distinct request ids of ``live`` in order of first appearance"""
    live_table: torch.Tensor = field(init=False, repr=False, compare=False)
    """[live, 4 + groups] int64 per live token: index into ``live_rids``, pos, in_window, shared, then its slot
    in each group"""
    live_written: torch.Tensor = field(init=False, repr=False, compare=False)
    """[live] bool: the token is among ``hidden_owners`` (the step was to write its K/V)"""

    def __post_init__(self) -> None:
        rids: dict[str, int] = {}
        rows = [(rids.setdefault(t.rid, len(rids)), t.pos, t.in_window, t.shared, *t.slots) for t in self.live]
        written = {(key.rid, key.pos) for key in self.hidden_owners}
        object.__setattr__(self, "live_rids", tuple(rids))
        object.__setattr__(self, "live_table",
                           torch.tensor(rows, dtype=torch.int64).reshape(len(rows), SLOTS + len(self.groups)))
        object.__setattr__(
            self, "live_written", torch.tensor([(t.rid, t.pos) in written for t in self.live], dtype=torch.bool)
        )

    def pool(self, name: str) -> PoolDelta:
        return self.pools[self.groups.index(name)]

    @property
    def nbytes(self) -> int:
        """Bytes the snapshot holds in tensors."""
        return sum(p.nbytes for p in self.pools) + self.hidden.numel() * self.hidden.element_size()

    def same_schedule(self, other: KVSnapshot) -> bool:
        """Same step, groups and the same live tokens in the same slots (``live == other.live``, compared as
        tensors)."""
        return (
            self.step == other.step
            and self.groups.names == other.groups.names
            and self.live_rids == other.live_rids
            and torch.equal(self.live_table, other.live_table)
        )


# ---- taking snapshots -----------------------------------------------------------------------------------

class _Shadow:
    """One pool as the previous snapshot left it, on the buffers' device: [layers, slots, ...] K, V and log."""

    def __init__(self, k: Sequence[torch.Tensor], log: Sequence[torch.Tensor] | None) -> None:
        like = k[0]
        layers = len(k)
        self.k = blank_rows((layers, *like.shape), like.dtype, like.device)
        self.v = self.k.clone()
        self.log = torch.full((layers, like.shape[0]), NEVER_WRITTEN, dtype=torch.int32, device=like.device)
        self.inferred = log is None
        self.poison = _poison_words(like.dtype, like.shape[1:], like.device) if self.inferred else None


def blank_rows(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """A [..., Hkv, D] tensor of poison: the rows of a pool before anything wrote it."""
    out = torch.empty(shape, dtype=dtype, device=device)
    poison_(out)
    return out


def _poison_words(dtype: torch.dtype, row_shape: torch.Size, device: torch.device) -> torch.Tensor:
    """[1, w] the words of a poisoned row."""
    return hj.words(blank_rows((1, *row_shape), dtype, device))


def _rows_changed(a: torch.Tensor, b: torch.Tensor, scratch: hj.Scratch) -> torch.Tensor:
    """[slots] bool on ``a``'s device: the rows of ``a`` and ``b`` [slots, Hkv, D] differ bitwise."""
    wa, wb = hj.words(a), hj.words(b)
    if wa.device.type == "cpu":
        return hj.rows_differ(wa, wb, scratch=scratch)
    return (wa != wb).any(1)


def _all_poison(rows: torch.Tensor, poison: torch.Tensor) -> torch.Tensor:
    """[n] bool: each of ``rows`` [n, Hkv, D] is poison, bit for bit."""
    return ~(hj.words(rows) != poison).any(1)


_STACKED_BYTES = 4 << 20
"""a pool whose K (all layers) fits here is stacked and compared whole each step; a larger one layer by layer,
in chunks, without a copy of the pool"""


class SnapshotRecorder:
    """Takes a run's snapshots: each step's delta against a shadow of the previous step's pools."""

    def __init__(self) -> None:
        self._shadows: dict[str, _Shadow] = {}
        self._scratch = hj.Scratch()

    def take(self, buffers: KVBuffersLike, step: ScheduledStepLike, live: Sequence[LiveToken],
             hidden: Sequence[torch.Tensor]) -> KVSnapshot:
        """What the step changed in every group's pool, its live tokens and its hidden states (on the host)."""
        like = next(b.k[0] for b in buffers.buffers if b.k)
        return KVSnapshot(
            step=step.index,
            kind=step.kind,
            live=tuple(live),
            groups=buffers.groups,
            pools=tuple(self._delta(g.name, b.k, b.v, b.log, step.index, like)
                        for g, b in zip(buffers.groups, buffers.buffers)),
            hidden=_concat(list(hidden)),
            hidden_owners=tuple(key for forward in step.forwards for key in forward),
        )

    def _delta(self, pool: str, k: Sequence[torch.Tensor], v: Sequence[torch.Tensor],
               log: Sequence[torch.Tensor] | None, step: int, like: torch.Tensor) -> PoolDelta:
        if not k:
            empty = torch.empty((0, 0, *like.shape[1:]), dtype=like.dtype)
            return PoolDelta(size=0, slots=torch.empty(0, dtype=torch.int64), k=empty, v=empty.clone(),
                             last_write=torch.empty((0, 0), dtype=torch.int32))
        shadow = self._shadows.get(pool)
        if shadow is None:
            shadow = self._shadows[pool] = _Shadow(k, log)
        whole_k = whole_v = None
        if shadow.k.numel() * shadow.k.element_size() <= _STACKED_BYTES:
            # a small pool: every layer compared at once costs a handful of ops, where a loop over layers
            # costs a dozen per layer (on the library's pools those per-op costs were most of a snapshot)
            whole_k = torch.stack([t.detach() for t in k])
            whole_v = torch.stack([t.detach() for t in v])
            changed_all = ((hj.words(whole_k) != hj.words(shadow.k)).any(-1)
                           | (hj.words(whole_v) != hj.words(shadow.v)).any(-1))
            rows_changed = list(changed_all.unbind(0))
        else:
            rows_changed = [_rows_changed(k[i].detach(), shadow.k[i], self._scratch)
                            | _rows_changed(v[i].detach(), shadow.v[i], self._scratch) for i in range(len(k))]
        if shadow.inferred:
            now = []
            for i, changed in enumerate(rows_changed):
                entry = shadow.log[i].clone()
                at = changed.nonzero().flatten()
                if at.numel():
                    poisoned = _all_poison(k[i].detach()[at], shadow.poison) & _all_poison(v[i].detach()[at], shadow.poison)
                    entry[at] = torch.where(poisoned, NEVER_WRITTEN, step).to(torch.int32)
                now.append(entry)
        else:
            now = [entry.detach() for entry in log]
        changed = torch.stack(rows_changed).any(0)
        for i, entry in enumerate(now):
            changed |= entry != shadow.log[i]
        slots = changed.nonzero().flatten()
        if whole_k is not None and whole_v is not None:
            new_k, new_v = whole_k.index_select(1, slots), whole_v.index_select(1, slots)
        else:
            new_k = torch.stack([buf.detach().index_select(0, slots) for buf in k])
            new_v = torch.stack([buf.detach().index_select(0, slots) for buf in v])
        new_log = torch.stack([entry.index_select(0, slots) for entry in now])
        shadow.k[:, slots] = new_k
        shadow.v[:, slots] = new_v
        shadow.log[:, slots] = new_log
        return PoolDelta(size=k[0].shape[0], slots=slots.cpu(), k=new_k.cpu(), v=new_v.cpu(), last_write=new_log.cpu())


@dataclass(frozen=True, slots=True, kw_only=True)
class WholePool:
    """One group's pool whole, as tests and benchmarks build it."""

    k: torch.Tensor
    """[layers of the group, slots, Hkv, D] in the pool's storage dtype"""
    v: torch.Tensor
    log: torch.Tensor | None = None
    """[layers, slots] int32 write log, None to infer it from the changes"""


@dataclass(frozen=True, slots=True, kw_only=True)
class WholeStep:
    """One step of a run with its pools given whole, as tests and benchmarks build them."""

    step: int
    kind: str = "decode"
    live: tuple[LiveToken, ...]
    groups: KVGroups
    pools: tuple[WholePool, ...]
    """each group's pool, in the groups' order"""
    hidden: torch.Tensor
    hidden_owners: tuple[TokenKey, ...]

    def pool(self, name: str) -> WholePool:
        return self.pools[self.groups.index(name)]


def hybrid_step(*, step: int, kind: str = "decode", live: Sequence[LiveToken], layer_is_swa: Sequence[bool],
                full_k: torch.Tensor, full_v: torch.Tensor, swa_k: torch.Tensor, swa_v: torch.Tensor,
                hidden: torch.Tensor, hidden_owners: tuple[TokenKey, ...], full_log: torch.Tensor | None = None,
                swa_log: torch.Tensor | None = None) -> WholeStep:
    """A step of SGLang's layout given whole: the full pool's layers [full layers, slots, Hkv, D] and the SWA
    pool's, as the groups ``full`` and ``swa`` (tokens' ``slots`` are (full slot, SWA slot))."""
    like = full_k if full_k.shape[0] else swa_k
    groups = hybrid_swa_groups(layer_is_swa=layer_is_swa, layer_windows=(), full_size=full_k.shape[1],
                               swa_size=swa_k.shape[1], page_size=1, kv_dtype="float32",
                               num_kv_heads=like.shape[2], head_dim=like.shape[3])
    return WholeStep(step=step, kind=kind, live=tuple(live), groups=groups,
                     pools=(WholePool(k=full_k, v=full_v, log=full_log), WholePool(k=swa_k, v=swa_v, log=swa_log)),
                     hidden=hidden, hidden_owners=hidden_owners)


@dataclass(frozen=True, slots=True)
class _WholeBuffers:
    groups: KVGroups
    buffers: tuple[GroupBuffers, ...]


@dataclass(frozen=True, slots=True)
class _Step:
    index: int
    kind: str
    forwards: tuple[tuple[TokenKey, ...], ...]


def snapshots_of(steps: Sequence[WholeStep]) -> tuple[KVSnapshot, ...]:
    """The snapshots a run whose pools are ``steps`` would have taken."""
    recorder = SnapshotRecorder()
    out = []
    for w in steps:
        buffers = _WholeBuffers(w.groups, tuple(
            GroupBuffers(k=list(p.k), v=list(p.v), log=None if p.log is None else list(p.log)) for p in w.pools))
        out.append(recorder.take(buffers, _Step(w.step, w.kind, (w.hidden_owners,)), w.live, [w.hidden]))
    return tuple(out)


def _concat(parts: list[torch.Tensor]) -> torch.Tensor:
    if not parts:
        return torch.empty(0)
    out = torch.empty((sum(p.shape[0] for p in parts), *parts[0].shape[1:]), dtype=parts[0].dtype)
    row = 0
    for p in parts:
        out[row : row + p.shape[0]].copy_(p.detach())
        row += p.shape[0]
    return out


# ---- reading them back ----------------------------------------------------------------------------------

@dataclass(slots=True)
class WorkingPool:
    """One group's pool whole at a cursor's step: [layers, slots, ...] K, V and write log."""

    k: torch.Tensor
    v: torch.Tensor
    log: torch.Tensor


class Cursor:
    """Every group's pool of a run whole, at the step of the last snapshot applied: working tensors updated in
    place, so what is read from them holds until the next ``apply``."""

    def __init__(self, first: KVSnapshot) -> None:
        self.groups = first.groups
        self.pools = tuple(WorkingPool(*_blank(delta)) for delta in first.pools)
        self.live: tuple[LiveToken, ...] = ()
        self.step: int | None = None

    def pool(self, name: str) -> WorkingPool:
        return self.pools[self.groups.index(name)]

    def apply(self, snap: KVSnapshot) -> Cursor:
        """Move to the step of ``snap``, the snapshot after the last one applied (the run's first, at first)."""
        for delta, now in zip(snap.pools, self.pools):
            if delta.slots.numel():
                now.k[:, delta.slots] = delta.k
                now.v[:, delta.slots] = delta.v
                now.log[:, delta.slots] = delta.last_write
        self.live = snap.live
        self.step = snap.step
        return self


def _blank(delta: PoolDelta) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    layers, row_shape = delta.k.shape[0], delta.k.shape[2:]
    k = blank_rows((layers, delta.size, *row_shape), delta.k.dtype)
    return k, k.clone(), torch.full((layers, delta.size), NEVER_WRITTEN, dtype=torch.int32)


def replay(snapshots: Sequence[KVSnapshot]) -> Iterator[tuple[KVSnapshot, Cursor]]:
    """Each snapshot with a ``Cursor`` at its step (the same cursor, moved on at each step)."""
    if not snapshots:
        return
    cursor = Cursor(snapshots[0])
    for snap in snapshots:
        yield snap, cursor.apply(snap)

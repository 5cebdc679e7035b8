"""Slot-by-slot comparison of a subject run's KV snapshots with the reference run's, and classification.

Both runs see the same schedule and the same slot assignments (the scheduler depends on the timeline
alone), so step s of one lines up with step s of the other. Comparison is over live slots only: every
token of a running request in the full pool, and in the SWA pool the tokens its next query reads. The
dummy slot 0 is never compared, but the steps in which a run changed it are counted.

A bad slot is classified by where its content came from:

- ``unwritten``: still poison, or the token was written this step and the slot kept its old bytes;
- ``overwritten``: it holds another live token's row (named by request and position);
- ``misplaced``: the expected row is not here but sits in another slot of the same layer;
- ``drift``: none of the above, a numeric difference (its size is reported).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..serving.pool import is_poison
from ..serving.timeline import LiveToken, TokenKey
from .snapshot import KVSnapshot


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


def _rows_bytes(t: torch.Tensor) -> torch.Tensor:
    """[..., slots, H, D] -> [..., slots, bytes] raw bytes, so NaN payloads compare equal to themselves."""
    flat = t.contiguous().view(torch.uint8)
    return flat.reshape(*t.shape[:-2], -1)


def _key(row: torch.Tensor) -> bytes:
    return row.contiguous().view(torch.uint8).numpy().tobytes()


class _Differ:
    def __init__(self, *, layer_ids: dict[str, list[int]], exact: bool, atol: float, rtol: float, limit: int):
        self.layer_ids = layer_ids
        self.exact = exact
        self.atol = atol
        self.rtol = rtol
        self.limit = limit
        self.found: list[KVMismatch] = []
        self.total = 0
        self.slots: set[tuple[str, int]] = set()
        self.classes: dict[str, int] = {}
        self._step: list[KVMismatch] = []

    def add(self, m: KVMismatch) -> None:
        self.total += 1
        self.classes[m.classification] = self.classes.get(m.classification, 0) + 1
        if m.slot is not None:
            self.slots.add((m.pool, m.slot))
        self._step.append(m)

    def end_step(self) -> None:
        # Within a step the lowest layer comes first: later layers read what it wrote, so it is the cause.
        self._step.sort(key=lambda m: (m.pool == "hidden", m.layer or 0, m.slot or 0))
        self.found.extend(self._step[: self.limit - len(self.found)])
        self._step = []

    def differs(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Per-row mismatch mask over the last two dims."""
        if self.exact or a.dtype == torch.uint8:
            return (_rows_bytes(a) != _rows_bytes(b)).any(-1)
        af, bf = a.float(), b.float()
        close = torch.isclose(af, bf, atol=self.atol, rtol=self.rtol, equal_nan=True)
        return ~close.flatten(-2).all(-1)

    def compare_pool(
        self,
        pool: str,
        sub: tuple[torch.Tensor, torch.Tensor],
        ref: tuple[torch.Tensor, torch.Tensor],
        prev: tuple[torch.Tensor, torch.Tensor] | None,
        tokens: list[LiveToken],
        written_now: set[TokenKey],
        step: int,
    ) -> None:
        if not tokens or sub[0].shape[0] == 0:
            return
        slot_of = (lambda t: t.full_slot) if pool == "full" else (lambda t: t.swa_slot)
        slots = torch.tensor([slot_of(t) for t in tokens], dtype=torch.int64)
        bad_k = self.differs(sub[0][:, slots], ref[0][:, slots])
        bad_v = self.differs(sub[1][:, slots], ref[1][:, slots])
        bad = bad_k | bad_v
        if not bool(bad.any()):
            return
        owners: dict[tuple[int, bytes], TokenKey] | None = None
        for li, ti in bad.nonzero().tolist():
            if owners is None:
                owners = {
                    (l, _key(ref[0][l, s]) + _key(ref[1][l, s])): TokenKey(t.rid, t.pos)
                    for l in range(ref[0].shape[0])
                    for t, s in zip(tokens, slots.tolist())
                }
            tok = tokens[ti]
            slot = int(slots[ti])
            what = "kv" if bool(bad_k[li, ti] and bad_v[li, ti]) else ("k" if bool(bad_k[li, ti]) else "v")
            cls, detail = self._classify(li, slot, sub, ref, prev, owners, tok, written_now)
            self.add(
                KVMismatch(
                    step=step,
                    pool=pool,
                    layer=self.layer_ids[pool][li],
                    slot=slot,
                    rid=tok.rid,
                    pos=tok.pos,
                    what=what,
                    classification=cls,
                    detail=detail,
                )
            )

    def _classify(self, li, slot, sub, ref, prev, owners, tok, written_now) -> tuple[str, str]:
        got_k, got_v = sub[0][li, slot], sub[1][li, slot]
        want_k, want_v = ref[0][li, slot], ref[1][li, slot]
        if is_poison(got_k) and is_poison(got_v):
            return "unwritten", "slot still holds poison"
        holder = owners.get((li, _key(got_k) + _key(got_v)))
        if holder is not None and (holder.rid, holder.pos) != (tok.rid, tok.pos):
            return "overwritten", f"holds the K/V of {holder.rid}@{holder.pos}"
        written = TokenKey(tok.rid, tok.pos) in written_now
        changed = prev is not None and not (
            _same(prev[0][li, slot], got_k) and _same(prev[1][li, slot], got_v)
        )
        if not written and changed:
            return "overwritten", "changed in a step that did not write its owner: a padded row or a stale location"
        elsewhere = _find_row(sub[0][li], sub[1][li], want_k, want_v, exclude=slot)
        if elsewhere is not None:
            return "misplaced", f"expected row found in slot {elsewhere}"
        if written and prev is not None and not changed:
            return "unwritten", "slot kept its previous contents"
        if got_k.dtype == torch.uint8:
            return "drift", "quantized bytes differ"
        if bool(torch.isnan(got_k).any() or torch.isnan(got_v).any()):
            return "drift", "computed NaN"
        diff = torch.maximum((got_k.float() - want_k.float()).abs().max(), (got_v.float() - want_v.float()).abs().max())
        return "drift", f"max |diff| {float(diff):.3g}"


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(_rows_bytes(a), _rows_bytes(b))


def _find_row(
    k_buf: torch.Tensor, v_buf: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, exclude: int
) -> int | None:
    """A slot (other than ``exclude``) whose K and V rows equal ``k`` and ``v`` byte for byte."""
    hits = (_rows_bytes(k_buf) == _rows_bytes(k)[None]).all(-1) & (_rows_bytes(v_buf) == _rows_bytes(v)[None]).all(-1)
    hits[exclude] = False
    found = hits.nonzero()
    return int(found[0]) if found.numel() else None


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
        if (sub.step, sub.live) != (ref.step, ref.live):
            raise RuntimeError(f"step {sub.step}: subject and reference schedules differ; the scheduler is not deterministic")
        written_now = set(sub.hidden_owners)
        full_tokens = list(sub.live)
        swa_tokens = [t for t in sub.live if t.in_window]
        d.compare_pool(
            "full", (sub.full_k, sub.full_v), (ref.full_k, ref.full_v),
            (prev.full_k, prev.full_v) if prev else None, full_tokens, written_now, sub.step,
        )
        d.compare_pool(
            "swa", (sub.swa_k, sub.swa_v), (ref.swa_k, ref.swa_v),
            (prev.swa_k, prev.swa_v) if prev else None, swa_tokens, written_now, sub.step,
        )
        dummy_writes += _dummy_changes(sub, prev)
        if sub.hidden.shape == ref.hidden.shape:
            bad_rows = d.differs(sub.hidden[:, None, :], ref.hidden[:, None, :]) if sub.hidden.numel() else torch.zeros(0, dtype=torch.bool)
            for row in bad_rows.nonzero().flatten().tolist():
                key = sub.hidden_owners[row]
                got, want = sub.hidden[row].float(), ref.hidden[row].float()
                nan = bool(torch.isnan(got).any())
                d.add(
                    KVMismatch(
                        step=sub.step, pool="hidden", layer=None, slot=None, rid=key.rid, pos=key.pos, what="hidden",
                        classification="drift",
                        detail="NaN in hidden state" if nan else f"max |diff| {float((got - want).abs().max()):.3g}",
                    )
                )
        d.end_step()
        prev = sub
    return DiffResult(
        mismatches=tuple(d.found),
        total=d.total,
        mismatched_slots=len(d.slots),
        classes=tuple(sorted(d.classes.items())),
        dummy_writes=dummy_writes,
        steps_compared=steps,
    )


def _dummy_changes(snap: KVSnapshot, prev: KVSnapshot | None) -> int:
    count = 0
    for now, before in ((snap.full_k, prev.full_k if prev else None), (snap.swa_k, prev.swa_k if prev else None)):
        if now.shape[0] == 0:
            continue
        base = before[:, 0] if before is not None else torch.zeros_like(now[:, 0])
        count += int((_rows_bytes(now[:, 0:1]) != _rows_bytes(base[:, None])).any(-1).sum())
    return count

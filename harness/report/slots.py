"""Who held which pool slot at a step, and the first divergence said in one sentence.

Both are derived from a case's views alone: a KV group's pool ownership is replayed from the timeline
(``StepView.written`` gives each token its slot in each group; ``evicted`` frees the windowed groups' slots,
``finished`` and ``aborted`` every group's), and the mismatches of the step are laid over it. The groups are
the setup's (``groups_of``): SGLang's full and SWA pools for a record that lists none. A reviewer reads the
result as a slot map::

    slot 30   slot 31   slot 32                    slot 33
    c@5 ok    a@8 ok    d@9 OVERWRITTEN            free
                        (last held b@7, freed after step 5: the padded row still carried it)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..serving.eviction import window_start
from .views import CaseView, GroupView, MismatchView, SetupView, StepView

CLASS_ORDER = ("overwritten", "misplaced", "unwritten", "drift")
"""worst first: the class a slot map shows when a slot differs in several layers"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Tenure:
    """A token's stay in a slot."""

    token: str
    """``rid@pos``"""
    since: int
    """step that wrote it"""
    freed_after: int | None
    """step after which the slot was freed; None while held"""
    reason: str
    """"finished", "evicted" or "aborted" once freed, else "\""""


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotBad:
    layer: int | None
    classification: str
    observed: str
    """what the slot holds instead of its owner's K/V, in words"""
    holder: str | None
    """``rid@pos`` whose K/V it holds, when the diff named it: the observed writer"""
    found_in: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotState:
    slot: int
    status: str
    """"dummy", "free", "live" (compared), "outside_window" (held, not compared: windowed groups only) or a
    mismatch class"""
    owner: str | None
    """``rid@pos`` of the token the slot belongs to: the writer the reference run saw"""
    previous: Tenure | None
    """the slot's holder before ``owner`` (or before it became free)"""
    bad: tuple[SlotBad, ...] = ()
    """the slot's mismatches at the step, lowest layer first"""
    receives_misplaced: bool = False
    """another slot's expected row was found here"""


def token(rid: str, pos: int) -> str:
    return f"{rid}@{pos}"


_HYBRID = (("full", "full", False), ("swa", "SWA", True))
"""(name, label, windowed) of SGLang's two groups, in its order: what a setup without ``groups`` describes"""


def groups_of(setup: SetupView | None) -> tuple[GroupView, ...]:
    """The KV groups of a setup, in the stack's order (the order of ``TokenSlotsView.slots``): its own list,
    or SGLang's full and SWA pools, which its sizes, window and per-layer group names describe."""
    if setup is not None and setup.groups:
        return setup.groups
    out = []
    for name, label, windowed in _HYBRID:
        layers = tuple(i for i, g in enumerate(setup.layers) if g == name) if setup is not None else ()
        size = (setup.swa_size if windowed else setup.full_size) if setup is not None else 0
        window = (setup.window if layers and setup is not None else 0) if windowed else None
        out.append(GroupView(name=name, label=label, size=size, window=window, layers=layers))
    return tuple(out)


def group_of(setup: SetupView | None, pool: str) -> tuple[int, GroupView]:
    """The position and view of the group named ``pool``; KeyError naming the groups there are."""
    groups = groups_of(setup)
    for i, g in enumerate(groups):
        if g.name == pool:
            return i, g
    raise KeyError(f"no KV group {pool!r}; the setup has {', '.join(g.name for g in groups)}")


def pool_history(steps: Sequence[StepView], pool: str, up_to: int,
                 setup: SetupView | None = None) -> tuple[dict[int, Tenure], dict[int, Tenure]]:
    """(current, previous) tenure per slot of group ``pool`` (of ``setup``) as of step ``up_to``: its writes
    done, nothing freed after it yet (the state a snapshot of that step sees)."""
    index, group = group_of(setup, pool)
    windowed = group.window is not None
    current: dict[int, Tenure] = {}
    previous: dict[int, Tenure] = {}
    where: dict[str, int] = {}  # token -> its slot in this pool
    by_rid: dict[str, set[str]] = {}

    def free(tok: str, after: int, reason: str) -> None:
        slot = where.pop(tok, None)
        if slot is not None and slot in current and current[slot].token == tok:
            held = current.pop(slot)
            previous[slot] = Tenure(token=tok, since=held.since, freed_after=after, reason=reason)

    for st in steps:
        if st.index > up_to:
            break
        for rid in st.aborted:
            for tok in sorted(by_rid.pop(rid, set())):
                free(tok, st.index - 1, "aborted")
        for t in st.written:
            slot = t.slots[index]
            if slot <= 0:
                continue
            tok = token(t.rid, t.pos)
            if slot in current:  # a slot handed out while someone held it: keep the history honest
                previous[slot] = Tenure(token=current[slot].token, since=current[slot].since, freed_after=None,
                                        reason="reassigned")
            current[slot] = Tenure(token=tok, since=st.index, freed_after=None, reason="")
            where[tok] = slot
            by_rid.setdefault(t.rid, set()).add(tok)
        if st.index == up_to:
            break
        if windowed:
            for rid, pos in st.evicted:
                free(token(rid, pos), st.index, "evicted")
        for rid in st.finished:
            for tok in sorted(by_rid.pop(rid, set())):
                free(tok, st.index, "finished")
    return current, previous


def _in_window(steps: Sequence[StepView], up_to: int, window: int) -> set[str]:
    """Tokens whose SWA K/V the next query of their request reads, as of step ``up_to``."""
    last: dict[str, int] = {}
    for st in steps:
        if st.index > up_to:
            break
        for t in st.written:
            last[t.rid] = max(last.get(t.rid, -1), t.pos)
    out = set()
    for st in steps:
        if st.index > up_to:
            break
        for t in st.written:
            if t.pos >= window_start(last[t.rid] + 1, window):
                out.add(token(t.rid, t.pos))
    return out


def observed(m: MismatchView) -> str:
    """What a bad slot holds instead of its owner's K/V."""
    if m.holder:
        return f"the K/V of {m.holder}"
    return m.detail


def slot_map(view: CaseView, pool: str, step: int) -> list[SlotState]:
    """Every slot of ``pool`` at ``step``: owner, previous holder, and the step's mismatches laid over."""
    setup = view.setup
    assert setup is not None
    _, group = group_of(setup, pool)
    current, previous = pool_history(view.steps, pool, step, setup)
    # a windowed group holds the tokens inside the eviction window (the model's widest), as the diff compares
    window = _in_window(view.steps, step, setup.window) if group.window is not None else None
    bad: dict[int, list[MismatchView]] = {}
    receivers: set[int] = set()
    for m in view.details:
        if m.step == step and m.pool == pool and m.slot is not None:
            bad.setdefault(m.slot, []).append(m)
            if m.found_in is not None:
                receivers.add(m.found_in)
    out = []
    for slot in range(group.size):
        held = current.get(slot)
        mismatches = sorted(bad.get(slot, []), key=lambda m: (m.layer or 0))
        if slot < setup.page_size:  # the dummy page: padded rows write here, never compared
            status = "dummy"
        elif mismatches:
            status = min((m.classification for m in mismatches), key=_class_rank)
        elif held is None:
            status = "free"
        elif window is not None and held.token not in window:
            status = "outside_window"
        else:
            status = "live"
        owner = held.token if held else (mismatches[0].owner if mismatches else None)
        out.append(SlotState(
            slot=slot, status=status, owner=owner, previous=previous.get(slot),
            bad=tuple(SlotBad(layer=m.layer, classification=m.classification, observed=observed(m),
                              holder=m.holder, found_in=m.found_in) for m in mismatches),
            receives_misplaced=slot in receivers,
        ))
    return out


def _class_rank(name: str) -> int:
    return CLASS_ORDER.index(name) if name in CLASS_ORDER else len(CLASS_ORDER)


def pool_label(pool: str, setup: SetupView | None = None) -> str:
    """How prose names group ``pool`` of ``setup`` ("SWA" for SGLang's ``swa``)."""
    return next((g.label for g in groups_of(setup) if g.name == pool), pool)


def first_divergence_sentence(view: CaseView) -> str:
    """The first divergence (or the error) in one sentence, e.g. ``step 6: SWA layer 0 slot 32, which
    belongs to d@9, holds the K/V of c@11 (overwritten)``."""
    if view.skip_reason is not None:
        return f"skipped: {view.skip_reason}"
    if view.error is not None:
        at = f"step {view.error.step}: " if view.error.step is not None else "before the first step: "
        return f"{at}{view.error.type}: {view.error.message}"
    m = view.first
    if m is None:
        return f"every live slot and hidden state matched the reference over {view.steps_compared} steps"
    if m.pool == "hidden":
        return f"step {m.step}: the hidden state of {m.owner} differs from the reference ({m.detail})"
    if m.classification == "schedule":
        return f"step {m.step}: {m.detail} (schedule)"
    where = f"step {m.step}: {pool_label(m.pool, view.setup)} layer {m.layer} slot {m.slot}, which belongs to {m.owner},"
    cls = m.classification
    if cls == "overwritten" and m.holder:
        sentence = f"{where} holds the K/V of {m.holder} (overwritten)"
    elif cls == "overwritten":
        # the diff could not name the token whose K/V the slot holds; its own words, then the timeline's facts
        context = _write_context(view, m)
        sentence = f"{where} was overwritten ({m.detail}{'; ' + context if context else ''})"
    elif cls == "misplaced":
        dest = f" sits in slot {m.found_in}" if m.found_in is not None else " sits in another slot"
        sentence = f"{where} does not hold its K/V: the expected row{dest} (misplaced)"
    elif cls == "unwritten":
        sentence = f"{where} was not written: {m.detail} (unwritten)"
    else:
        sentence = f"{where} differs from the reference: {m.detail} (drift)"
    return sentence


def _write_context(view: CaseView, m: MismatchView) -> str:
    """Timeline facts around a slot changed behind its owner's back: when the owner wrote it, and whether the
    step replayed a padded graph (the usual culprit, SGLang PR 24743)."""
    if not view.steps or m.slot is None:
        return ""
    parts = []
    current, _ = pool_history(view.steps, m.pool, m.step, view.setup)
    held = current.get(m.slot)
    if held is not None and held.token == m.owner and held.since < m.step:
        parts.append(f"{m.owner} was written at step {held.since}")
    step = next((s for s in view.steps if s.index == m.step), None)
    padded = next((f for f in step.forwards if f.path == "replay" and f.bucket and f.rows < f.bucket), None) if step else None
    if padded is not None:
        unit = "tokens" if step.kind == "extend" else "real rows"
        parts.append(f"step {m.step} replayed the bucket-{padded.bucket} graph with {padded.rows} {unit}")
    return "; ".join(parts)


def pools_of(setup: SetupView) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(group, its layer ids) for the groups the model has layers in, windowed ones first (narrowest window
    first: the pools the harness exists for), then the full-attention ones, each in the stack's order."""
    used = [g for g in groups_of(setup) if g.layers]
    windowed = sorted((g for g in used if g.window is not None), key=lambda g: g.window or 0)
    return tuple((g.name, g.layers) for g in (*windowed, *(g for g in used if g.window is None)))

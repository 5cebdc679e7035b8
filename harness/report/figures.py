"""The report's pictures as geometry: the timeline, the mismatch heatmap and the slot map.

Each function returns a ``Figure`` (rectangles, lines, text, each with an optional tooltip and data
attributes); a template macro writes it as inline SVG, so pictures need no image library, stay sharp
when zoomed, carry tooltips a reviewer can hover, and every string in them is escaped by the same
autoescaping as the rest of the page.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from .slots import SlotState, Tenure
from .views import ForwardView, HeatView, StepView

KIND_COLOURS = {"extend": "#4e79a7", "decode": "#59a14f", "draft": "#b07aa1"}
KIND_SHORT = {"extend": "ext", "decode": "dec", "draft": "dft"}
KIND_TINTS = {"extend": "#dbe6f1", "decode": "#dcefd9", "draft": "#efe1ec"}
CLASS_COLOURS = {"overwritten": "#d62728", "misplaced": "#f28e2b", "unwritten": "#7b4fa0", "drift": "#e9b949"}
STATUS_COLOURS = {"dummy": "#9aa0a6", "free": "#f4f5f7", "live": "#e3f1e6", "outside_window": "#e6ecf5",
                  **CLASS_COLOURS}
PATH_COLOURS = {"replay": "#2a9d8f", "padded": "#1d6f65", "eager": "#e3e5e8", "fallback": "#f4a259"}
INK, MUTED, GRID = "#1f2328", "#59636e", "#d0d7de"


@dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    kind: str
    """"rect", "line" or "text\""""
    x: float
    y: float
    w: float = 0.0
    """width; for a line, x2 - x"""
    h: float = 0.0
    fill: str = "none"
    stroke: str | None = None
    stroke_width: float = 1.0
    dash: str | None = None
    rx: float = 0.0
    text: str = ""
    anchor: str = "middle"
    size: float = 11.0
    weight: str = "normal"
    title: str | None = None
    """tooltip (an SVG ``<title>``)"""
    data: tuple[tuple[str, str], ...] = ()
    """``data-*`` attributes, for the page's script and tests"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Figure:
    width: float
    height: float
    shapes: tuple[Shape, ...]
    label: str
    """what the picture shows, for screen readers (``aria-label``)"""
    name: str
    """``data-figure`` attribute: "timeline", "heatmap" or "slotmap\""""


def _rect(x, y, w, h, fill, **kw) -> Shape:
    return Shape(kind="rect", x=x, y=y, w=w, h=h, fill=fill, **kw)


def _text(x, y, text, **kw) -> Shape:
    kw.setdefault("fill", INK)
    return Shape(kind="text", x=x, y=y, text=text, **kw)


def _line(x1, y1, x2, y2, stroke=GRID, **kw) -> Shape:
    return Shape(kind="line", x=x1, y=y1, w=x2 - x1, h=y2 - y1, stroke=stroke, **kw)


def _fit(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "\u2026"


# ---- timeline ---------------------------------------------------------------------------------------------

_LABEL_W, _CELL_W, _ROW_H, _TOP = 132, 40, 22, 26


def forward_label(forwards: Sequence[ForwardView]) -> tuple[str, str, str]:
    """(cell text, colour, tooltip) of how a step's forwards ran in one mode."""
    if not forwards:
        return "", PATH_COLOURS["eager"], "no forward recorded"
    f = forwards[0]
    times = f"\u00d7{len(forwards)}" if len(forwards) > 1 else ""
    if f.path == "replay":
        padded = f.bucket is not None and f.rows < f.bucket
        text = (f"{f.rows}/{f.bucket}" if padded else f"R{f.bucket}") + times
        tip = (f"replayed the bucket-{f.bucket} graph with {f.rows} real rows"
               + (f" ({f.bucket - f.rows} padded)" if padded else "")
               + (f", graph {f.graph}" if f.graph else "")
               + (", captured on demand just before" if f.captured else "")
               + (f"; {len(forwards)} forwards (draft steps)" if times else ""))
        return ("C" if f.captured else "") + text, PATH_COLOURS["padded" if padded else "replay"], tip
    if f.path == "fallback":
        return "F" + times, PATH_COLOURS["fallback"], f"no bucket holds {f.rows} rows: ran eagerly"
    return "E" + times, PATH_COLOURS["eager"], "eager: this runner captures no graph for this batch kind"


def timeline_figure(
    steps: Sequence[StepView],
    lanes: Sequence[tuple[str, Sequence[StepView]]],
    marks: Mapping[int, Sequence[tuple[str, str]]],
    *,
    windowed: str = "SWA",
) -> Figure:
    """Steps left to right: kind and batch size, tokens per request, evictions (from the windowed groups,
    named ``windowed``), how each graph mode ran the step, and where runs first diverged (``marks``: step ->
    (run label, "diverge" | "error"))."""
    rids: list[str] = []
    for st in steps:
        for rid, _ in st.tokens:
            if rid not in rids:
                rids.append(rid)
    col = {st.index: i for i, st in enumerate(steps)}
    rows = ["step", "batch", *[f"req {r}" for r in rids], f"{windowed} evicted", *[label for label, _ in lanes],
            "first divergence"]
    width = _LABEL_W + _CELL_W * max(len(steps), 1) + 8
    height = _TOP + _ROW_H * (len(rows) - 1) + 6
    out: list[Shape] = []

    def y_of(row: int) -> float:
        return _TOP + _ROW_H * (row - 1)

    def x_of(index: int) -> float:
        return _LABEL_W + _CELL_W * col[index]

    for row, label in enumerate(rows):
        y = 17 if row == 0 else y_of(row) + 15
        out.append(_text(_LABEL_W - 8, y, _fit(label, 18), anchor="end", size=11, fill=MUTED,
                         weight="bold" if row == 0 else "normal", title=label))
    for row in range(1, len(rows)):
        out.append(_line(_LABEL_W, y_of(row), width - 8, y_of(row)))
    # columns first: marked steps get a faint band behind every row
    for st in steps:
        x = x_of(st.index)
        if marks.get(st.index):
            out.append(_rect(x, _TOP - 2, _CELL_W, height - _TOP, "#fdecea"))
        out.append(_text(x + _CELL_W / 2, 17, str(st.index), size=11, weight="bold", fill=MUTED))
        kind = st.kind
        out.append(_rect(x + 2, y_of(1) + 2, _CELL_W - 4, _ROW_H - 4, KIND_COLOURS.get(kind, MUTED), rx=3,
                         title=f"step {st.index}: {kind}, {st.batch_size} requests",
                         data=(("step", str(st.index)), ("kind", kind))))
        out.append(_text(x + _CELL_W / 2, y_of(1) + 15, f"{KIND_SHORT.get(kind, kind[:3])} {st.batch_size}", size=10,
                         fill="#ffffff"))
        for r, rid in enumerate(rids):
            y = y_of(2 + r)
            n = dict(st.tokens).get(rid)
            if n:
                tip = f"step {st.index}: {rid} writes {n} token{'s' if n != 1 else ''}"
                out.append(_rect(x + 2, y + 3, _CELL_W - 4, _ROW_H - 6, KIND_TINTS.get(kind, GRID), rx=2,
                                 stroke=KIND_COLOURS.get(kind, MUTED), title=tip))
                out.append(_text(x + _CELL_W / 2, y + 15, str(n), size=10))
            if rid in st.finished:
                out.append(_rect(x + _CELL_W - 4, y + 3, 3, _ROW_H - 6, INK, title=f"{rid} finished after step {st.index}"))
            if rid in st.aborted:
                out.append(_text(x + 7, y + 15, "\u2715", size=11, fill=CLASS_COLOURS["overwritten"],
                                 title=f"{rid} aborted before step {st.index}"))
        if st.evicted:
            y = y_of(2 + len(rids))
            names = ", ".join(f"{rid}@{pos}" for rid, pos in st.evicted)
            out.append(_text(x + _CELL_W / 2, y + 15, f"\u2212{len(st.evicted)}", size=10, fill=MUTED,
                             title=f"after step {st.index}, {windowed} slots freed (left the window): {names}"))
    for li, (label, lane_steps) in enumerate(lanes):
        y = y_of(3 + len(rids) + li)
        for st in lane_steps:
            if st.index not in col:
                continue
            text, fill, tip = forward_label(st.forwards)
            x = x_of(st.index)
            dark = fill in (PATH_COLOURS["replay"], PATH_COLOURS["padded"])
            out.append(_rect(x + 2, y + 3, _CELL_W - 4, _ROW_H - 6, fill, rx=2, title=f"{label}, step {st.index}: {tip}",
                             data=(("step", str(st.index)), ("path", st.forwards[0].path if st.forwards else ""))))
            out.append(_text(x + _CELL_W / 2, y + 14.5, _fit(text, 6), size=9.5, fill="#ffffff" if dark else INK))
    y = y_of(len(rows) - 1)
    for index, runs in marks.items():
        if index not in col or not runs:
            continue
        x = x_of(index)
        errors = sum(kind == "error" for _, kind in runs)
        colour = INK if errors == len(runs) else CLASS_COLOURS["overwritten"]
        tip = "\n".join(f"{label}: {'error' if kind == 'error' else 'first divergence'} at step {index}"
                        for label, kind in runs)
        out.append(Shape(kind="rect", x=x + _CELL_W / 2 - 9, y=y + 2, w=18, h=18, fill=colour, rx=9, title=tip,
                         data=(("first-divergence", str(index)),)))
        out.append(_text(x + _CELL_W / 2, y + 15, str(len(runs)), size=10, weight="bold", fill="#ffffff"))
    return Figure(width=width, height=height, shapes=tuple(out), name="timeline",
                  label=f"timeline of {len(steps)} steps and {len(rids)} requests")


# ---- heatmap ----------------------------------------------------------------------------------------------

_HEAT_LOW, _HEAT_HIGH = (254, 224, 197), (165, 15, 21)


def heat_colour(count: int, most: int) -> str:
    if count <= 0:
        return "#f4f5f7"
    t = math.log1p(count) / math.log1p(max(most, 1))
    r, g, b = (round(lo + (hi - lo) * t) for lo, hi in zip(_HEAT_LOW, _HEAT_HIGH))
    return f"#{r:02x}{g:02x}{b:02x}"


@lru_cache(maxsize=1024)  # a page has a few dozen colours and tens of thousands of cells
def _dark(colour: str) -> bool:
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return 0.299 * r + 0.587 * g + 0.114 * b < 150


def heatmap_figure(pool: str, layers: Sequence[int], steps: Sequence[int], heat: Sequence[HeatView],
                   first: tuple[int, int | None] | None, *, label: str | None = None) -> Figure:
    """Mismatched slots of one group's pool per (layer, step); ``first`` (step, layer) is outlined; ``label``:
    how prose names the group (its name by default)."""
    label = label or pool
    counts = {(h.layer, h.step): h.count for h in heat if h.pool == pool}
    most = max(counts.values(), default=0)
    cw, rh, left, top = 26, 22, 70, 24
    width = left + cw * max(len(steps), 1) + 8
    height = top + rh * len(layers) + 4
    out: list[Shape] = []
    every = 1 if len(steps) <= 40 else 5
    for i, step in enumerate(steps):
        if i % every == 0:
            out.append(_text(left + cw * i + cw / 2, 16, str(step), size=10, fill=MUTED))
    for r, layer in enumerate(layers):
        y = top + rh * r
        out.append(_text(left - 8, y + 15, f"layer {layer}", anchor="end", size=11, fill=MUTED))
        for i, step in enumerate(steps):
            n = counts.get((layer, step), 0)
            x = left + cw * i
            is_first = first == (step, layer)
            tip = (f"step {step}, {label} layer {layer}: {n} mismatched slot{'s' if n != 1 else ''}"
                   + (" (the first divergence)" if is_first else ""))
            out.append(_rect(x + 1, y + 1, cw - 2, rh - 2, heat_colour(n, most), rx=2, title=tip,
                             stroke=INK if is_first else None, stroke_width=2 if is_first else 1,
                             data=(("step", str(step)), ("layer", str(layer)), ("count", str(n)))))
            if n:
                out.append(_text(x + cw / 2, y + 15, str(n) if n < 1000 else "1k+", size=9,
                                 fill="#ffffff" if _dark(heat_colour(n, most)) else INK))
    return Figure(width=width, height=height, shapes=tuple(out), name="heatmap",
                  label=f"{label} pool: mismatched slots per layer and step")


# ---- slot map ---------------------------------------------------------------------------------------------

_STATUS_WORDS = {"dummy": "dummy slot (padded rows write here; never compared)", "free": "free",
                 "live": "live, matches the reference", "outside_window": "held, outside the window (not compared)"}


def _tenure(t: Tenure) -> str:
    if t.freed_after is None:
        return f"{t.token} (written at step {t.since})"
    return f"{t.token} (written at step {t.since}, freed after step {t.freed_after}: {t.reason})"


def slot_tooltip(pool: str, s: SlotState, *, label: str | None = None) -> str:
    lines = [f"{label or pool} slot {s.slot}: {_STATUS_WORDS.get(s.status, s.status)}"]
    if s.owner:
        lines.append(f"belongs to {s.owner}: the writer the reference run saw")
    for b in s.bad:
        where = f"layer {b.layer}" if b.layer is not None else "hidden"
        lines.append(f"{where}: {b.classification}, holds {b.observed}")
        if b.found_in is not None:
            lines.append(f"  its expected row sits in slot {b.found_in}")
    if s.receives_misplaced:
        lines.append("another slot's expected row was found here")
    if s.previous is not None:
        lines.append(f"held before by {_tenure(s.previous)}")
    return "\n".join(lines)


def slotmap_figure(pool: str, states: Sequence[SlotState], step: int, per_row: int = 16,
                   highlight: int | None = None, *, label: str | None = None) -> Figure:
    """Every slot of one group's pool at ``step``, coloured by status or mismatch class, labelled with its
    owner; ``highlight``: the slot of the first divergence, framed; ``label``: how prose names the group."""
    label = label or pool
    cw, rh, left, top = 54, 36, 4, 4
    rows = max(1, math.ceil(len(states) / per_row))
    out: list[Shape] = []
    for s in states:
        r, c = divmod(s.slot, per_row)
        x, y = left + cw * c, top + rh * r
        fill = STATUS_COLOURS.get(s.status, GRID)
        bad = s.status in CLASS_COLOURS
        first = s.slot == highlight
        tip = ("the first divergence\n" if first else "") + slot_tooltip(pool, s, label=label)
        out.append(_rect(x + 1, y + 1, cw - 2, rh - 2, fill, rx=3, title=tip,
                         stroke=INK if s.receives_misplaced or first else (None if not bad else "#7a1010"),
                         stroke_width=3 if first else 1, dash="3 2" if s.receives_misplaced else None,
                         data=(("slot", str(s.slot)), ("status", s.status), ("owner", s.owner or ""))
                         + ((("first", "1"),) if first else ())))
        ink = "#ffffff" if _dark(fill) else INK
        out.append(_text(x + 5, y + 12, str(s.slot), anchor="start", size=8.5, fill=ink if ink != INK else MUTED))
        label = "dummy" if s.status == "dummy" else (_fit(s.owner, 8) if s.owner else "")
        holder = next((b.holder for b in s.bad if b.holder), None)
        if label:
            out.append(_text(x + cw / 2, y + (23 if holder else 27), label, size=10.5,
                             weight="bold" if bad else "normal", fill=ink))
        if holder:  # the observed writer, when the diff named it
            out.append(_text(x + cw / 2, y + 32.5, _fit(f"has {holder}", 11), size=8, fill=ink))
    return Figure(width=left * 2 + cw * min(per_row, max(len(states), 1)), height=top * 2 + rh * rows,
                  shapes=tuple(out), name="slotmap", label=f"{label} pool slots at step {step}")

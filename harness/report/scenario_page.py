"""View model of a scenario's page: its designs side by side, its timeline, and one section per run that
diverged or failed (first divergence with the audit findings that bear on it, or the error with where it
was raised; heatmaps, slot maps, bad slots, input audit, reproduce lines)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .figures import Figure, heatmap_figure, slotmap_figure, timeline_figure
from .pages import (
    DESIGN_ORDER,
    MODE_ORDER,
    RunRow,
    family,
    ordered,
    run_row,
    status,
    unexpected_first,
)
from .cause import Cause, first_divergence_cause, write_cause
from .slots import groups_of, pool_label, pools_of, slot_map
from .text import FRAMES_TITLE, STOPPED_TITLE, finding_line, frame_lines
from .views import CaseView, FindingView, GraphView, StepView


@dataclass(frozen=True, slots=True, kw_only=True)
class DesignCard:
    design: str
    whys: tuple[tuple[str, str], ...]
    """(backend, why); one entry when every backend shares the why"""
    runs: tuple[RunRow, ...]
    unexpected: int


@dataclass(frozen=True, slots=True, kw_only=True)
class BadRow:
    step: int
    pool: str
    layer: int | None
    slot: int | None
    owner: str
    observed: str
    classification: str
    what: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FindingRow:
    kind: str
    graphs: tuple[str, ...]
    """the graphs that reported the same finding"""
    path: str | None
    tensor: str
    replays: int
    text: str
    anchor: str = ""
    """the row's id on the page, which the first divergence links to"""
    explains: bool = False
    """a finding of a graph the first divergent step replayed (``cause.first_divergence_cause``)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolPicture:
    pool: str
    label: str
    figure: Figure
    caption: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSection:
    row: RunRow
    why: str
    faults: tuple[str, ...]
    error: str | None
    frames: tuple[str, ...]
    """where the error was raised, ``file:line in function``, outermost first"""
    frames_title: str
    stats: tuple[tuple[str, str], ...]
    heatmaps: tuple[PoolPicture, ...]
    slotmaps: tuple[PoolPicture, ...]
    bad: tuple[BadRow, ...]
    bad_note: str | None
    """set when the table stops short of every mismatch"""
    findings: tuple[FindingRow, ...]
    cause: tuple[FindingRow, ...]
    """the findings shown beside the first divergence, each linking to its row of the input audit"""
    cause_label: str
    """which graphs' audit ``cause`` comes from: ``the graph step 1 replayed (decode/bs4)``"""
    written: str | None
    """which forward last wrote the first divergent slot, by the write log (``cause.write_cause``)"""
    graph: GraphView | None
    graph_stats: tuple[tuple[str, str], ...]
    failed_in: str | None
    """for an error before the first step: the set-up stage it failed in, the graph capture it names"""
    open: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ScenarioPage:
    name: str
    path: str
    description: str
    tags: tuple[str, ...]
    references: tuple[str, ...]
    faults: tuple[str, ...]
    family: str
    settings: tuple[tuple[str, str], ...]
    index_href: str
    designs: tuple[DesignCard, ...]
    modes: tuple[str, ...]
    timeline: Figure | None
    timeline_note: str
    sections: tuple[RunSection, ...]
    sectioned: frozenset[str]
    """names of the runs that have a section (their anchor is there, not on their table row)"""
    runs: tuple[RunRow, ...]
    unexpected: int


def run_anchors(views: Sequence[CaseView]) -> dict[str, str]:
    """Run name -> its anchor on its scenario page (``run-N``, N its place on the page: ids stay plain)."""
    out: dict[str, str] = {}
    per_scenario: Counter[tuple[str, str]] = Counter()
    for v in views:
        key = (v.scenario, v.path)
        out[v.name] = f"run-{per_scenario[key]}"
        per_scenario[key] += 1
    return out


def _scenario_settings(view: CaseView, faults: Sequence[str]) -> tuple[tuple[str, str], ...]:
    rows = [("file", view.path)]
    s = view.setup
    if s is not None:
        groups = groups_of(s)
        windowed = {g.name for g in groups if g.window is not None}
        if s.groups:  # a stack of its own groups: each layer by its group's name
            layers = " ".join(s.layers)
            pools = ", ".join(f"{g.label} {g.size} slots" + (f" (window {g.window})" if g.window is not None else "")
                              for g in groups)
        else:
            layers = " ".join("S" if k in windowed else "F" for k in s.layers)
            pools = ", ".join(f"{g.label} {g.size} slots" for g in groups)
        rows += [("model", f"{s.model}: {len(s.layers)} layers ({layers}), window {s.window}"),
                 ("pools", f"{pools}, KV {s.kv_dtype}"),
                 ("seeds", f"model {s.model_seed}, timeline {s.timeline_seed}"),
                 ("graph buckets", f"decode {list(s.decode_buckets)}, prefill {list(s.prefill_buckets)}")]
        extra = [f"chunked prefill {s.chunk_size} tokens" if s.chunk_size else "",
                 f"{s.draft_steps} draft steps" if s.draft_steps else ""]
        if any(extra):
            rows.append(("timeline", ", ".join(e for e in extra if e)))
    if faults:
        rows.append(("faults", ", ".join(faults) + " (clean reruns without them are marked \"no faults\")"))
    return tuple(rows)


def _timeline(views: Sequence[CaseView]) -> tuple[Figure | None, str]:
    with_steps = [v for v in views if v.steps]
    if not with_steps:
        return None, "this results file carries no timeline (written before timelines were recorded)"
    base = max(with_steps, key=lambda v: (len(v.steps), v.error is None))
    lanes: list[tuple[str, Sequence[StepView]]] = []
    for mode in ordered([v.mode for v in with_steps], MODE_ORDER):
        if mode == "eager":
            continue
        runs = [v for v in with_steps if v.mode == mode]
        lane = max(runs, key=lambda v: (len(v.steps), v.error is None))
        lanes.append((f"{mode} graphs", lane.steps))
    marks: dict[int, list[tuple[str, str]]] = {}
    for v in views:
        label = f"{v.design} \u00b7 {v.mode}" + (" \u00b7 no faults" if v.clean_rerun else "")
        if v.error is not None and v.error.step is not None:
            marks.setdefault(v.error.step, []).append((label, "error"))
        elif v.first is not None:
            marks.setdefault(v.first.step, []).append((label, "diverge"))
    note = ("graph lanes: R4 = replay of bucket 4, 3/4 = 3 real rows in bucket 4 (padded), C = captured on demand, "
            "E = eager (no graph for this batch kind), F = eager fallback (no bucket fits)")
    windowed = "/".join(g.label for g in groups_of(base.setup) if g.window is not None and g.layers) or "SWA"
    return timeline_figure(base.steps, lanes, marks, windowed=windowed), note


def _pictures(view: CaseView) -> tuple[tuple[PoolPicture, ...], tuple[PoolPicture, ...]]:
    if view.setup is None or view.first is None:
        return (), ()
    steps = [s.index for s in view.steps] or sorted({h.step for h in view.heat})
    first = view.first
    heatmaps, slotmaps = [], []
    for pool, layers in pools_of(view.setup):
        total = sum(h.count for h in view.heat if h.pool == pool)
        label = pool_label(pool, view.setup)
        figure = heatmap_figure(pool, layers, steps, view.heat,
                                (first.step, first.layer) if first.pool == pool else None, label=label)
        heatmaps.append(PoolPicture(pool=pool, label=f"{label} pool", figure=figure,
                                    caption=f"{total} mismatched slot-layers over the run" if total else "no mismatch"))
        if view.steps:
            states = slot_map(view, pool, first.step)
            bad = sum(1 for s in states if s.bad)
            slotmaps.append(PoolPicture(pool=pool, label=f"{label} pool at step {first.step}",
                                        figure=slotmap_figure(pool, states, first.step, label=label,
                                                              highlight=first.slot if first.pool == pool else None),
                                        caption=f"{bad} slot{'s' if bad != 1 else ''} differ at step {first.step}"))
    hidden = sum(h.count for h in view.heat if h.pool == "hidden")
    if hidden and heatmaps:
        last = heatmaps[-1]
        heatmaps[-1] = PoolPicture(pool=last.pool, label=last.label, figure=last.figure,
                                   caption=f"{last.caption}; hidden states differ in {hidden} rows")
    return tuple(heatmaps), tuple(slotmaps)


_FINDING_ORDER = {"stale": 0, "moved": 1, "unregistered": 2}


def _finding_text(f: FindingView, replays: int) -> str:
    if f.kind == "stale":
        return (f"at {replays} replay{'s' if replays != 1 else ''} the attribute held another tensor ({f.now}) while "
                f"the graph still read the one it captured ({f.captured}): nothing refreshes it")
    if f.kind == "moved":
        return (f"at {replays} replay{'s' if replays != 1 else ''} the tensor's memory or layout had changed "
                f"({f.now}) while the graph still read what it captured ({f.captured})")
    if f.kind == "unregistered":
        return "the graph reads this tensor, and no registered static buffer, weight or pool accounts for it"
    return finding_line(f)


def findings(graph: GraphView, *, anchor: str = "finding", cause: Cause | None = None) -> tuple[FindingRow, ...]:
    """The input audit's findings, one row per (kind, attribute, tensor) with the graphs that reported it;
    stale inputs first. Rows get ids ``{anchor}-finding-N``; those of ``cause``'s graphs are marked."""
    groups: dict[tuple[str, str | None, str], list[FindingView]] = {}
    for f in graph.findings:
        groups.setdefault((f.kind, f.path, f"{f.dtype}{list(f.shape)}"), []).append(f)
    explaining = set(cause.findings) if cause is not None else set()
    rows = [FindingRow(kind=kind, graphs=tuple(dict.fromkeys(f.graph for f in group)), path=path, tensor=tensor,
                       replays=sum(f.replays for f in group),
                       text=_finding_text(group[0], sum(f.replays for f in group)),
                       explains=any(f in explaining for f in group))
            for (kind, path, tensor), group in groups.items()]
    rows.sort(key=lambda r: _FINDING_ORDER.get(r.kind, 3))
    return tuple(dataclasses.replace(r, anchor=f"{anchor}-finding-{i}") for i, r in enumerate(rows))


_STARTUP_GRAPHS = {"full": "decode graphs (batch-size buckets", "piecewise": "piecewise prefill graphs (token buckets"}


def failed_capture(view: CaseView) -> str | None:
    """Where a run that failed before its first step failed: in a graph mode, the start-up capture (the
    runners capture largest bucket first). None when the run did not fail so, or failed elsewhere."""
    e, s = view.error, view.setup
    if (view.verdict != "error" or e is None or e.step is not None or s is None or view.mode not in _STARTUP_GRAPHS
            or e.type in ("Timeout", "WorkerDied") or e.message.startswith("reference run failed")):
        return None
    buckets = s.decode_buckets if view.mode == "full" else s.prefill_buckets
    order = ", ".join(str(b) for b in sorted(buckets, reverse=True))
    when = ", unless this scenario captures on demand" if view.mode == "full" else ""
    return (f"failed in set-up, before the first step: while capturing the {view.mode} runner's "
            f"{_STARTUP_GRAPHS[view.mode]} {order}, captured largest first) at start-up{when}")


def _zero(value: str) -> bool:
    return value in ("0", "0.00 s")


def _section(view: CaseView, row: RunRow) -> RunSection:
    heatmaps, slotmaps = _pictures(view)
    stats = [("mismatches", str(view.mismatches)), ("slots", str(view.mismatched_slots)),
             *[(name, str(n)) for name, n in view.classes], ("dummy-slot writes", str(view.dummy_writes)),
             ("steps compared", str(view.steps_compared)), ("duration", f"{view.duration_s:.2f} s")]
    graph_stats = []
    if view.graph is not None:
        g = view.graph
        graph_stats = [("captures", str(g.captures)), ("replays", str(g.replays)),
                       ("padded replays", str(g.padded_replays)), ("eager fallbacks", str(g.eager_fallbacks))]
    if view.verdict == "error":
        # an error run compared nothing: a row of zero tiles would read as results
        stats = [(label, value) for label, value in stats if not _zero(value)]
        graph_stats = [(label, value) for label, value in graph_stats if not _zero(value)]
    note = None
    if view.mismatches > len(view.details):
        note = (f"the first {len(view.details)} of {view.mismatches} mismatches, in step order (the diff's limit); "
                f"the heatmap counts all of them")
    error = None
    if view.error is not None:
        at = f" at step {view.error.step}" if view.error.step is not None else ""
        error = f"{view.error.type}{at}: {view.error.message}"
    cause = first_divergence_cause(view)
    rows = findings(view.graph, anchor=row.anchor, cause=cause) if view.graph else ()
    cause_label = ""
    if cause is not None:
        cause_label = (f"the graph{'s' if len(cause.graphs) > 1 else ''} step {cause.step} replayed "
                       f"({', '.join(cause.graphs)})")
    return RunSection(
        row=row, why=view.why, faults=view.faults, error=error,
        frames=tuple(frame_lines(view.error)) if view.error is not None else (),
        frames_title=STOPPED_TITLE if view.error is not None and view.error.type == "Timeout" else FRAMES_TITLE,
        stats=tuple(stats), heatmaps=heatmaps,
        slotmaps=slotmaps,
        bad=tuple(BadRow(step=m.step, pool=m.pool, layer=m.layer, slot=m.slot, owner=m.owner,
                         observed=f"the K/V of {m.holder}" if m.holder else m.detail,
                         classification=m.classification, what=m.what) for m in view.details),
        bad_note=note, findings=rows, cause=tuple(r for r in rows if r.explains), cause_label=cause_label,
        written=write_cause(view),
        graph=view.graph, graph_stats=tuple(graph_stats), failed_in=failed_capture(view),
        open=row.status == "unexpected",
    )


def scenario_page(views: Sequence[CaseView], *, index_href: str, anchors: Mapping[str, str]) -> ScenarioPage:
    """The page of one scenario (``views``: every run of it)."""
    head = views[0]
    rows = {v.name: run_row(v, f"#{anchors[v.name]}", anchors[v.name]) for v in views}
    cards = []
    for design in ordered([v.design for v in views], DESIGN_ORDER):
        mine = [v for v in views if v.design == design]
        whys = tuple(dict.fromkeys((v.backend, v.why) for v in mine))
        if len({why for _, why in whys}) == 1:
            whys = (("", whys[0][1]),)
        runs = sorted((rows[v.name] for v in mine), key=lambda r: (r.clean, MODE_ORDER.index(r.mode)
                                                                   if r.mode in MODE_ORDER else 9, r.backend))
        cards.append(DesignCard(design=design, whys=whys, runs=tuple(runs),
                                unexpected=sum(r.status == "unexpected" for r in runs)))
    shown = [v for v in views if v.verdict in ("diverge", "invariant", "error") or status(v) == "unexpected"]
    shown.sort(key=lambda v: (status(v) != "unexpected", v.verdict != "diverge"))
    sections = [_section(v, rows[v.name]) for v in shown]
    if sections and not any(s.open for s in sections):
        sections[0] = dataclasses.replace(sections[0], open=True)
    timeline, note = _timeline(views)
    faults = tuple(dict.fromkeys(f for v in views for f in v.faults))
    return ScenarioPage(
        name=head.scenario, path=head.path, description=head.description, tags=head.tags,
        references=head.references, faults=faults, family=family(head.scenario),
        settings=_scenario_settings(head, faults), index_href=index_href, designs=tuple(cards),
        modes=ordered([v.mode for v in views], MODE_ORDER), timeline=timeline, timeline_note=note,
        sections=tuple(sections), sectioned=frozenset(s.row.name for s in sections),
        runs=tuple(unexpected_first(list(rows.values()))),
        unexpected=sum(not v.ok for v in views),
    )

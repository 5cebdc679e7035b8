"""View models of the HTML pages, built from case views: the index and one page per scenario.

Everything a template shows is decided here (order, grouping, sentences, figures), so templates only lay
it out and rendering stays a pure function of these objects.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..runspec import Mode
from ..serving.designs import DESIGNS
from .figures import Figure, heatmap_figure, slotmap_figure, timeline_figure
from .slots import first_divergence_sentence, pool_label, pools_of, slot_map
from .text import finding_line
from .views import CaseView, FindingView, GraphView, StepView

VERDICTS = ("match", "diverge", "error", "skipped")
MODE_ORDER = tuple(Mode)
DESIGN_ORDER = tuple(DESIGNS)
"""the built-in designs in the README's order; a third-party design follows them"""


def family(name: str) -> str:
    """The scenario's family, its name prefix: ``swa_decode_pad_tail`` -> ``swa_decode_``."""
    parts = name.split("_")
    return "_".join(parts[:2]) + "_" if len(parts) > 2 else parts[0] + ("_" if len(parts) > 1 else "")


def _ordered(values: Sequence[str], canon: Sequence[str]) -> tuple[str, ...]:
    seen = list(dict.fromkeys(values))
    return tuple(sorted(seen, key=lambda v: (canon.index(v) if v in canon else len(canon), seen.index(v))))


def is_clean_rerun(view: CaseView) -> bool:
    return bool(view.name.endswith("-nofault]"))


def status(view: CaseView) -> str:
    """"skipped", "ok" (the expected verdict) or "unexpected\""""
    if view.skip_reason is not None:
        return "skipped"
    return "ok" if view.ok else "unexpected"


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRow:
    anchor: str
    href: str
    name: str
    scenario: str
    family: str
    design: str
    mode: str
    backend: str
    engine: str
    device: str
    clean: bool
    """the clean rerun of a fault scenario (its faults off)"""
    expected: str
    verdict: str
    status: str
    unexpected_pass: bool
    sentence: str
    reproduce_pytest: str
    reproduce_cli: str
    duration_s: float


def run_row(view: CaseView, href: str, anchor: str) -> RunRow:
    return RunRow(
        anchor=anchor, href=href, name=view.name, scenario=view.scenario, family=family(view.scenario),
        design=view.design, mode=view.mode, backend=view.backend, engine=view.engine, device=view.device,
        clean=is_clean_rerun(view), expected=view.expected, verdict=view.verdict, status=status(view),
        unexpected_pass=view.unexpected_pass, sentence=first_divergence_sentence(view),
        reproduce_pytest=view.reproduce_pytest, reproduce_cli=view.reproduce_cli, duration_s=view.duration_s,
    )


def _unexpected_first(rows: Sequence[RunRow]) -> list[RunRow]:
    return sorted(rows, key=lambda r: r.status != "unexpected")


# ---- the index ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class MatrixCell:
    design: str
    mode: str
    verdict: str
    expected: str
    status: str
    href: str
    title: str
    clean: RunRow | None
    """the clean rerun of the same cell, when the scenario injects faults"""


@dataclass(frozen=True, slots=True, kw_only=True)
class MatrixRow:
    scenario: str
    href: str
    family: str
    unexpected: int
    cells: tuple[MatrixCell | None, ...]
    """one per ``Matrix.columns`` entry; None where the scenario has no such run"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Matrix:
    backend: str
    designs: tuple[str, ...]
    modes: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]
    """(design, mode), design-major"""
    rows: tuple[MatrixRow, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ScenarioLink:
    name: str
    href: str
    family: str
    path: str
    summary: str
    """the description's first sentence"""
    runs: int
    unexpected: int
    verdicts: tuple[tuple[str, int], ...]
    seeds: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Count:
    label: str
    n: int
    key: str
    """css/data key: a verdict, "ok" or "unexpected\""""


@dataclass(frozen=True, slots=True, kw_only=True)
class IndexPage:
    title: str
    generated: str | None
    complete: bool
    settings: tuple[tuple[str, str], ...]
    counts: tuple[Count, ...]
    unexpected: tuple[RunRow, ...]
    matrices: tuple[Matrix, ...]
    runs: tuple[RunRow, ...]
    scenarios: tuple[ScenarioLink, ...]
    families: tuple[str, ...]
    designs: tuple[str, ...]
    modes: tuple[str, ...]
    backends: tuple[str, ...]
    data: dict
    """embedded in the page as JSON: the runs the filter counts"""
    compare_href: str | None
    load_errors: tuple[str, ...]


def _settings(views: Sequence[CaseView], environment: Mapping[str, str], duration_s: float | None,
              command: str | None, generated: str | None) -> tuple[tuple[str, str], ...]:
    def joined(values) -> str:
        return ", ".join(dict.fromkeys(values)) or "-"

    rows = [(key, str(value)) for key, value in environment.items()]
    rows += [("device", joined(v.device for v in views)), ("engine", joined(v.engine for v in views)),
             ("backend", joined(v.backend for v in views)),
             ("seeds", "per scenario (model seed / timeline seed), listed with the scenarios below")]
    if duration_s is not None:
        rows.append(("duration", f"{duration_s:.1f} s"))
    if command:
        rows.append(("command", command))
    if generated:
        rows.append(("generated", generated))
    return tuple(rows)


def _matrices(views: Sequence[CaseView], href_of: Mapping[str, str], page_of: Mapping[tuple[str, str], str]
              ) -> tuple[Matrix, ...]:
    out = []
    for backend in _ordered([v.backend for v in views], ()):
        mine = [v for v in views if v.backend == backend]
        designs = _ordered([v.design for v in mine], DESIGN_ORDER)
        modes = _ordered([v.mode for v in mine], MODE_ORDER)
        columns = tuple((d, m) for d in designs for m in modes)
        rows = []
        by_scenario: dict[tuple[str, str], list[CaseView]] = {}
        for v in mine:
            by_scenario.setdefault((v.scenario, v.path), []).append(v)
        for key, group in by_scenario.items():
            main = {(v.design, v.mode): v for v in group if not is_clean_rerun(v)}
            clean = {(v.design, v.mode): v for v in group if is_clean_rerun(v)}
            cells = []
            for d, m in columns:
                v = main.get((d, m))
                if v is None:
                    cells.append(None)
                    continue
                c = clean.get((d, m))
                tip = f"{v.name}\nexpected {v.expected}, observed {v.verdict}\n{first_divergence_sentence(v)}"
                cells.append(MatrixCell(design=d, mode=m, verdict=v.verdict, expected=v.expected, status=status(v),
                                        href=href_of[v.name], title=tip,
                                        clean=run_row(c, href_of[c.name], "") if c is not None else None))
            unexpected = sum(not v.ok for v in group)
            rows.append(MatrixRow(scenario=key[0], href=page_of[key], family=family(key[0]), unexpected=unexpected,
                                  cells=tuple(cells)))
        rows.sort(key=lambda r: (r.unexpected == 0, r.scenario))
        out.append(Matrix(backend=backend, designs=designs, modes=modes, columns=columns, rows=tuple(rows)))
    return tuple(out)


def _summary(description: str, limit: int = 170) -> str:
    """The description's first sentence (a period and a space end it), at most ``limit`` characters."""
    text = " ".join(description.split())
    text = re.split(r"(?<=\.)\s", text, maxsplit=1)[0]
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "\u2026"


def index_page(
    views: Sequence[CaseView],
    *,
    page_of: Mapping[tuple[str, str], str],
    anchors: Mapping[str, str],
    environment: Mapping[str, str],
    duration_s: float | None = None,
    complete: bool = True,
    command: str | None = None,
    generated: str | None = None,
    compare_href: str | None = None,
    load_errors: Sequence[str] = (),
) -> IndexPage:
    """The index: counts, unexpected runs, the verdict matrix per backend, every run, every scenario.

    ``page_of`` maps (scenario, path) to the page's href from the index; ``anchors`` a run name to its anchor
    on that page."""
    href_of = {v.name: f"{page_of[(v.scenario, v.path)]}#{anchors[v.name]}" for v in views}
    rows = [run_row(v, href_of[v.name], anchors[v.name]) for v in views]
    verdicts = Counter(v.verdict for v in views)
    unexpected = [r for r in rows if r.status == "unexpected"]
    counts = [Count(label="runs", n=len(views), key="runs"),
              Count(label="as expected", n=sum(r.status == "ok" for r in rows), key="ok"),
              Count(label="unexpected", n=len(unexpected), key="unexpected"),
              *[Count(label=v, n=verdicts.get(v, 0), key=v) for v in VERDICTS]]
    scenarios = []
    groups: dict[tuple[str, str], list[CaseView]] = {}
    for v in views:
        groups.setdefault((v.scenario, v.path), []).append(v)
    for (name, path), group in groups.items():
        setup = group[0].setup
        first_sentence = _summary(group[0].description)
        scenarios.append(ScenarioLink(
            name=name, href=page_of[(name, path)], family=family(name), path=path, summary=first_sentence,
            runs=len(group), unexpected=sum(not v.ok for v in group),
            verdicts=tuple((k, n) for k, n in Counter(v.verdict for v in group).most_common()),
            seeds=f"{setup.model_seed} / {setup.timeline_seed}" if setup else "-",
        ))
    scenarios.sort(key=lambda s: (s.unexpected == 0, s.name))
    data = {"runs": [{"name": r.name, "family": r.family, "design": r.design, "mode": r.mode, "backend": r.backend,
                      "verdict": r.verdict, "expected": r.expected, "status": r.status} for r in rows]}
    return IndexPage(
        title="KV-cache report", generated=generated, complete=complete,
        settings=_settings(views, environment, duration_s, command, generated), counts=tuple(counts),
        unexpected=tuple(unexpected), matrices=_matrices(views, href_of, page_of), runs=tuple(_unexpected_first(rows)),
        scenarios=tuple(scenarios), families=tuple(sorted({family(v.scenario) for v in views})),
        designs=_ordered([v.design for v in views], DESIGN_ORDER), modes=_ordered([v.mode for v in views], MODE_ORDER),
        backends=_ordered([v.backend for v in views], ()), data=data, compare_href=compare_href,
        load_errors=tuple(load_errors),
    )


# ---- a scenario page ------------------------------------------------------------------------------------


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
    stats: tuple[tuple[str, str], ...]
    heatmaps: tuple[PoolPicture, ...]
    slotmaps: tuple[PoolPicture, ...]
    bad: tuple[BadRow, ...]
    bad_note: str | None
    """set when the table stops short of every mismatch"""
    findings: tuple[FindingRow, ...]
    graph: GraphView | None
    open: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ScenarioPage:
    name: str
    path: str
    description: str
    tags: tuple[str, ...]
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
        layers = " ".join("S" if k == "swa" else "F" for k in s.layers)
        rows += [("model", f"{s.model}: {len(s.layers)} layers ({layers}), window {s.window}"),
                 ("pools", f"full {s.full_size} slots, SWA {s.swa_size} slots, KV {s.kv_dtype}"),
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
    for mode in _ordered([v.mode for v in with_steps], MODE_ORDER):
        if mode == "eager":
            continue
        runs = [v for v in with_steps if v.mode == mode]
        lane = max(runs, key=lambda v: (len(v.steps), v.error is None))
        lanes.append((f"{mode} graphs", lane.steps))
    marks: dict[int, list[tuple[str, str]]] = {}
    for v in views:
        label = f"{v.design} \u00b7 {v.mode}" + (" \u00b7 no faults" if is_clean_rerun(v) else "")
        if v.error is not None and v.error.step is not None:
            marks.setdefault(v.error.step, []).append((label, "error"))
        elif v.first is not None:
            marks.setdefault(v.first.step, []).append((label, "diverge"))
    note = ("graph lanes: R4 = replay of bucket 4, 3/4 = 3 real rows in bucket 4 (padded), C = captured on demand, "
            "E = eager (no graph for this batch kind), F = eager fallback (no bucket fits)")
    return timeline_figure(base.steps, lanes, marks), note


def _pictures(view: CaseView) -> tuple[tuple[PoolPicture, ...], tuple[PoolPicture, ...]]:
    if view.setup is None or view.first is None:
        return (), ()
    steps = [s.index for s in view.steps] or sorted({h.step for h in view.heat})
    first = view.first
    heatmaps, slotmaps = [], []
    for pool, layers in pools_of(view.setup):
        total = sum(h.count for h in view.heat if h.pool == pool)
        figure = heatmap_figure(pool, layers, steps, view.heat,
                                (first.step, first.layer) if first.pool == pool else None)
        heatmaps.append(PoolPicture(pool=pool, label=f"{pool_label(pool)} pool", figure=figure,
                                    caption=f"{total} mismatched slot-layers over the run" if total else "no mismatch"))
        if view.steps:
            states = slot_map(view, pool, first.step)
            bad = sum(1 for s in states if s.bad)
            slotmaps.append(PoolPicture(pool=pool, label=f"{pool_label(pool)} pool at step {first.step}",
                                        figure=slotmap_figure(pool, states, first.step,
                                                              highlight=first.slot if first.pool == pool else None),
                                        caption=f"{bad} slot{'s' if bad != 1 else ''} differ at step {first.step}"))
    hidden = sum(h.count for h in view.heat if h.pool == "hidden")
    if hidden and heatmaps:
        last = heatmaps[-1]
        heatmaps[-1] = PoolPicture(pool=last.pool, label=last.label, figure=last.figure,
                                   caption=f"{last.caption}; hidden states differ in {hidden} rows")
    return tuple(heatmaps), tuple(slotmaps)


_FINDING_ORDER = {"stale": 0, "unregistered": 1, "rebound": 2}


def _finding_text(f: FindingView, replays: int) -> str:
    if f.kind == "stale":
        return (f"at {replays} replay{'s' if replays != 1 else ''} the attribute held another tensor ({f.now}) while "
                f"the graph still read the one it captured ({f.captured}): nothing refreshes it")
    if f.kind == "rebound":
        return (f"rebound at {replays} replay{'s' if replays != 1 else ''}; the graph reads the registered buffer "
                f"captured from it, correct only while that buffer is refreshed in place")
    if f.kind == "unregistered":
        return "the graph reads this tensor, and no registered static buffer, weight or pool accounts for it"
    return finding_line(f)


def findings(graph: GraphView) -> tuple[FindingRow, ...]:
    """The input audit's findings, one row per (kind, attribute, tensor) with the graphs that reported it;
    stale inputs first."""
    groups: dict[tuple[str, str | None, str], list[FindingView]] = {}
    for f in graph.findings:
        groups.setdefault((f.kind, f.path, f"{f.dtype}{list(f.shape)}"), []).append(f)
    rows = [FindingRow(kind=kind, graphs=tuple(dict.fromkeys(f.graph for f in group)), path=path, tensor=tensor,
                       replays=sum(f.replays for f in group),
                       text=_finding_text(group[0], sum(f.replays for f in group)))
            for (kind, path, tensor), group in groups.items()]
    return tuple(sorted(rows, key=lambda r: _FINDING_ORDER.get(r.kind, 3)))


def _section(view: CaseView, row: RunRow) -> RunSection:
    heatmaps, slotmaps = _pictures(view)
    stats = [("mismatches", str(view.mismatches)), ("slots", str(view.mismatched_slots)),
             *[(name, str(n)) for name, n in view.classes], ("dummy-slot writes", str(view.dummy_writes)),
             ("steps compared", str(view.steps_compared)), ("duration", f"{view.duration_s:.2f} s")]
    note = None
    if view.mismatches > len(view.details):
        note = (f"the first {len(view.details)} of {view.mismatches} mismatches, in step order (the diff's limit); "
                f"the heatmap counts all of them")
    error = None
    if view.error is not None:
        at = f" at step {view.error.step}" if view.error.step is not None else ""
        error = f"{view.error.type}{at}: {view.error.message}"
    return RunSection(
        row=row, why=view.why, faults=view.faults, error=error, stats=tuple(stats), heatmaps=heatmaps,
        slotmaps=slotmaps,
        bad=tuple(BadRow(step=m.step, pool=m.pool, layer=m.layer, slot=m.slot, owner=m.owner,
                         observed=f"the K/V of {m.holder}" if m.holder else m.detail,
                         classification=m.classification, what=m.what) for m in view.details),
        bad_note=note, findings=findings(view.graph) if view.graph else (), graph=view.graph, open=row.status == "unexpected",
    )


def scenario_page(views: Sequence[CaseView], *, index_href: str, anchors: Mapping[str, str]) -> ScenarioPage:
    """The page of one scenario (``views``: every run of it)."""
    head = views[0]
    rows = {v.name: run_row(v, f"#{anchors[v.name]}", anchors[v.name]) for v in views}
    cards = []
    for design in _ordered([v.design for v in views], DESIGN_ORDER):
        mine = [v for v in views if v.design == design]
        whys = tuple(dict.fromkeys((v.backend, v.why) for v in mine))
        if len({why for _, why in whys}) == 1:
            whys = (("", whys[0][1]),)
        runs = sorted((rows[v.name] for v in mine), key=lambda r: (r.clean, MODE_ORDER.index(r.mode)
                                                                   if r.mode in MODE_ORDER else 9, r.backend))
        cards.append(DesignCard(design=design, whys=whys, runs=tuple(runs),
                                unexpected=sum(r.status == "unexpected" for r in runs)))
    shown = [v for v in views if v.verdict in ("diverge", "error") or status(v) == "unexpected"]
    shown.sort(key=lambda v: (status(v) != "unexpected", v.verdict != "diverge"))
    sections = [_section(v, rows[v.name]) for v in shown]
    if sections and not any(s.open for s in sections):
        sections[0] = dataclasses.replace(sections[0], open=True)
    timeline, note = _timeline(views)
    faults = tuple(dict.fromkeys(f for v in views for f in v.faults))
    return ScenarioPage(
        name=head.scenario, path=head.path, description=head.description, tags=head.tags,
        faults=faults, family=family(head.scenario),
        settings=_scenario_settings(head, faults), index_href=index_href, designs=tuple(cards),
        modes=_ordered([v.mode for v in views], MODE_ORDER), timeline=timeline, timeline_note=note,
        sections=tuple(sections), sectioned=frozenset(s.row.name for s in sections),
        runs=tuple(_unexpected_first(list(rows.values()))),
        unexpected=sum(not v.ok for v in views),
    )

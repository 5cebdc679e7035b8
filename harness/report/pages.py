"""View models of the HTML pages, built from case views: what every page shares (a run's row, its family
and status) and the index; a scenario's page is in ``scenario_page``.

Everything a template shows is decided in these models (order, grouping, sentences, figures), so templates
only lay it out and rendering stays a pure function of them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from ..runspec import Mode
from .slots import first_divergence_sentence
from .views import CaseView

VERDICTS = ("match", "diverge", "invariant", "error", "skipped")
MODE_ORDER = tuple(Mode)
DESIGN_ORDER: tuple[str, ...] = ()
"""none: designs keep the order the matrix planned them in (the scenario's, by default the registry's)"""
"""the built-in designs in docs/scenarios.md's order; a third-party design follows them"""


def family(name: str) -> str:
    """The scenario's family, its name prefix: ``swa_decode_pad_tail`` -> ``swa_decode_``."""
    parts = name.split("_")
    return "_".join(parts[:2]) + "_" if len(parts) > 2 else parts[0] + ("_" if len(parts) > 1 else "")


def ordered(values: Sequence[str], canon: Sequence[str]) -> tuple[str, ...]:
    """The distinct ``values``, those named in ``canon`` first in its order, the others as they came."""
    seen = list(dict.fromkeys(values))
    return tuple(sorted(seen, key=lambda v: (canon.index(v) if v in canon else len(canon), seen.index(v))))


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
        clean=view.clean_rerun, expected=view.expected, verdict=view.verdict, status=status(view),
        unexpected_pass=view.unexpected_pass, sentence=first_divergence_sentence(view),
        reproduce_pytest=view.reproduce_pytest, reproduce_cli=view.reproduce_cli, duration_s=view.duration_s,
    )


def unexpected_first(rows: Sequence[RunRow]) -> list[RunRow]:
    """``rows`` with the unexpected ones first, each group in its order."""
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
class UnexpectedGroup:
    """The unexpected runs of one design and mode (and backend): one line of the index's banner."""

    design: str
    mode: str
    backend: str
    runs: int
    outcomes: tuple[tuple[str, str, int], ...]
    """(expected, observed, runs), most runs first"""
    example: RunRow
    """the group's first run, linked with its first divergence"""
    filter_href: str
    """the index filtered to the group's unexpected runs"""
    cause: str | None = None
    """what its runs share (``cause_signature``), across designs and modes; None: one design and mode's
    unexpected matches"""


BANNER_GROUPS = 8
"""groups the banner shows; the rest are counted and the runs table lists them all (42 unexpected runs once
took 2,300 px above the counts and the matrix)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class IndexPage:
    title: str
    generated: str | None
    complete: bool
    settings: tuple[tuple[str, str], ...]
    counts: tuple[Count, ...]
    unexpected: tuple[RunRow, ...]
    unexpected_groups: tuple[UnexpectedGroup, ...]
    """the first ``BANNER_GROUPS`` groups of unexpected runs, largest first"""
    unexpected_hidden: int
    """unexpected runs in the groups the banner leaves out"""
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
    scenario_expectations_failed: bool = True
    """some unexpected run is of a design its scenario lists: only those say to update the scenario file"""


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
    for backend in ordered([v.backend for v in views], ()):
        mine = [v for v in views if v.backend == backend]
        designs = ordered([v.design for v in mine], DESIGN_ORDER)
        modes = ordered([v.mode for v in mine], MODE_ORDER)
        columns = tuple((d, m) for d in designs for m in modes)
        rows = []
        by_scenario: dict[tuple[str, str], list[CaseView]] = {}
        for v in mine:
            by_scenario.setdefault((v.scenario, v.path), []).append(v)
        for key, group in by_scenario.items():
            main = {(v.design, v.mode): v for v in group if not v.clean_rerun}
            clean = {(v.design, v.mode): v for v in group if v.clean_rerun}
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


def cause_signature(view: CaseView) -> str | None:
    """What an unexpected run's first divergence or error says, numbers left out: runs that one cause broke (a
    broken eviction policy under every design) share it, so the banner gives them one line and a design's own
    bug keeps a line of its own. None for an unexpected match, which has no divergence to tell apart."""
    if view.verdict == "match":
        return None
    if view.error is not None:
        first = view.error.message.splitlines()[0] if view.error.message else ""
        return f"{view.verdict}: {view.error.type}: {re.sub(r'[0-9]+', '#', first)}"
    if view.first is not None:
        return f"{view.verdict}: first {view.first.classification} in the {view.first.pool} pool"
    return view.verdict


def _unexpected_groups(unexpected: Sequence[RunRow], *, by_backend: bool,
                       causes: Mapping[str, str | None] | None = None) -> list[UnexpectedGroup]:
    """One group per cause (``causes``: a run's name -> its ``cause_signature``); unexpected matches, which have
    none, one group per design and mode."""
    causes = causes or {}
    by_key: dict[tuple[str, ...], list[RunRow]] = {}
    for r in unexpected:
        backend = r.backend if by_backend else ""
        cause = causes.get(r.name)
        by_key.setdefault((backend, "cause", cause) if cause is not None else (backend, r.design, r.mode), []).append(r)
    out = []
    for key, rows in by_key.items():
        backend, cause = key[0], key[2] if key[1] == "cause" else None
        design = ", ".join(dict.fromkeys(r.design for r in rows))
        mode = ", ".join(dict.fromkeys(r.mode for r in rows))
        outcomes = Counter((r.expected, r.verdict) for r in rows)
        one = "," not in design and "," not in mode
        query = [*([("design", design), ("mode", mode)] if one else []), *([("backend", backend)] if backend else []),
                 ("verdict", "unexpected")]
        out.append(UnexpectedGroup(
            design=design, mode=mode, backend=backend, runs=len(rows),
            outcomes=tuple((e, o, n) for (e, o), n in outcomes.most_common()), example=rows[0],
            filter_href="#" + "&".join(f"{k}={quote(v, safe='')}" for k, v in query), cause=cause))
    return sorted(out, key=lambda g: -g.runs)  # stable: equal groups keep the runs' order


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
    groups_of = _unexpected_groups(unexpected, by_backend=len({v.backend for v in views}) > 1,
                                   causes={v.name: cause_signature(v) for v in views if not v.ok})
    data = {"runs": [{"name": r.name, "family": r.family, "design": r.design, "mode": r.mode, "backend": r.backend,
                      "verdict": r.verdict, "expected": r.expected, "status": r.status} for r in rows]}
    return IndexPage(
        title="KV-cache report", generated=generated, complete=complete,
        settings=_settings(views, environment, duration_s, command, generated), counts=tuple(counts),
        unexpected=tuple(unexpected), unexpected_groups=tuple(groups_of[:BANNER_GROUPS]),
        unexpected_hidden=sum(g.runs for g in groups_of[BANNER_GROUPS:]),
        matrices=_matrices(views, href_of, page_of), runs=tuple(unexpected_first(rows)),
        scenarios=tuple(scenarios), families=tuple(sorted({family(v.scenario) for v in views})),
        designs=ordered([v.design for v in views], DESIGN_ORDER), modes=ordered([v.mode for v in views], MODE_ORDER),
        backends=ordered([v.backend for v in views], ()), data=data, compare_href=compare_href,
        load_errors=tuple(load_errors),
        scenario_expectations_failed=any(not v.ok and not v.added_design for v in views),
    )

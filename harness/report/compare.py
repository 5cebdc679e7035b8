"""What changed between two result sets (BASE, before a change; HEAD, after it), through pandas.

Runs are matched by name (``scenario[design-mode-backend]``). Each run present in both gets one change
kind, the first that applies in this order, and notes for the others (a verdict change is never a note:
both sides show the verdicts):

- ``masked regression``: matched in BASE as expected, fails in HEAD (diverges, errs or breaks an
  invariant), and reads as expected only because HEAD's scenario file now expects the failure: the
  change a review must not miss, since the per-run status says "as expected" on both sides;
- ``regressed``: gave its expected verdict in BASE (or was skipped) and does not in HEAD;
- ``fixed``: the other way round;
- ``new error``: the verdict became ``error``;
- ``verdict changed``: the observed verdict changed (its expectation changed with it);
- ``expectation changed``: the scenario file now expects another verdict;
- ``divergence moved``: both diverge, but first at another step, pool, layer, slot or class;
- ``error changed``: both fail, with another type, message or step;
- ``mismatches changed``: both diverge at the same place, with other counts.

Runs only in HEAD are ``added`` (a ``new failure`` when they do not give their expected verdict), runs
only in BASE are ``removed``.

The rule for the exit status: a change is for the worse when a run is a ``masked regression``, ``regressed``
or is a ``new failure``; ``python -m harness compare`` exits 1 when there is one, else 0 (2 when a file
cannot be read, or the report of ``--report-dir`` cannot be written: then no part of it is). The summary
groups the runs changed for the worse by kind, design and mode, so that twenty regressions of one design in
one mode read as one line with a count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pandas as pd

from .files import os_error_text
from .html import now_label, render, report_pages, write_report
from .matrix import frame
from .records import read_results
from .slots import first_divergence_sentence
from .text import printable
from .views import CaseView

KINDS = ("masked regression", "regressed", "new failure", "fixed", "new error", "verdict changed", "expectation changed",
         "divergence moved", "error changed", "mismatches changed", "added", "removed", "unchanged")
WORSE = ("masked regression", "regressed", "new failure")
FAILING = ("diverge", "error", "invariant")
_IMPLIED = {"masked regression": ("expectation changed", "new error")}
"""notes a kind already says; "verdict changed" is never a note (both sides show the verdicts)"""
BETTER = ("fixed",)


def _first_at(v: CaseView) -> str | None:
    f = v.first
    if f is None:
        return None
    return f"step {f.step} {f.pool} layer {f.layer} slot {f.slot} {f.classification}"


def _error_at(v: CaseView) -> str | None:
    e = v.error
    return None if e is None else f"{e.type} at step {e.step}: {e.message}"


def _frame(views: Sequence[CaseView]) -> pd.DataFrame:
    df = frame(views)
    df["first_at"] = [_first_at(v) for v in views]
    df["error_at"] = [_error_at(v) for v in views]
    df["sentence"] = [first_divergence_sentence(v) for v in views]
    df["why"] = [v.why for v in views]
    df["clean"] = [v.clean_rerun for v in views]
    return df.drop_duplicates("name", keep="last").set_index("name")


def compare_frame(base: Sequence[CaseView], head: Sequence[CaseView]) -> pd.DataFrame:
    """One row per run name in either set: base_* and head_* columns, ``kind``, ``notes`` and ``worse``."""
    b, h = _frame(base), _frame(head)
    df = pd.merge(b, h, how="outer", left_index=True, right_index=True, suffixes=("_base", "_head"))
    df.columns = [f"{c.rsplit('_', 1)[1]}_{c.rsplit('_', 1)[0]}" if c.endswith(("_base", "_head")) else c
                  for c in df.columns]
    in_base = pd.Series(df.index.isin(b.index), index=df.index)
    in_head = pd.Series(df.index.isin(h.index), index=df.index)
    both = in_base & in_head
    ok_b = df["base_ok"].fillna(False).astype(bool)
    ok_h = df["head_ok"].fillna(False).astype(bool)

    def differs(column: str) -> pd.Series:
        x, y = df[f"base_{column}"], df[f"head_{column}"]
        return both & ~((x == y) | (x.isna() & y.isna()))

    diverge_both = both & (df["base_verdict"] == "diverge") & (df["head_verdict"] == "diverge")
    error_both = both & (df["base_verdict"] == "error") & (df["head_verdict"] == "error")
    flags = {
        "masked regression": (both & ok_b & ok_h & (df["base_verdict"] == "match") & df["head_verdict"].isin(FAILING)
                              & differs("expected")),
        "regressed": both & ok_b & ~ok_h,
        "new failure": ~in_base & in_head & ~ok_h,
        "fixed": both & ~ok_b & ok_h,
        "new error": both & (df["head_verdict"] == "error") & (df["base_verdict"] != "error"),
        "verdict changed": differs("verdict"),
        "expectation changed": differs("expected"),
        "divergence moved": diverge_both & differs("first_at"),
        "error changed": error_both & differs("error_at"),
        "mismatches changed": diverge_both & ~differs("first_at") & (differs("mismatches") | differs("mismatched_slots")),
        "added": ~in_base & in_head,
        "removed": in_base & ~in_head,
    }
    names = list(flags)
    df["kind"] = np.select([flags[k].to_numpy() for k in names], names, default="unchanged")
    table = pd.DataFrame({k: v.to_numpy() for k, v in flags.items()}, index=df.index)
    df["notes"] = [", ".join(k for k in names if row[k] and k != kind and k not in ("added", "verdict changed")
                             and k not in _IMPLIED.get(kind, ()))
                   for kind, (_, row) in zip(df["kind"], table.iterrows())]
    df["worse"] = df["kind"].isin(WORSE)
    order = {k: i for i, k in enumerate(KINDS)}
    df["_order"] = df["kind"].map(order)
    return df.sort_values(["_order", "base_scenario", "head_scenario"], kind="stable", na_position="last").drop(columns="_order")


@dataclass(frozen=True, slots=True, kw_only=True)
class Side:
    expected: str | None
    verdict: str | None
    status: str | None
    sentence: str
    why: str
    """why the scenario file expects ``expected``"""
    mismatches: int
    mismatched_slots: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangeRow:
    name: str
    scenario: str
    design: str
    mode: str
    clean: bool
    """the clean rerun of a fault scenario"""
    kind: str
    notes: str
    worse: bool
    better: bool
    base: Side | None
    head: Side | None
    href: str | None
    """the run on the HEAD report written beside the comparison"""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangeGroup:
    """The runs of one kind of change for the worse in one design and mode: one line however many."""

    kind: str
    design: str
    mode: str
    rows: tuple[ChangeRow, ...]
    transitions: tuple[tuple[str, int], ...]
    """("match -> diverge", runs), most runs first"""
    base_mismatches: int
    head_mismatches: int

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.design}:{self.mode}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ComparePage:
    base_label: str
    head_label: str
    generated: str | None
    counts: tuple[tuple[str, int], ...]
    worse: tuple[ChangeRow, ...]
    """every run changed for the worse, masked regressions first"""
    masked: tuple[ChangeGroup, ...]
    """the masked regressions per design and mode"""
    worse_groups: tuple[ChangeGroup, ...]
    """the other runs changed for the worse (regressed, new failure) per kind, design and mode"""
    better: tuple[ChangeRow, ...]
    changed: tuple[ChangeRow, ...]
    added: tuple[ChangeRow, ...]
    removed: tuple[ChangeRow, ...]
    unchanged: int
    environments: tuple[tuple[str, str, str], ...]
    """(field, base value, head value)"""
    index_href: str
    exit_status: int

    @property
    def masked_runs(self) -> int:
        return sum(len(g.rows) for g in self.masked)


def _status(verdict: Any, ok: Any, skip: Any) -> str | None:
    if not isinstance(verdict, str):
        return None
    if isinstance(skip, str):
        return "skipped"
    return "ok" if bool(ok) else "unexpected"


def _side(row: pd.Series, prefix: str) -> Side | None:
    if not isinstance(row[f"{prefix}_verdict"], str):
        return None
    return Side(expected=row[f"{prefix}_expected"], verdict=row[f"{prefix}_verdict"],
                status=_status(row[f"{prefix}_verdict"], row[f"{prefix}_ok"], row[f"{prefix}_skip_reason"]),
                sentence=row[f"{prefix}_sentence"], why=row[f"{prefix}_why"],
                mismatches=int(row[f"{prefix}_mismatches"]), mismatched_slots=int(row[f"{prefix}_mismatched_slots"]))


def _row(name: str, row: pd.Series, href: str | None) -> ChangeRow:
    # a run's identity from HEAD where it is there, else from BASE (a removed run)
    side = "head" if isinstance(row["head_verdict"], str) else "base"
    return ChangeRow(name=name, scenario=row[f"{side}_scenario"], design=row[f"{side}_design"],
                     mode=row[f"{side}_mode"], clean=bool(row[f"{side}_clean"]), kind=row["kind"], notes=row["notes"],
                     worse=bool(row["worse"]), better=row["kind"] in BETTER, base=_side(row, "base"),
                     head=_side(row, "head"), href=href)


def _groups(rows: Sequence[ChangeRow]) -> tuple[ChangeGroup, ...]:
    by_key: dict[tuple[str, str, str], list[ChangeRow]] = {}
    for r in rows:
        by_key.setdefault((r.kind, r.design, r.mode), []).append(r)
    out = []
    for (kind, design, mode), group in by_key.items():
        moves = Counter(f"{r.base.verdict if r.base else 'absent'} -> {r.head.verdict if r.head else 'absent'}"
                        for r in group)
        out.append(ChangeGroup(kind=kind, design=design, mode=mode, rows=tuple(group),
                               transitions=tuple(moves.most_common()),
                               base_mismatches=sum(r.base.mismatches for r in group if r.base),
                               head_mismatches=sum(r.head.mismatches for r in group if r.head)))
    # a kind's groups stay together (worst kind first), the largest group of a kind first
    order = {k: i for i, k in enumerate(KINDS)}
    return tuple(sorted(out, key=lambda g: (order[g.kind], -len(g.rows))))


def compare_page(base: Sequence[CaseView], head: Sequence[CaseView], *, base_label: str, head_label: str,
                 base_env: dict[str, Any] | None = None, head_env: dict[str, Any] | None = None,
                 hrefs: dict[str, str] | None = None, generated: str | None = None) -> ComparePage:
    df = compare_frame(base, head)
    hrefs = hrefs or {}
    rows = [_row(str(name), row, hrefs.get(str(name))) for name, row in df.iterrows()]
    counts = tuple((k, int((df["kind"] == k).sum())) for k in KINDS if k == "unchanged" or (df["kind"] == k).any())
    keys = list(dict.fromkeys([*(base_env or {}), *(head_env or {})]))
    envs = tuple((k, str((base_env or {}).get(k, "-")), str((head_env or {}).get(k, "-"))) for k in keys)
    worse = [r for r in rows if r.worse]
    return ComparePage(
        base_label=base_label, head_label=head_label, generated=generated, counts=counts,
        worse=tuple(worse), masked=_groups([r for r in worse if r.kind == "masked regression"]),
        worse_groups=_groups([r for r in worse if r.kind != "masked regression"]),
        better=tuple(r for r in rows if r.better),
        changed=tuple(r for r in rows if not (r.worse or r.better) and r.kind not in ("added", "removed", "unchanged")),
        added=tuple(r for r in rows if r.kind == "added"), removed=tuple(r for r in rows if r.kind == "removed"),
        unchanged=int((df["kind"] == "unchanged").sum()), environments=envs, index_href="index.html",
        exit_status=1 if df["worse"].any() else 0,
    )


def _one_line(text: str, limit: int = 150) -> str:
    text = printable(" ".join(text.split()))
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "\u2026"


def _counts(r: ChangeRow) -> str:
    b, h = (r.base.mismatches if r.base else 0), (r.head.mismatches if r.head else 0)
    return f", mismatches {b} -> {h}" if b or h else ""


def _row_line(r: ChangeRow) -> str:
    before = f"{r.base.verdict} (expected {r.base.expected})" if r.base else "-"
    after = f"{r.head.verdict} (expected {r.head.expected})" if r.head else "-"
    line = f"  {r.kind.upper():<20} {printable(r.name)}: {before} -> {after}{_counts(r)}"
    if r.notes:
        line += f" ({r.notes})"
    if r.kind == "divergence moved" and r.base and r.head:
        line += f"\n{'':23}was {printable(r.base.sentence)}\n{'':23}now {printable(r.head.sentence)}"
    elif r.head and r.head.verdict != "match" and r.kind in ("regressed", "new failure", "new error", "error changed"):
        line += f"\n{'':23}{printable(r.head.sentence)}"
    return line


def _group_line(g: ChangeGroup, *, names: int = 6) -> str:
    n = len(g.rows)
    moves = ", ".join(f"{t} ({k})" if len(g.transitions) > 1 else t for t, k in g.transitions)
    mismatches = f", mismatches {g.base_mismatches} -> {g.head_mismatches}" if g.base_mismatches or g.head_mismatches else ""
    shown = [printable(r.scenario) + (" (no faults)" if r.clean else "") for r in g.rows[:names]]
    more = f" and {n - names} more" if n > names else ""
    return (f"  {g.kind.upper():<20} {printable(g.design)} x {printable(g.mode)}: {n} runs, {moves}{mismatches}\n"
            f"{'':23}{', '.join(shown)}{more}")


def _masked_lines(g: ChangeGroup, *, per_group: int) -> list[str]:
    lines = [f"  {printable(g.design)} x {printable(g.mode)}: {len(g.rows)} run{'s' if len(g.rows) != 1 else ''}"]
    for r in g.rows[:per_group]:
        assert r.base is not None and r.head is not None
        lines += [f"    {printable(r.name)}: {r.base.verdict} -> {r.head.verdict}{_counts(r)}",
                  f"      BASE expected {r.base.expected}: {_one_line(r.base.why)}",
                  f"      HEAD expected {r.head.expected}: {_one_line(r.head.why)}"
                  + (" (the why is BASE's, unchanged)" if r.head.why == r.base.why else ""),
                  f"      HEAD: {printable(r.head.sentence)}"]
    if len(g.rows) > per_group:
        lines.append(f"    ... and {len(g.rows) - per_group} more in {printable(g.design)} x {printable(g.mode)} "
                     "(see the page)")
    return lines


def summary_text(page: ComparePage, *, limit: int = 40, per_group: int = 3) -> str:
    """The terminal summary: counts, masked regressions with both expectations and their why, the other
    changes for the worse one line per kind, design and mode, then one line per other changed run."""
    lines = [f"compare: {printable(page.base_label)} -> {printable(page.head_label)}",
             "  " + ", ".join(f"{n} {k}" for k, n in page.counts)]
    if page.masked:
        n = page.masked_runs
        lines.append(f"MASKED REGRESSION{'S' if n != 1 else ''}: {n} run{'s' if n != 1 else ''} matched in BASE, "
                     f"fail{'s' if n == 1 else ''} in HEAD, and read{'s' if n == 1 else ''} as expected only because "
                     "HEAD's scenario file now expects the failure")
        for g in page.masked:
            lines += _masked_lines(g, per_group=per_group)
    for g in page.worse_groups:
        lines.append(_row_line(g.rows[0]) if len(g.rows) == 1 else _group_line(g))
    rest = [*page.better, *page.changed, *page.added, *page.removed]
    for r in rest[:limit]:
        lines.append(_row_line(r))
    if len(rest) > limit:
        lines.append(f"  ... and {len(rest) - limit} more changes (see the page)")
    worse = len(page.worse)
    lines.append(f"{worse} change{'s' if worse != 1 else ''} for the worse (a run that gave its expected verdict "
                 f"no longer does, a new run that does not, or a run whose new failure HEAD now expects)"
                 if worse else "nothing changed for the worse")
    return "\n".join(lines)


def run_compare(base_path: Path, head_path: Path, *, report_dir: Path | None, out: TextIO, err: TextIO) -> int:
    """``python -m harness compare``: print the summary, write the pages; the exit status (module docstring)."""
    try:
        base, base_doc = read_results(base_path)
        head, head_doc = read_results(head_path)
    except ValueError as exc:
        print(printable(str(exc)), file=err)
        return 2
    hrefs: dict[str, str] = {}
    if report_dir is not None:
        pages, anchors = report_pages(head)
        hrefs = {v.name: f"{pages[(v.scenario, v.path)]}#{anchors[v.name]}" for v in head}
    page = compare_page(base, head, base_label=str(base_path), head_label=str(head_path),
                        base_env=base_doc.get("environment"), head_env=head_doc.get("environment"), hrefs=hrefs,
                        generated=now_label())
    print(summary_text(page), file=out)
    if report_dir is not None:
        # HEAD's pages and the comparison land together or not at all: a failure leaves no half a report
        try:
            write_report(report_dir, head, environment=head_doc.get("environment") or {},
                         duration_s=head_doc.get("duration_s"), complete=bool(head_doc.get("complete", True)),
                         generated=page.generated, compare_href="compare.html", document=head_doc,
                         extra={"compare.html": render("compare.html.j2", page=page)})
        except OSError as exc:
            print(printable(f"--report-dir {report_dir}: the report was not written: {os_error_text(exc)}"), file=err)
            return 2
        path = report_dir / "compare.html"
        print(f"KV compare: {path.resolve().as_uri()}", file=out)
    return page.exit_status



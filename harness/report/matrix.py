"""Tables over many cases, through pandas: the verdict matrix, CSV export, comparison of two result sets."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from .views import CaseView

_COLUMNS = ("name", "scenario", "design", "mode", "backend", "engine", "device", "expected", "verdict", "ok",
            "mismatches", "mismatched_slots", "first_divergent_step", "first_class", "error_type", "skip_reason")


def frame(views: Sequence[CaseView]) -> pd.DataFrame:
    """One row per case, flat columns only."""
    rows = [{
        "name": v.name, "scenario": v.scenario, "design": v.design, "mode": v.mode, "backend": v.backend,
        "engine": v.engine, "device": v.device, "expected": v.expected, "verdict": v.verdict, "ok": v.ok,
        "mismatches": v.mismatches, "mismatched_slots": v.mismatched_slots,
        "first_divergent_step": v.first.step if v.first else None,
        "first_class": v.first.classification if v.first else None,
        "error_type": v.error.type if v.error else None, "skip_reason": v.skip_reason,
        "with_faults": not v.clean_rerun,
    } for v in views]
    return pd.DataFrame(rows, columns=[*_COLUMNS, "with_faults"])


def verdict_matrix(views: Sequence[CaseView]) -> pd.DataFrame:
    """Observed verdicts counted per (backend, design) and mode, over every scenario: what a reviewer scans
    first. Clean reruns of fault scenarios are left out: they would count the same cell twice."""
    df = frame(views)
    df = df[df["with_faults"]]
    if df.empty:
        return pd.DataFrame()
    counts = df.groupby(["backend", "design", "mode", "verdict"]).size().unstack("verdict", fill_value=0)
    cells = counts.apply(lambda row: " ".join(f"{v}:{n}" for v, n in row.items() if n), axis=1)
    return cells.unstack("mode", fill_value="-")


def matrix_text(views: Sequence[CaseView]) -> str:
    table = verdict_matrix(views)
    return "" if table.empty else table.to_string()


def results_csv(views: Sequence[CaseView]) -> str:
    return frame(views).drop(columns=["with_faults"]).to_csv(index=False)

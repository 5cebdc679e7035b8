"""A report session: gathers the case views of one harness run, from the CLI or from pytest, and writes
what was asked for when it ends.

The pytest plugin's hooks delegate here (as syrupy's hooks delegate to its ``SnapshotSession``). Under
pytest-xdist each worker's item puts its view's JSON record in ``user_properties``, which xdist sends to
the controller with the test report; the controller's session turns records back into views, so results
of every worker arrive whole and in one place, and the files written at the end (JSON, the HTML report)
come from that one place only.
"""

from __future__ import annotations

import time
from pathlib import Path

from .html import now_label, write_report
from .matrix import matrix_text
from .records import write_results
from .text import totals_line
from .views import CaseView

RECORD_PROPERTY = "harness_case"
"""the ``user_properties`` key under which an item carries its case's record"""


class ReportSession:
    def __init__(self, *, json_path: Path | None = None, report_dir: Path | None = None,
                 command: str | None = None) -> None:
        self.json_path = json_path
        self.report_dir = report_dir
        self.command = command
        """the command line the report's settings show"""
        self.report_index: Path | None = None
        """the HTML report's index, once written"""
        self.views: list[CaseView] = []
        self.load_errors: list[str] = []
        self._seen: set[str] = set()
        self._started = time.perf_counter()

    def add(self, view: CaseView) -> None:
        # a rerun of the same item (pytest-rerunfailures, --lf) replaces, never duplicates
        if view.name in self._seen:
            self.views = [v for v in self.views if v.name != view.name]
        self._seen.add(view.name)
        self.views.append(view)

    def add_record(self, record: dict) -> None:
        self.add(CaseView.from_record(record))

    @property
    def duration_s(self) -> float:
        return time.perf_counter() - self._started

    def finish(self, *, complete: bool = True) -> list[Path]:
        """Write the requested files; the paths written."""
        written = []
        if self.json_path is not None and self.views:
            write_results(self.json_path, self._ordered(), complete=complete, duration_s=self.duration_s)
            written.append(self.json_path)
        if self.report_dir is not None and self.views:
            self.report_index = write_report(self.report_dir, self._ordered(), duration_s=self.duration_s,
                                             complete=complete, command=self.command, generated=now_label(),
                                             load_errors=self.load_errors)
            written.append(self.report_index)
        return written

    def report_line(self) -> str | None:
        """``KV report: file:///.../index.html`` once the HTML report is written."""
        return f"KV report: {self.report_index.resolve().as_uri()}" if self.report_index is not None else None

    def summary_lines(self) -> list[str]:
        """The verdict matrix and the totals, for the end of a run."""
        if not self.views:
            return []
        matrix = matrix_text(self._ordered())
        return [*([matrix, ""] if matrix else []), totals_line(self.views, len(self.load_errors))]

    def _ordered(self) -> list[CaseView]:
        # workers finish in any order; reports list cases by scenario, then as the matrix planned them
        return sorted(self.views, key=lambda v: (v.path, v.name))

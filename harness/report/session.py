"""A report session: gathers the case views of one harness run, from the CLI or from pytest, and writes
what was asked for when it ends; both front ends write their JSON results and HTML report through it.

The pytest plugin's hooks delegate here (as syrupy's hooks delegate to its ``SnapshotSession``). Each
scenario item's view travels as a JSON record in an attribute of its test report (``RECORD_ATTRIBUTE``),
which pytest-xdist serializes with the report and sends to the controller; the controller's session turns
records back into views, so results of every worker arrive whole and in one place, and the files written
at the end (JSON, the HTML report) come from that one place only. The record is not a ``user_property``:
those go into JUnit XML whole.

Results are never lost to a destination that fails at the end (a full disk, a file-size limit): the JSON is
written first, atomically, then the report, each on its own; what could not be written is one line in
``problems``, and the front ends print it and exit non-zero.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from .files import os_error_text
from .text import fault_split_line, information_line, totals_line
from .views import CaseView

RECORD_ATTRIBUTE = "harness_record"
"""the attribute under which a scenario item, then its call-phase test report, carries its case's record"""


class ReportSession:
    """One run's views and the files asked of it. ``planned``: the run names in the order the matrix planned
    them (the CLI knows its plan up front; pytest's controller does not), which reports then keep."""

    def __init__(self, *, json_path: Path | None = None, report_dir: Path | None = None,
                 command: str | None = None, planned: Sequence[str] | None = None,
                 load_errors: Sequence[tuple[str, ...]] = ()) -> None:
        self.json_path = json_path
        self.report_dir = report_dir
        self.command = command
        """the command line the report's settings show"""
        self.report_index: Path | None = None
        """the HTML report's index, once written"""
        self.views: list[CaseView] = []
        self.load_errors = list(load_errors)
        """the problems of each scenario file that failed to load, one entry per file"""
        self._plan = {name: i for i, name in enumerate(planned)} if planned is not None else None
        self._seen: set[str] = set()
        self._started = time.perf_counter()
        self._expected = False
        self.problems: list[str] = []
        """one line per requested file that ``finish`` could not write"""
        self.results_written = False
        """whether ``finish`` wrote the JSON results"""

    def add(self, view: CaseView) -> None:
        # a rerun of the same item (pytest-rerunfailures, --lf) replaces, never duplicates
        if view.name in self._seen:
            self.views = [v for v in self.views if v.name != view.name]
        self._seen.add(view.name)
        self.views.append(view)

    def expect_runs(self) -> None:
        """Scenario runs were selected (pytest knows once it has collected): an interrupted session writes
        the files asked for, with what finished, even before its first result."""
        self._expected = True

    def add_record(self, record: dict) -> None:
        self.add(CaseView.from_record(record))

    @property
    def duration_s(self) -> float:
        return time.perf_counter() - self._started

    def finish(self, *, complete: bool = True) -> list[Path]:
        """Write the requested files, the results first; the paths written. A destination that fails is a line
        in ``problems``, and the others are still written."""
        written: list[Path] = []
        if not self._asked_for_runs and not (self._expected and not complete):
            return written
        # the writers (jinja2, pandas) are imported once there is something to write: every pytest session
        # holds a report session, and most gather no scenario result
        from .html import now_label, write_report
        from .records import write_results

        views = self.ordered()
        if self.json_path is not None:
            try:
                write_results(self.json_path, views, complete=complete, duration_s=self.duration_s)
                written.append(self.json_path)
                self.results_written = True
            except OSError as exc:
                self.problems.append(f"the results were not written to {self.json_path}: {os_error_text(exc)}")
        if self.report_dir is not None:
            try:
                self.report_index = write_report(
                    self.report_dir, views, duration_s=self.duration_s, complete=complete, command=self.command,
                    generated=now_label(), load_errors=[line for problems in self.load_errors for line in problems])
                written.append(self.report_index)
            except OSError as exc:
                self.problems.append(f"the HTML report was not written to {self.report_dir} (nothing of it is "
                                     f"there): {os_error_text(exc)}")
        return written

    def report_line(self) -> str | None:
        """``KV report: file:///.../index.html`` once the HTML report is written."""
        return f"KV report: {self.report_index.resolve().as_uri()}" if self.report_index is not None else None

    def summary_lines(self) -> list[str]:
        """The verdict matrix and the totals, for the end of a run."""
        if not self._asked_for_runs:
            return []
        from .matrix import matrix_text

        matrix = matrix_text(self.ordered())
        split, info = fault_split_line(self.views), information_line(self.views)
        return [*([matrix, ""] if matrix else []), totals_line(self.views, len(self.load_errors)),
                *([split] if split is not None else []), *([info] if info is not None else [])]

    def ordered(self) -> list[CaseView]:
        """The views in the plan's order; without a plan (pytest-xdist workers finish in any order), by
        scenario file, then name."""
        if self._plan is not None:
            plan = self._plan
            return sorted(self.views, key=lambda v: plan.get(v.name, len(plan)))
        return sorted(self.views, key=lambda v: (v.path, v.name))

    @property
    def _asked_for_runs(self) -> bool:
        # a planned run (the CLI's) reports even when interrupted before its first result: the files then say
        # it is incomplete; a pytest session without scenario items writes nothing
        return bool(self.views) or bool(self._plan)

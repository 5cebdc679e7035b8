"""``results.json``: one record per case (``CaseView.to_record``) inside a versioned document.

Document fields: ``version`` (of this schema), ``complete`` (false when the run was interrupted),
``environment`` (harness, torch and flashinfer versions, Python), ``duration_s``, ``totals`` (as expected,
unexpected and skipped, apart for ``clean`` runs and runs under ``injected_faults``) and ``records``. Records
hold no timestamps and no memory addresses, so two runs of the same inputs give equal records.
"""

from __future__ import annotations

import dataclasses
import json
import platform
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from .files import write_atomic
from .results_schema import ResultsFileError, read_document
from .views import RECORD_VERSION, CaseView, fault_split


def environment() -> dict[str, str]:
    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {"harness": version("swa-graph-harness"), "torch": version("torch"),
            "flashinfer": version("flashinfer-python"), "python": platform.python_version()}


def results_document(views: Sequence[CaseView], *, complete: bool = True, duration_s: float | None = None) -> dict[str, Any]:
    return {
        "version": RECORD_VERSION,
        "complete": complete,
        "environment": environment(),
        "duration_s": None if duration_s is None else round(duration_s, 1),
        # a design's own bugs show in "clean"; under "injected_faults" the library breaks the run on purpose
        "totals": {key: dataclasses.asdict(t) for key, t in fault_split(views).items()},
        "records": [v.to_record() for v in views],
    }


def document_text(doc: dict[str, Any]) -> str:
    """A results document as ``results.json`` holds it: its fields indented, each record on a line of its own.
    Records are most of a file (tens of MiB for the library), and ``json`` indents with its pure-Python encoder,
    several times as slow as its C one; a line per record also greps and diffs run by run."""
    fields = []
    for key, value in doc.items():
        if key == "records" and value:
            text = "[\n" + ",\n".join(json.dumps(r) for r in value) + "\n ]"
        else:
            # a JSON string holds no raw newline, so each line break is an indentation's
            text = json.dumps(value, indent=1).replace("\n", "\n ")
        fields.append(f" {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(fields) + "\n}\n" if fields else "{}\n"


def write_results(path: Path, views: Sequence[CaseView], *, complete: bool = True,
                  duration_s: float | None = None) -> None:
    write_atomic(path, document_text(results_document(views, complete=complete, duration_s=duration_s)))


def read_results(path: Path) -> tuple[list[CaseView], dict[str, Any]]:
    """The views of a results file and its document fields; ``ValueError`` naming the file, the record and
    the field when it is not one (the file is checked against its schema first: ``results_schema``)."""
    doc = read_document(Path(path))
    views = []
    for i, record in enumerate(doc["records"]):
        try:
            views.append(CaseView.from_record(record))
        except (KeyError, TypeError, ValueError) as exc:  # a gap in the schema: still one line, never a traceback
            raise ResultsFileError(f"{path}: records[{i}]: cannot be read: {type(exc).__name__}: {exc}") from None
    return views, doc

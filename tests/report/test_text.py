"""Terminal text that comes from files and exceptions: cut with an ellipsis, never inside an escape, and a
multi-line ``why`` that keeps its lines without letting any other control character through."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.report.text import (
    ELLIPSIS,
    duration_text,
    failure_block,
    first_divergence,
    progress_line,
    shorten,
    time_left,
)
from harness.report.views import CaseView

RECORD = Path(__file__).parent / "gold" / "tiny_wrong_window_record.json"


def _view(**changes) -> CaseView:
    return CaseView.from_record({**json.loads(RECORD.read_text()), **changes})


def test_text_that_fits_is_kept_whole_and_escaped():
    assert shorten("a\x1bb", 10) == "a\\x1bb"


@pytest.mark.parametrize("width", range(5, 13))
def test_a_cut_ends_in_an_ellipsis_and_never_splits_an_escape(width):
    text = "abc\x1bdef\nghi"
    cut = shorten(text, width)
    assert len(cut) <= width and cut.endswith(ELLIPSIS)
    pieces = ["a", "b", "c", "\\x1b", "d", "e", "f", "\\n", "g", "h", "i"]  # what each character prints as
    assert cut.removesuffix(ELLIPSIS) in ["".join(pieces[:k]) for k in range(len(pieces))]


def test_a_long_error_in_the_table_is_cut_with_an_ellipsis():
    message = "x" * 200
    view = _view(verdict="error", error={"type": "RuntimeError", "message": message, "step": 3, "frames": []})
    cell = first_divergence(view)
    assert cell.startswith("RuntimeError: xxx") and cell.endswith(ELLIPSIS) and len(cell) == 90


def test_a_terminals_progress_line_is_cut_with_an_ellipsis():
    view = _view(name="s" * 200 + "[forward_batch-eager-torch_native]")
    line = progress_line(1, 2, view, width=150)
    assert len(line) == 150 and line.endswith(ELLIPSIS)
    assert progress_line(1, 2, view).endswith("(ok)")


def test_the_progress_line_says_about_how_long_is_left_at_the_pace_so_far():
    view = _view(name="swa_x[forward_batch-eager-torch_native]")
    assert progress_line(3, 10, view, left_s=65.4).startswith("[3/10, about 1m05s left] swa_x[")
    assert progress_line(3, 10, view).startswith("[3/10] swa_x[")
    assert time_left(30.0, 3, 7) == 70.0  # 10 s a run so far, 7 to go
    assert time_left(0.5, 0, 7) is None  # no run finished: no pace yet
    assert [duration_text(s) for s in (0.4, 59.6, 60, 3599, 3725)] == ["0s", "1m00s", "1m00s", "59m59s", "1h02m"]


def test_a_multi_line_why_keeps_its_lines_indented_and_escapes_the_rest():
    view = _view(expected="match", why="first line\nsecond \x1b[31mline\nPASSED forged")
    lines = failure_block(view).splitlines()
    at = lines.index("  why expected: first line")
    assert lines[at + 1:at + 3] == ["    second \\x1b[31mline", "    PASSED forged"]
    assert not any(line.startswith("PASSED") for line in lines)

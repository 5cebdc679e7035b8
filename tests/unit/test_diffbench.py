"""The diff benchmark machinery on a tiny cache: every case is timed (each diff also through the judge) and
the diff finds what was planted.

Nothing here asserts on speed: the numbers are measurements, taken by the benchmark, never by the suite.
"""

import pytest

from harness.diffbench import measure_diff
from harness.report.bench import render_diff_markdown as render_markdown


@pytest.mark.slow
def test_measure_diff_times_copy_clone_and_each_diff_and_finds_the_planted_slots():
    rows = measure_diff(2 << 20, (10, 100), mismatched_shares=(0.1,), repeats=2)
    live = rows[0].live_slots
    assert [r.case for r in rows] == [
        "copy", "clone", "identical", "10% of slots mismatched", "10 mismatched slots", "100 mismatched slots"]
    assert all(r.seconds > 0 and r.vs_copy > 0 and r.vs_clone > 0 for r in rows)
    assert [r.judge_seconds is None for r in rows] == [True, True, False, False, False, False]
    assert all(r.judge_seconds > 0 for r in rows[2:])
    assert [(r.mismatched_slots, r.found_slots) for r in rows[2:]] == [
        (0, 0), (round(live / 10), round(live / 10)), (10, 10), (100, 100)]
    assert rows[2].mismatches == 0 and rows[5].mismatches >= 2 * 100  # every layer of the pool, both steps
    assert {name for name, _ in rows[5].classes} == {"unwritten", "overwritten", "misplaced", "drift"}
    assert rows[0].cache_bytes == rows[5].cache_bytes and 1 << 20 < rows[0].cache_bytes <= 2 << 20

    table = render_markdown(rows, "a test machine")
    assert "a test machine" in table and table.count("\n| ") == 1 + len(rows)
    assert "| 100 mismatched slots | 100 |" in table
    assert "| judge s | judge / diff |" in table and table.count("x |\n") == len(rows) - 2  # not for copy and clone

"""``python -m harness compare BASE.json HEAD.json``: each kind of change, the exit rule, the page.

BASE is a real small run; HEAD is the same views with one change per run, as a change to a backend, a
runner or a scenario file would make them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.cli import main
from harness.report.compare import compare_frame, compare_page, summary_text
from harness.report.records import write_results
from harness.report.views import ErrorView

from ._hostile import elements
from ._samples import pick

PAD = "tiny_pad_tail[forward_batch-full-torch_native]"
PAD_CLEAN = "tiny_pad_tail[forward_batch-full-torch_native-nofault]"
WINDOW = "tiny_wrong_window[forward_batch-eager-torch_native]"
ERROR = "tiny_stale_error[stale_state-eager-torch_native]"
MATCH_A = "tiny_match[translate-eager-torch_native]"
MATCH_B = "tiny_match[translate-full-torch_native]"
MATCH_C = "tiny_match[stale_state-eager-torch_native]"
MATCH_D = "tiny_match[stale_state-full-torch_native]"


@pytest.fixture(scope="module")
def base_head(sample_views):
    """(BASE, HEAD, the change kind each touched run should get)."""
    base = list(sample_views)
    pad, window, err = pick(base, PAD), pick(base, WINDOW), pick(base, ERROR)
    head_by_name = {v.name: v for v in base}
    rep = dataclasses.replace
    expect = {}
    # a run that matched now diverges, against an unchanged expectation: the regression a reviewer must see
    head_by_name[MATCH_A] = rep(pick(base, MATCH_A), verdict="diverge", first=pad.first, details=pad.details[:3],
                                mismatches=3, mismatched_slots=2)
    expect[MATCH_A] = "regressed"
    # the first divergence moved to another slot
    head_by_name[PAD] = rep(pad, first=pad.details[1], details=pad.details[1:])
    expect[PAD] = "divergence moved"
    # same place, other counts
    head_by_name[WINDOW] = rep(window, mismatches=window.mismatches + 5)
    expect[WINDOW] = "mismatches changed"
    # an error with another message
    head_by_name[ERROR] = rep(err, error=ErrorView(type="IndexError", message="index 40 is out of bounds", step=1))
    expect[ERROR] = "error changed"
    # a match becomes an error that the scenario now expects: not worse, but a new error
    head_by_name[MATCH_B] = rep(pick(base, MATCH_B), verdict="error", expected="error",
                                error=ErrorView(type="RuntimeError", message="boom", step=0))
    expect[MATCH_B] = "new error"
    # the expectation moved without the verdict
    head_by_name[PAD_CLEAN] = rep(pick(base, PAD_CLEAN), expected="diverge")
    expect[PAD_CLEAN] = "regressed"
    # removed in HEAD; added to HEAD (and not as expected: a new failure)
    del head_by_name[MATCH_C]
    expect[MATCH_C] = "removed"
    new = rep(pick(base, MATCH_D), name="tiny_match[metadata-eager-torch_native]", design="metadata", expected="diverge")
    head_by_name[new.name] = new
    expect[new.name] = "new failure"
    return base, list(head_by_name.values()), expect


def test_each_change_gets_its_kind(base_head):
    base, head, expect = base_head
    df = compare_frame(base, head)
    assert {name: df.loc[name, "kind"] for name in expect} == expect
    assert set(df.loc[[n for n in df.index if n not in expect], "kind"]) == {"unchanged"}
    assert df.loc[PAD_CLEAN, "notes"] == "expectation changed"
    assert df.loc[MATCH_B, "notes"] == "verdict changed, expectation changed"
    assert list(df["kind"][: sum(df["worse"])]) == ["regressed", "regressed", "new failure"]  # worse first


def test_exit_status_is_1_only_when_something_changed_for_the_worse(base_head):
    base, head, _ = base_head
    page = compare_page(base, head, base_label="BASE", head_label="HEAD")
    assert page.exit_status == 1 and {r.name for r in page.worse} == {MATCH_A, PAD_CLEAN,
                                                                      "tiny_match[metadata-eager-torch_native]"}
    text = summary_text(page)
    assert text.splitlines()[1] == ("  2 regressed, 1 new failure, 1 new error, 1 divergence moved, 1 error changed, "
                                    "1 mismatches changed, 1 removed, 6 unchanged")
    assert f"  REGRESSED            {MATCH_A}: match (expected match) -> diverge (expected match)" in text
    assert text.endswith("3 changes for the worse (a run that gave its expected verdict no longer does, or a new run "
                         "that does not)")
    same = compare_page(base, base, base_label="BASE", head_label="BASE")
    assert same.exit_status == 0 and summary_text(same).endswith("nothing changed for the worse")
    better = compare_page(head, base, base_label="HEAD", head_label="BASE")
    assert better.exit_status == 0 and {r.kind for r in better.better} == {"fixed"}


def test_compare_command_prints_the_summary_and_writes_the_page(base_head, tmp_path, capsys):
    base, head, _ = base_head
    write_results(tmp_path / "base.json", base)
    write_results(tmp_path / "head.json", head)
    code = main(["compare", str(tmp_path / "base.json"), str(tmp_path / "head.json"), "--report-dir",
                 str(tmp_path / "cmp")])
    out = capsys.readouterr().out
    assert code == 1
    assert out.splitlines()[-1] == f"KV compare: {(tmp_path / 'cmp' / 'compare.html').resolve().as_uri()}"
    page = (tmp_path / "cmp" / "compare.html").read_text()
    assert 'id="worse-banner"' in page
    tags = elements(tmp_path / "cmp" / "compare.html").tags
    changes = [a["data-change"] for t, a in tags if t == "tr" and "data-change" in a]
    assert changes[:3] == ["regressed", "regressed", "new failure"] and len(changes) == 8
    links = [a["href"] for t, a in tags if t == "a" and a.get("href", "").startswith("scenarios/")]
    assert links and all((tmp_path / "cmp" / h.split("#")[0]).exists() for h in links)
    assert 'href="compare.html"' in (tmp_path / "cmp" / "index.html").read_text()

    assert main(["compare", str(tmp_path / "base.json"), str(tmp_path / "base.json")]) == 0
    assert capsys.readouterr().out.rstrip().endswith("nothing changed for the worse")


def test_compare_refuses_a_file_that_is_not_results(tmp_path: Path, capsys):
    (tmp_path / "x.json").write_text('{"version": 99}')
    assert main(["compare", str(tmp_path / "x.json"), str(tmp_path / "x.json")]) == 2
    assert "not a harness results file" in capsys.readouterr().err

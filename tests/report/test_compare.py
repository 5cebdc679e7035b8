"""``python -m harness compare BASE.json HEAD.json``: each kind of change, the exit rule, the page.

BASE is a real small run; HEAD is the same views with one change per run, as a change to a backend, a
runner or a scenario file would make them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli import main
from harness.report.compare import compare_frame, compare_page, summary_text
from harness.report.records import read_results, results_document, write_results
from harness.report.results_schema import FILE_LIMIT, ResultsFileError, check_document
from harness.report.slots import first_divergence_sentence
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
MATCH_E = "tiny_match[forward_batch-full-torch_native]"
DRAFT = "tiny_stale_error[forward_batch-eager-torch_native]"


@pytest.fixture(scope="module")
def base_head(sample_views):
    """(BASE, HEAD, the change kind each touched run should get)."""
    rep = dataclasses.replace
    base = list(sample_views)
    pad, window, err = pick(base, PAD), pick(base, WINDOW), pick(base, ERROR)
    # BASE's own diverging run, as expected, so that HEAD can turn it into an error it expects too
    base = [rep(v, verdict="diverge", expected="diverge", first=pad.first, details=pad.details[:1], mismatches=1,
                mismatched_slots=1) if v.name == DRAFT else v for v in base]
    head_by_name = {v.name: v for v in base}
    expect = {}
    # a match that now diverges, with HEAD's scenario file edited to expect it: as expected on both sides, and
    # the regression a review must catch
    head_by_name[MATCH_E] = rep(pick(base, MATCH_E), verdict="diverge", expected="diverge", first=pad.first,
                                details=pad.details[:2], mismatches=4, mismatched_slots=2,
                                why="HEAD now says the padded rows are expected to diverge")
    expect[MATCH_E] = "masked regression"
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
    # a match becomes an error that the scenario now expects: masked too
    head_by_name[MATCH_B] = rep(pick(base, MATCH_B), verdict="error", expected="error",
                                error=ErrorView(type="RuntimeError", message="boom", step=0))
    expect[MATCH_B] = "masked regression"
    # a divergence becomes an error that the scenario now expects: not worse (it was failing), but a new error
    head_by_name[DRAFT] = rep(pick(base, DRAFT), verdict="error", expected="error", first=None, details=(),
                              mismatches=0, mismatched_slots=0,
                              error=ErrorView(type="RuntimeError", message="boom", step=1))
    expect[DRAFT] = "new error"
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
    # the verdicts are on both sides of every row: "verdict changed" is never repeated as a note, nor what the
    # kind already says
    assert df.loc[MATCH_B, "notes"] == "" and df.loc[MATCH_E, "notes"] == ""
    assert df.loc[DRAFT, "notes"] == "expectation changed"
    assert list(df["kind"][: sum(df["worse"])]) == ["masked regression", "masked regression", "regressed",
                                                     "regressed", "new failure"]  # worse first


def test_exit_status_is_1_only_when_something_changed_for_the_worse(base_head):
    base, head, _ = base_head
    page = compare_page(base, head, base_label="BASE", head_label="HEAD")
    assert page.exit_status == 1 and {r.name for r in page.worse} == {MATCH_A, MATCH_B, MATCH_E, PAD_CLEAN,
                                                                      "tiny_match[metadata-eager-torch_native]"}
    text = summary_text(page)
    assert text.splitlines()[1] == ("  2 masked regression, 2 regressed, 1 new failure, 1 new error, 1 divergence "
                                    "moved, 1 error changed, 1 mismatches changed, 1 removed, 4 unchanged")
    assert (f"  REGRESSED            {MATCH_A}: match (expected match) -> diverge (expected match), mismatches 0 -> 3"
            in text)
    assert "verdict changed" not in text
    assert text.endswith("5 changes for the worse (a run that gave its expected verdict no longer does, a new run "
                         "that does not, or a run whose new failure HEAD now expects)")
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
    assert changes[:5] == ["masked regression", "masked regression", "regressed", "regressed", "new failure"]
    assert len(changes) == 10
    links = [a["href"] for t, a in tags if t == "a" and a.get("href", "").startswith("scenarios/")]
    assert links and all((tmp_path / "cmp" / h.split("#")[0]).exists() for h in links)
    assert 'href="compare.html"' in (tmp_path / "cmp" / "index.html").read_text()

    assert main(["compare", str(tmp_path / "base.json"), str(tmp_path / "base.json")]) == 0
    assert capsys.readouterr().out.rstrip().endswith("nothing changed for the worse")


def test_compare_refuses_a_file_that_is_not_results(tmp_path: Path, capsys):
    (tmp_path / "x.json").write_text('{"version": 99}')
    assert main(["compare", str(tmp_path / "x.json"), str(tmp_path / "x.json")]) == 2
    assert "not a harness results file" in capsys.readouterr().err


# ---- a results file is untrusted input ----------------------------------------------------------------

def _doc(views) -> dict:
    return json.loads(json.dumps(results_document(views)))


def _first_diverging(doc: dict) -> int:
    return next(i for i, r in enumerate(doc["records"]) if r["first"] is not None and r["setup"])


def _set(path: str, value):
    """An edit of the document: ``path`` is a list of keys and indexes, ``"D"`` the first diverging record."""
    def edit(doc: dict) -> None:
        keys = [(_first_diverging(doc) if k == "D" else k) for k in path]
        target = doc
        for k in keys[:-1]:
            target = target[k]
        if value is _DELETE:
            del target[keys[-1]]
        else:
            target[keys[-1]] = value
    return edit


_DELETE = object()

HOSTILE_EDITS = {
    # what the issue met: a traceback, a silent accept, a hang
    "name_is_a_list": (_set(["records", 0, "name"], ["x"]), "records[0]: name: expected a string, got an array of 1"),
    "verdict_is_a_number": (_set(["records", 1, "verdict"], 5), "): verdict: expected a string, got the number 5"),
    "verdict_unknown": (_set(["records", 1, "verdict"], "pass"), "): verdict: expected one of 'match', 'diverge', "
                                                                "'error', 'invariant', 'skipped', got the string 'pass'"),
    "mismatches_many": (_set(["records", 1, "mismatches"], "many"), "): mismatches: expected an integer, got the "
                                                                   "string 'many'"),
    "mismatches_negative": (_set(["records", 1, "mismatches"], -1), "): mismatches: expected an integer from 0 to"),
    "mismatches_true": (_set(["records", 1, "mismatches"], True), "): mismatches: expected an integer, got true"),
    "mismatches_nan": (_set(["records", 1, "mismatches"], float("nan")), "): mismatches: expected an integer, got NaN"),
    "duration_infinite": (_set(["duration_s"], float("-inf")), "duration_s: expected a number of seconds or null, "
                                                              "got -Infinity"),
    "pool_a_billion_slots": (_set(["records", "D", "setup", "full_size"], 10**9),
                             "): setup.full_size: expected an integer from 2 to 1048576, got the number 1000000000"),
    "missing_verdict": (_set(["records", 2, "verdict"], _DELETE), "): verdict: missing"),
    "missing_mismatch_field": (_set(["records", "D", "first", "owner"], _DELETE), "): first.owner: missing"),
    "step_kind_unknown": (_set(["records", "D", "steps", 0, "kind"], "prefill"), "): steps[0].kind: expected one of "
                                                                               "'extend', 'decode', 'draft'"),
    "written_token_short": (_set(["records", "D", "steps", 0, "written", 0], ["a", 1]),
                            "): steps[0].written[0]: expected an array of 4, got an array of 2"),
    "heat_pool_unknown": (_set(["records", "D", "heat", 0, "pool"], "disk"), "): heat[0].pool: expected one of"),
    "detail_extra_field": (_set(["records", "D", "details", 0, "extra"], 1), "): details[0].extra: unknown field"),
    "classes_not_pairs": (_set(["records", "D", "classes"], [["drift"]]), "): classes[0]: expected an array of 2"),
    "records_not_an_array": (_set(["records"], {"a": 1}), "records: expected an array of records, got an object"),
    "record_not_an_object": (_set(["records", 0], "x"), "records[0]: expected an object, got the string 'x'"),
    "environment_nested": (_set(["environment", "torch"], {"v": 1}), "environment: expected an object of strings"),
    "duration_negative": (_set(["duration_s"], -3), "duration_s: expected a number of seconds or null"),
    "complete_a_string": (_set(["complete"], "yes"), "complete: expected true or false, got the string 'yes'"),
    "version_of_a_record": (_set(["records", 0, "version"], 2), "records[0] (run '"),
}


@pytest.mark.parametrize("edit", sorted(HOSTILE_EDITS))
def test_a_hostile_results_file_is_refused_with_one_line_naming_file_record_and_field(edit, sample_views, tmp_path,
                                                                                     capsys):
    change, fragment = HOSTILE_EDITS[edit]
    doc = _doc(sample_views)
    change(doc)
    bad = tmp_path / "head.json"
    bad.write_text(json.dumps(doc))
    write_results(tmp_path / "base.json", sample_views)
    start = time.monotonic()
    code = main(["compare", str(tmp_path / "base.json"), str(bad), "--report-dir", str(tmp_path / "cmp")])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{bad}: not a harness results file: ") and fragment in lines[0], err
    assert time.monotonic() - start < 10
    assert not (tmp_path / "cmp").exists()  # nothing written from a refused file


@pytest.mark.parametrize(("text", "fragment"), [
    ('{"version": 1, "version": 1, "records": []}', "version: appears twice in one object"),
    ('{"version": 1, "records": ' + "[" * 200_000 + "]" * 200_000 + "}", "line 1: arrays or objects nested too deeply"),
    ('{"version": 1,\n "records": [1e999999]}', "records[0]: expected an object"),
    ('{"version": 1,\n "records": [}', "line 2, column 14: not JSON"),
    ('{"version": 1, "records": [' + "9" * 5000 + "]}", "not JSON a results file holds"),
])
def test_json_that_python_reads_but_no_results_file_holds_is_refused(text, fragment, tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(text)
    assert main(["compare", str(path), str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and fragment in err, err


def test_a_run_named_twice_is_refused_not_counted_once(sample_views, tmp_path, capsys):
    doc = _doc(sample_views)
    doc["records"].append(dict(doc["records"][0], verdict="error"))
    (tmp_path / "r.json").write_text(json.dumps(doc))
    assert main(["compare", str(tmp_path / "r.json"), str(tmp_path / "r.json")]) == 2
    name = doc["records"][0]["name"]
    assert (f"records[{len(doc['records']) - 1}] (run '{name}'): name: the run is in the file twice: records[0] has "
            "it too") in capsys.readouterr().err


def test_a_fifo_a_folder_and_a_huge_file_are_refused_before_reading(sample_views, tmp_path, capsys):
    write_results(tmp_path / "base.json", sample_views)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.json"
    with huge.open("wb") as f:  # sparse: as large as the limit says, without the disk
        f.truncate(FILE_LIMIT + 1)
    for path, fragment in ((fifo, "not a regular file"), (tmp_path, "not a regular file"),
                           (huge, f"{FILE_LIMIT + 1} bytes, more than the 256 MiB")):
        start = time.monotonic()
        assert main(["compare", str(tmp_path / "base.json"), str(path)]) == 2
        assert fragment in capsys.readouterr().err and time.monotonic() - start < 5


def test_a_results_file_the_harness_wrote_still_reads_whole(sample_views, tmp_path):
    write_results(tmp_path / "r.json", sample_views)
    views, _ = read_results(tmp_path / "r.json")
    assert views == [dataclasses.replace(v, duration_s=0.0) for v in sample_views]


def test_a_field_added_to_a_view_is_checked_by_its_annotation(sample_views):
    # the schema is the views' own annotations: a mismatch's ``found_in`` (int | None) refuses a string
    doc = _doc(sample_views)
    d = _first_diverging(doc)
    doc["records"][d]["first"]["found_in"] = "slot 3"
    with pytest.raises(ResultsFileError, match=r"first\.found_in: expected an integer, got the string 'slot 3'"):
        check_document(doc)
    doc["records"][d]["first"]["found_in"] = None
    check_document(doc)


def test_the_schema_spells_no_expectation_as_the_cases_do():
    from harness.check.matrix.case import NO_EXPECTATION
    from harness.report import results_schema

    assert results_schema.NO_EXPECTATION == NO_EXPECTATION


# ---- what a review must catch -------------------------------------------------------------------------


@pytest.mark.slow
def test_an_expectation_edited_to_hide_a_new_divergence_is_headlined_and_fails_the_command(sample_views, tmp_path):
    # the user's path: two results files, the command in a subprocess, its exit status and its first lines
    match = pick(sample_views, MATCH_E)
    pad = pick(sample_views, PAD)
    masked = dataclasses.replace(match, verdict="diverge", expected="diverge", first=pad.first, details=pad.details[:2],
                                 mismatches=4, mismatched_slots=2, why="padded rows now expected to diverge")
    moved = dataclasses.replace(pad, first=pad.details[1], details=pad.details[1:])
    write_results(tmp_path / "base.json", [match, pad])
    write_results(tmp_path / "head.json", [masked, moved])
    done = subprocess.run([sys.executable, "-m", "harness", "compare", "base.json", "head.json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1] == "  1 masked regression, 1 divergence moved, 0 unchanged"
    assert lines[2].startswith("MASKED REGRESSION: 1 run matched in BASE, fails in HEAD, and reads as expected")
    assert lines[3:8] == [
        "  forward_batch x full: 1 run",
        f"    {MATCH_E}: match -> diverge, mismatches 0 -> 4",
        f"      BASE expected match: {match.why}",
        "      HEAD expected diverge: padded rows now expected to diverge",
        f"      HEAD: {first_divergence_sentence(masked)}",
    ]
    assert lines[8].startswith("  DIVERGENCE MOVED") and lines[-1].startswith("1 change for the worse")


def _regressions(view, n: int, *, design: str, mode: str) -> tuple[list, list]:
    base = [dataclasses.replace(view, name=f"s{i:02}[{design}-{mode}-torch_native]", scenario=f"s{i:02}",
                                design=design, mode=mode) for i in range(n)]
    head = [dataclasses.replace(v, verdict="diverge", mismatches=i + 1, mismatched_slots=1) for i, v in enumerate(base)]
    return base, head


def test_regressions_of_one_design_and_mode_are_one_line_with_their_count_and_mismatches(sample_views, tmp_path):
    match = pick(sample_views, MATCH_E)
    base, head = _regressions(match, 22, design="metadata", mode="full")
    b2, h2 = _regressions(match, 1, design="translate", mode="eager")
    page = compare_page([*base, *b2], [*head, *h2], base_label="BASE", head_label="HEAD")
    assert page.exit_status == 1 and [(g.design, g.mode, len(g.rows)) for g in page.worse_groups] == [
        ("metadata", "full", 22), ("translate", "eager", 1)]
    lines = summary_text(page).splitlines()
    assert lines[2:5] == [
        f"  REGRESSED            metadata x full: 22 runs, match -> diverge, mismatches 0 -> {sum(range(1, 23))}",
        f"{'':23}s00, s01, s02, s03, s04, s05 and 16 more",
        f"  REGRESSED            s00[translate-eager-torch_native]: match (expected match) -> diverge (expected match), "
        "mismatches 0 -> 1",
    ]
    assert len(lines) == 7 and "verdict changed" not in "\n".join(lines)

    write_results(tmp_path / "base.json", [*base, *b2])
    write_results(tmp_path / "head.json", [*head, *h2])
    assert main(["compare", str(tmp_path / "base.json"), str(tmp_path / "head.json"), "--report-dir",
                 str(tmp_path / "cmp")]) == 1
    tags = elements(tmp_path / "cmp" / "compare.html").tags
    groups = [(a["data-group"], a["data-runs"], "open" in a) for t, a in tags if t == "details" and "data-group" in a]
    assert groups == [("regressed:metadata:full", "22", False), ("regressed:translate:eager", "1", True)]
    page_text = (tmp_path / "cmp" / "compare.html").read_text()
    assert "also: verdict changed" not in page_text and 'data-mismatches="22"' in page_text


# ---- versions, older files, and a report that cannot be written whole ----------------------------------

@pytest.mark.parametrize("version, fragment", [
    (1.0, "version: expected a results document version, the integer 1, got the number 1.0"),
    (True, "version: expected a results document version, the integer 1, got true"),
    ("1", "version: expected a results document version, the integer 1, got the string '1'"),
    (0, "version: expected a results document version from 1 to 1, got the number 0"),
    (2, "version: written by a newer harness (version 2); this one reads versions up to 1"),
])
def test_a_version_is_compared_by_type_and_value_and_a_newer_one_is_named(version, fragment, sample_views, tmp_path,
                                                                         capsys):
    doc = _doc(sample_views)
    doc["version"] = version
    (tmp_path / "v.json").write_text(json.dumps(doc))
    assert main(["compare", str(tmp_path / "v.json"), str(tmp_path / "v.json")]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1, err


def test_a_record_version_of_1_0_is_refused_too(sample_views, tmp_path, capsys):
    doc = _doc(sample_views)
    doc["records"][0]["version"] = 1.0
    (tmp_path / "v.json").write_text(json.dumps(doc))
    assert main(["compare", str(tmp_path / "v.json"), str(tmp_path / "v.json")]) == 2
    assert "): version: expected a record version, the integer 1, got the number 1.0" in capsys.readouterr().err


def _as_an_older_harness_wrote_it(doc: dict) -> dict:
    """``doc`` without the fields added to records after version 1's first release (README: they still read)."""
    for r in doc["records"]:
        for key in ("clean_rerun", "setup", "steps", "heat", "references"):
            r.pop(key, None)
        for m in [*r["details"], *([r["first"]] if r["first"] else [])]:
            m.pop("holder", None)
            m.pop("found_in", None)
        if r["error"]:
            r["error"].pop("frames", None)
        if r["graph"]:
            r["graph"].pop("rerun_ops", None)
            r["graph"].pop("notes", None)
    return doc


def test_a_results_file_of_an_older_harness_reads_with_its_missing_fields_defaulted(sample_views, tmp_path, capsys):
    write_results(tmp_path / "head.json", sample_views)
    (tmp_path / "old.json").write_text(json.dumps(_as_an_older_harness_wrote_it(_doc(sample_views))))
    views, _ = read_results(tmp_path / "old.json")
    by_name = {v.name: v for v in views}
    assert by_name[PAD_CLEAN].clean_rerun and not by_name[PAD].clean_rerun  # from the -nofault name
    assert main(["compare", str(tmp_path / "old.json"), str(tmp_path / "head.json")]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.rstrip().endswith("nothing changed for the worse")


def test_a_run_name_with_a_lone_surrogate_gives_a_whole_report(sample_views, tmp_path, capsys):
    # JSON may hold "\udcff", a string Python keeps and UTF-8 cannot encode: the report escapes it visibly
    write_results(tmp_path / "base.json", sample_views)
    text = (tmp_path / "base.json").read_text()
    assert f'"{MATCH_A}"' in text
    (tmp_path / "head.json").write_text(text.replace(f'"{MATCH_A}"', f'"{MATCH_A[:-1]}\\udcff]"'))
    code = main(["compare", str(tmp_path / "base.json"), str(tmp_path / "head.json"), "--report-dir",
                 str(tmp_path / "cmp")])
    out, err = capsys.readouterr()
    assert code == 0 and err == "", err  # the renamed run is added (as expected) and its old name removed
    assert out.splitlines()[-1].startswith("KV compare: ")
    assert "\\udcff" in (tmp_path / "cmp" / "compare.html").read_text()
    assert {"index.html", "compare.html", "results.json", "results.csv"} <= {p.name for p in (tmp_path / "cmp").iterdir()}


@pytest.mark.slow  # a child under a file-size limit: seconds (tests/README.md, "By cost")
def test_a_compare_report_that_does_not_fit_leaves_the_earlier_one_whole(sample_views, tmp_path):
    # a file-size limit stands in for a full disk; the comparison's pages and HEAD's land together or not at all
    import resource

    write_results(tmp_path / "base.json", sample_views)
    earlier = tmp_path / "cmp"
    earlier.mkdir()
    (earlier / "index.html").write_text("an earlier report")

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))

    # no bytecode written under the limit: a .pyc cut short there would break every later import of the module
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-m", "harness", "compare", "base.json", "base.json", "--report-dir", "cmp"],
                          cwd=tmp_path, capture_output=True, text=True, preexec_fn=limit, timeout=300, env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == "--report-dir cmp: the report was not written: File too large"
    assert done.stdout.rstrip().endswith("nothing changed for the worse")  # the summary still came
    assert sorted(p.relative_to(tmp_path).as_posix() for p in earlier.rglob("*")) == ["cmp/index.html"]
    assert (earlier / "index.html").read_text() == "an earlier report"

"""The HTML report from a real small run: what each page says, escaping, file names, files on disk.

The browser test (``test_browser.py``) checks the same pages as a browser runs them; these tests read
the files and the page view models, and need nothing but Python.
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
import re
from pathlib import Path

import pytest

from harness.report.html import (
    json_for_script,
    render_index,
    render_scenario,
    write_report,
)
from harness.report.pages import index_page
from harness.report.paths import page_names, safe_stem
from harness.report.records import read_results
from harness.report.scenario_page import run_anchors, scenario_page
from harness.report.slots import first_divergence_sentence, slot_map
from harness.report.views import CaseView, ErrorView, MismatchView

from ._hostile import EVIL, EVIL_RID, elements, hostile
from ._samples import MANY_DESIGNS, many_unexpected, pick, with_expected

PAD = "tiny_pad_tail[forward_batch-full-torch_native]"
WINDOW = "tiny_wrong_window[forward_batch-eager-torch_native]"
ERROR = "tiny_stale_error[stale_state-eager-torch_native]"
ENV = {"harness": "0", "torch": "0", "flashinfer": "0", "python": "3"}


@pytest.fixture(scope="module")
def report(sample_views, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    write_report(out, sample_views, environment=ENV, duration_s=1.5, command="python -m harness run", generated=None)
    return out


def _pages(report: Path) -> list[Path]:
    return sorted((report / "scenarios").glob("*.html"))


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


# ---- what the pages hold ------------------------------------------------------------------------------


def test_report_folder_holds_index_a_page_per_scenario_and_the_results(report, sample_views):
    assert sorted(p.name for p in report.iterdir()) == ["index.html", "results.csv", "results.json", "scenarios"]
    assert [p.stem for p in _pages(report)] == sorted({v.scenario for v in sample_views})
    views, doc = read_results(report / "results.json")
    assert views == list(sample_views) and doc["duration_s"] == 1.5
    csv_rows = _text(report / "results.csv").splitlines()
    assert len(csv_rows) == len(sample_views) + 1 and csv_rows[0].startswith("name,scenario,design,mode")


def test_index_has_the_matrix_counts_links_and_settings_of_the_run(report, sample_views):
    page = _text(report / "index.html")
    tags = elements(report / "index.html").tags
    rows = [a for t, a in tags if t == "tr" and "data-run" in a]
    assert len(rows) == len(sample_views)
    assert {a["data-verdict"] for a in rows} == {"match", "diverge", "error"}
    assert sum(t == "tr" and "data-matrix-row" in a for t, a in tags) == 4
    cells = [a for t, a in tags if t == "td" and "data-cell" in a]
    assert len(cells) == sum(not v.name.endswith("-nofault]") for v in sample_views)
    hrefs = {a["href"] for t, a in tags if t == "a" and "href" in a}
    for name in ("tiny_match", "tiny_pad_tail", "tiny_stale_error", "tiny_wrong_window"):
        assert any(h.startswith(f"scenarios/{name}.html") for h in hrefs)
    assert 'id="all-expected"' in page and 'id="unexpected"' not in page
    counts = {a["data-count"]: a for t, a in tags if t == "div" and "data-count" in a}
    assert set(counts) == {"runs", "ok", "unexpected", "match", "diverge", "invariant", "error", "skipped"}
    for key in ("torch", "flashinfer", "device", "engine", "seeds", "duration", "command"):
        assert f"<th>{key}</th>" in page
    assert "1.5 s" in page and "generated" not in page  # no timestamp unless the caller gives one


def test_unexpected_results_come_first_and_cannot_be_missed(sample_views, tmp_path):
    views = [with_expected(v, "match") if v.name == PAD else v for v in sample_views]
    index = write_report(tmp_path, views, environment=ENV, generated=None)
    page = _text(index)
    banner = page.index('id="unexpected"')
    assert banner < page.index('id="matrix"') < page.index('id="runs"')
    assert PAD in page[banner:page.index('id="matrix"')]
    first_row = re.search(r'<tr data-run [^>]*>', page).group(0)
    assert 'data-status="unexpected"' in first_row and 'data-family="tiny_pad_"' in first_row
    assert re.search(r'<div class="count count-unexpected alarm" data-count="unexpected"><span class="n">1<', page)
    assert "(1 unexpected)" in page[:page.index("</title>")]
    scenario = _text(tmp_path / "scenarios" / "tiny_pad_tail.html")
    assert scenario.index("<strong>1 unexpected result</strong>") < scenario.index('id="designs"')
    assert re.search(r'<section class="card run st-unexpected[^>]*>\s*<details open>', scenario)


def test_many_unexpected_runs_make_a_short_banner_grouped_by_design_and_mode(sample_views, tmp_path):
    views = many_unexpected(sample_views)
    assert len(views) == 240 and sum(not v.ok for v in views) == 40
    index = write_report(tmp_path, views, environment=ENV, generated=None)
    page, tags = _text(index), elements(index).tags
    banner = page[page.index('id="unexpected"'):page.index('id="filters"')]
    assert page.index('id="unexpected"') < page.index('data-count="runs"') < page.index('id="matrix"') < page.index(
        'id="runs"')
    groups = [a for t, a in tags if t == "tr" and "data-unexpected-group" in a]
    # largest first, capped: the two groups left out are counted, and the full list is a link away
    assert [(g["data-design"], g["data-mode"], g["data-runs"]) for g in groups[:2]] == [
        ("metadata", "full", "22"), ("translate", "full", "10")]
    assert len(groups) == 8 and [g["data-runs"] for g in groups[2:]] == ["1"] * 6
    assert 'href="#design=metadata&amp;mode=full&amp;verdict=unexpected"' in banner
    assert "2 more in groups not shown here; the full list of 40 unexpected runs" in banner
    assert 'href="#verdict=unexpected" id="all-unexpected"' in banner
    assert banner.count("data-unexpected-run") == 8 and "and 21 more" in banner
    rows = [a for t, a in tags if t == "tr" and "data-run" in a]
    assert len(rows) == 240 and all(a["data-status"] == "unexpected" for a in rows[:40])
    assert 'data-page-size="100"' in page and 'id="runs-pager"' in page


def test_one_cause_under_every_design_is_one_banner_line_and_a_designs_own_bug_keeps_its_own(sample_views, tmp_path):
    # issue 26: a broken eviction policy errs under every design and mode (12 runs), one design diverges on its own
    views = [dataclasses.replace(v, expected=v.verdict) for v in many_unexpected(sample_views)]  # all as expected
    policy = ErrorView(type="ReferenceNotCertified", message="reference run failed: retained: swa slot 5: a@4 is "
                       "below what its request may retain", step=None)
    broken = [dataclasses.replace(v, expected="match", verdict="error", error=dataclasses.replace(
        policy, message=policy.message.replace("5", str(i))), first=None, details=())
        for i, v in enumerate(x for x in views if x.scenario in ("syn_020", "syn_021")) if i < 12]
    first = MismatchView(step=3, pool="swa", layer=0, slot=4, owner="a@3", what="k", classification="overwritten",
                         detail="holds another row")
    own = dataclasses.replace(views[-1], expected="match", verdict="diverge", first=first, details=(first,),
                              mismatches=1)
    replaced = {v.name: v for v in [*broken, own]}
    index = write_report(tmp_path, [replaced.get(v.name, v) for v in views], environment=ENV, generated=None)
    page, tags = _text(index), elements(index).tags
    groups = [a for t, a in tags if t == "tr" and "data-unexpected-group" in a]
    # by design and mode, the policy's 12 runs would fill ten lines ahead of the design's own bug
    assert [(g["data-design"], g["data-mode"], g["data-runs"]) for g in groups] == [
        (", ".join(MANY_DESIGNS), "eager, full", "12"), (own.design, own.mode, "1")]
    assert "one cause: error: ReferenceNotCertified: reference run failed: retained: swa slot #: a@# is below" in page


def test_expected_and_unexpected_verdicts_are_drawn_apart(sample_views, tmp_path):
    # an amber "diverge" the scenario expects read as a warning: expected cells and badges are neutral
    views = [with_expected(v, "match") if v.name == PAD else v for v in sample_views]
    index = write_report(tmp_path, views, environment=ENV, generated=None)
    cells = {(a["data-design"], a["data-mode"], a["data-status"]) for t, a in elements(index).tags
             if t == "td" and "data-cell" in a and a["data-verdict"] == "diverge"}
    assert cells == {("forward_batch", "full", "unexpected"), ("forward_batch", "eager", "ok")}
    page = _text(index)
    assert '<span class="badge obs obs-unexpected v-diverge">diverge</span>' in page
    assert '<span class="badge obs obs-ok v-diverge">diverge</span>' in page
    css = _text(index)[page.index("<style>"):page.index("</style>")]
    assert "table.matrix td.cell.st-ok:not(.v-match) { background: #f6f8fa;" in css
    scenario = _text(tmp_path / "scenarios" / "tiny_wrong_window.html")
    assert '<span class="badge obs obs-ok v-diverge">diverge</span>' in scenario
    assert 'class="badge v-diverge"' not in scenario.split('id="designs"')[1].split('id="timeline"')[0]


def test_an_error_run_shows_no_zero_tiles_and_names_the_capture_that_failed(sample_views, tmp_path):
    err = pick(sample_views, ERROR)
    pad = pick(sample_views, PAD)
    # the library's start-up failure: the full runner's capture raises before any step, nothing observed
    startup = dataclasses.replace(err, name="tiny_stale_error[stale_state-full-torch_native]", mode="full",
                                  setup=pad.setup, graph=None, steps=(), steps_compared=0,
                                  error=dataclasses.replace(err.error, step=None))
    page = scenario_page([err, startup], index_href="../index.html", anchors=run_anchors([err, startup]))
    by_mode = {s.row.mode: s for s in page.sections}
    # mismatches, slots, dummy-slot writes, the graph counters and the duration are all 0 here
    assert by_mode["eager"].stats == (("steps compared", "1"),) and by_mode["eager"].graph_stats == ()
    assert by_mode["full"].stats == () and by_mode["full"].graph_stats == ()
    assert by_mode["eager"].failed_in is None
    assert by_mode["full"].failed_in == (
        "failed in set-up, before the first step: while capturing the full runner's decode graphs (batch-size "
        "buckets 4, 2, captured largest first) at start-up, unless this scenario captures on demand")
    write_report(tmp_path, [err, startup], environment=ENV, generated=None)
    html = _text(tmp_path / "scenarios" / "tiny_stale_error.html")
    assert html.count("data-failed-capture") == 1 and '<span class="label">mismatches</span>' not in html


def test_diverging_scenario_page_states_where_and_draws_the_pictures(report, sample_views):
    path = report / "scenarios" / "tiny_pad_tail.html"
    page, tags = _text(path), elements(path).tags
    view = pick(sample_views, PAD)
    first = view.first
    assert (first.pool, first.classification) == ("swa", "overwritten")
    sentence = first_divergence_sentence(view)
    assert sentence.startswith(f"step {first.step}: SWA layer {first.layer} slot {first.slot}, which belongs to "
                               f"{first.owner}, was overwritten")
    assert "replayed the bucket-4 graph with 3 real rows" in sentence
    assert sentence in page
    figures = [a["data-figure"] for t, a in tags if t == "svg"]
    assert figures.count("timeline") == 1 and figures.count("heatmap") == 2 and figures.count("slotmap") == 2
    heat = [int(a["data-count"]) for t, a in tags if t == "rect" and "data-count" in a]
    assert sum(heat) == sum(h.count for h in view.heat if h.pool != "hidden") > 0
    firsts = [a for t, a in tags if t == "rect" and a.get("data-first") == "1"]
    assert [(f["data-slot"], f["data-status"], f["data-owner"]) for f in firsts] == [
        (str(first.slot), "overwritten", first.owner)]
    for finding in view.graph.findings:  # what the input audit said is on the page, each with its path
        assert f'data-finding="{finding.kind}"' in page and (finding.path or "") in page
    assert view.reproduce_pytest.replace("'", "&#39;") in page
    assert view.references == ("SGLang PR 24743",)  # the scenario's real-bug references, on its page
    assert re.search(r'<p class="references">Real bugs: <span class="reference">SGLang PR 24743</span></p>', page)
    bad_rows = [a for t, a in tags if t == "tr" and "data-class" in a]
    assert len(bad_rows) == len(view.details)
    for label in ("captures", "replays", "padded replays", "eager fallbacks"):
        assert f'<span class="label">{label}</span>' in page


def test_error_page_states_the_error_at_its_step_and_where_the_backend_raised_it(report, sample_views):
    page = _text(report / "scenarios" / "tiny_stale_error.html")
    view = pick(sample_views, ERROR)
    assert view.verdict == "error" and view.error.step == 1
    assert f"step 1: {view.error.type}: " in page
    assert '<span class="label">error</span>' in page
    # a built-in design's wrong SWA locations fail in the pool's write, reached through the backend: the
    # runner's and backend's frames and the raising one, none of the driver's or the scheduler's, each keyed
    # by its function (no line: records do not change when the harness's code moves)
    assert all(f.line == 0 for f in view.error.frames)
    frames = [f"{f.file} in {f.function}" for f in view.error.frames]
    assert frames[-1] == "harness/serving/pool.py in HybridSWAKVPool.set_kv_buffer", frames
    assert any(f.startswith("harness/backends/") and f.endswith(".write_kv") for f in frames)
    assert all(f.startswith(("harness/backends/", "harness/runners/")) for f in frames[:-1]), frames
    listed = page.split("data-frames>", 1)[1].split("</div>", 1)[0]
    assert [html.unescape(f) for f in re.findall(r"<code>([^<]*)</code>", listed)] == frames


def test_first_divergence_sentence_names_owner_and_holder():
    first = MismatchView(step=6, pool="swa", layer=0, slot=32, owner="d@9", what="kv", classification="overwritten",
                         detail="holds the K/V of c@11", holder="c@11")
    view = CaseView.from_record({**_blank_record(), "first": _as_record(first), "details": [_as_record(first)],
                                 "verdict": "diverge", "mismatches": 1})
    assert first_divergence_sentence(view) == (
        "step 6: SWA layer 0 slot 32, which belongs to d@9, holds the K/V of c@11 (overwritten)")
    misplaced = MismatchView(step=2, pool="full", layer=1, slot=7, owner="a@3", what="k", classification="misplaced",
                             detail="expected row found in slot 9", found_in=9)
    view = CaseView.from_record({**_blank_record(), "first": _as_record(misplaced), "verdict": "diverge"})
    assert first_divergence_sentence(view) == (
        "step 2: full layer 1 slot 7, which belongs to a@3, does not hold its K/V: the expected row sits in slot 9 "
        "(misplaced)")


def test_slot_map_replays_pool_ownership_from_the_timeline(sample_views):
    view = pick(sample_views, PAD)
    step = view.first.step
    states = {s.slot: s for s in slot_map(view, "swa", step)}
    assert len(states) == view.setup.swa_size and states[0].status == "dummy"
    assert states[view.first.slot].status == "overwritten" and states[view.first.slot].owner == view.first.owner
    written = {(t.rid, t.pos): t.slots[1] for s in view.steps if s.index <= step for t in s.written}
    evicted = {k for s in view.steps if s.index < step for k in s.evicted}
    finished = {rid for s in view.steps if s.index < step for rid in s.finished}
    held = {slot: f"{rid}@{pos}" for (rid, pos), slot in written.items()
            if (rid, pos) not in evicted and rid not in finished}
    assert {n: s.owner for n, s in states.items() if s.status not in ("free", "dummy")} == held


def test_timeline_records_buckets_padding_evictions_and_finishes(sample_views):
    view = pick(sample_views, PAD)
    steps = {s.index: s for s in view.steps}
    assert steps[0].kind == "extend" and [f.path for f in steps[0].forwards] == ["eager"]
    assert dict(steps[0].tokens) == {"a": 10, "b": 3, "c": 7, "d": 5}
    finished_b = next(s.index for s in view.steps if "b" in s.finished)
    after = steps[finished_b + 1]
    assert after.batch_size == 3 and [(f.path, f.rows, f.bucket) for f in after.forwards] == [("replay", 3, 4)]
    assert view.graph.padded_replays == sum(f.bucket > f.rows for s in view.steps for f in s.forwards if f.bucket)
    # a (10-token prompt, window 8) gives back its three oldest SWA slots right after the prefill
    assert [k for k in steps[0].evicted if k[0] == "a"] == [("a", 0), ("a", 1), ("a", 2)]
    assert sum(h.count for h in view.heat) == view.mismatches


def test_rendering_is_a_pure_function_of_the_views(sample_views):
    anchors = run_anchors(sample_views)
    pages = {(v.scenario, v.path): f"scenarios/{v.scenario}.html" for v in sample_views}
    make = lambda: render_index(index_page(sample_views, page_of=pages, anchors=anchors, environment=ENV))
    assert make() == make()
    group = [v for v in sample_views if v.scenario == "tiny_pad_tail"]
    one = render_scenario(scenario_page(group, index_href="../index.html", anchors=anchors))
    assert one == render_scenario(scenario_page(group, index_href="../index.html", anchors=anchors))


def test_a_results_file_written_before_timelines_and_clean_rerun_flags_still_renders(sample_views, tmp_path):
    old = []
    for v in sample_views:
        rec = v.to_record()
        for key in ("setup", "steps", "heat", "clean_rerun"):
            del rec[key]
        for m in [*rec["details"], *([rec["first"]] if rec["first"] else [])]:
            del m["holder"], m["found_in"]
        old.append(CaseView.from_record(json.loads(json.dumps(rec))))
    # such a file names a clean rerun only in its run name
    assert [v.clean_rerun for v in old] == [v.clean_rerun for v in sample_views]
    assert [v.name for v in old if v.clean_rerun] == [v.name for v in old if v.name.endswith("-nofault]")] != []
    write_report(tmp_path, old, environment=ENV)
    page = _text(tmp_path / "scenarios" / "tiny_pad_tail.html")
    assert "carries no timeline" in page and first_divergence_sentence(pick(old, PAD)) in page


# ---- escaping, file names, files -----------------------------------------------------------------------


def test_hostile_names_whys_and_messages_are_shown_never_obeyed(sample_views, tmp_path):
    views = [hostile(pick(sample_views, PAD), design="evil<design>\"'"), hostile(pick(sample_views, ERROR))]
    index = write_report(tmp_path, views, environment=ENV, command=EVIL)
    pages = _pages(tmp_path)
    assert len(pages) == 1
    for path, scripts in ((index, 2), (pages[0], 1)):
        raw = _text(path)
        parsed = elements(path)
        assert [t for t, _ in parsed.tags].count("script") == scripts, path
        assert not [t for t, _ in parsed.tags if t in ("img", "iframe", "object", "embed", "base")]
        assert not [k for _, attrs in parsed.tags for k in attrs if k.startswith("on")]
        assert "window.__pwned" not in "".join(parsed.scripts)
        for ch in ("\x1b", "\x00", "\u2028", "\u202e"):
            assert ch not in raw, (path, repr(ch))
        assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in raw and "\\x1b[31m" in raw
    data = json.loads(elements(index).scripts[0])
    assert {r["name"] for r in data["runs"]} == {v.name for v in views}  # embedded data round-trips exactly
    scenario = _text(pages[0])
    assert f"{EVIL_RID}@".replace("<", "&lt;").replace(">", "&gt;").replace('"', "&#34;").replace("'", "&#39;") in scenario


def test_json_for_script_cannot_close_its_element_or_break_a_line():
    value = {"k": "</script><script>alert(1)</script><!-- & \u2028\u2029 \x00", "<key>": [1, "&amp;"]}
    text = str(json_for_script(value))
    for ch in ("<", ">", "&", "\u2028", "\u2029", "\x00"):
        assert ch not in text
    assert json.loads(text) == value


@pytest.mark.parametrize("name", ["../../etc/passwd", "..", ".", ".hidden", "a/b", "a\\b", "", "index", "CON",
                                  "x" * 400, "scenario\x00name", "na\u0301me", "-rf"])
def test_page_names_cannot_leave_the_report_folder(name, tmp_path):
    stem = safe_stem(name)
    assert stem and re.fullmatch(r"[A-Za-z0-9_.-]+", stem) and ".." not in stem
    assert not stem.startswith((".", "-")) and len(stem) <= 100
    path = (tmp_path / "scenarios" / f"{stem}.html").resolve()
    assert path.parent == (tmp_path / "scenarios").resolve()
    assert (stem == name) == (re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name) is not None
                              and ".." not in name and name.lower() not in ("index", "con") and len(name) <= 80)


def test_distinct_scenarios_never_share_a_page():
    keys = [("a/b", "x.toml"), ("a_b", "y.toml"), ("A_B", "z.toml"), ("a_b", "w/y.toml")]
    names = page_names(keys)
    assert len({n.lower() for n in names.values()}) == len(keys)


def test_hostile_scenario_names_write_only_inside_the_report_folder(sample_views, tmp_path):
    out = tmp_path / "out"
    write_report(out, [hostile(v) for v in sample_views if v.scenario == "tiny_pad_tail"], environment=ENV)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files and all(p.resolve().is_relative_to(out.resolve()) for p in files)
    assert not [p for p in files if p.name.startswith(".")]  # no temporary file left behind


def test_report_files_get_the_users_normal_mode(sample_views, tmp_path):
    old = os.umask(0o027)
    try:
        write_report(tmp_path, [pick(sample_views, WINDOW)], environment=ENV)
    finally:
        os.umask(old)
    for path in (tmp_path / "index.html", tmp_path / "results.json", tmp_path / "scenarios" / "tiny_wrong_window.html"):
        assert path.stat().st_mode & 0o777 == 0o640, path


def _as_record(m: MismatchView) -> dict:
    return {f: getattr(m, f) for f in MismatchView.__slots__}


def _blank_record() -> dict:
    return {"name": "s[d-eager-b]", "scenario": "s", "path": "s.toml", "description": "", "tags": [], "design": "d",
            "mode": "eager", "backend": "b", "engine": "tape", "device": "cpu", "faults": [], "expected": "diverge",
            "verdict": "match", "why": "", "skip_reason": None, "mismatches": 0, "mismatched_slots": 0, "classes": [],
            "dummy_writes": 0, "steps_compared": 1, "first": None, "details": [], "error": None, "graph": None,
            "reproduce_pytest": "", "reproduce_cli": "", "duration_s": 0.0}


def test_an_invariant_verdict_is_counted_filtered_and_given_its_section(sample_views, tmp_path):
    error = pick(sample_views, ERROR).error
    broken = dataclasses.replace(
        pick(sample_views, ERROR), verdict="invariant",
        error=dataclasses.replace(error, type="InvariantViolation",
                                  message="free_but_owned: swa slot 3: a@0 owns it, and it is on the free list"),
    )
    views = tuple(broken if v.name == ERROR else v for v in sample_views)
    write_report(tmp_path, views, environment=ENV, duration_s=1.0, command="x", generated=None)
    index = _text(tmp_path / "index.html")
    assert 'count-invariant' in index and '<option value="invariant">invariant</option>' in index
    page = next(p for p in _pages(tmp_path) if "tiny_stale_error" in p.name)
    assert 'data-verdict="invariant"' in _text(page) and "free_but_owned: swa slot 3" in _text(page)


def test_ops_replayed_by_calling_them_again_and_engine_notes_are_shown(sample_views, tmp_path):
    from harness.report.text import graph_lines

    pad = pick(sample_views, PAD)
    graph = dataclasses.replace(pad.graph, rerun_ops=("mylib::fused_kernel",),
                                notes=("the guard at backend.py:12 cannot see the capture without CUDA",))
    views = tuple(dataclasses.replace(v, graph=graph) if v.name == PAD else v for v in sample_views)
    lines = graph_lines(graph)
    assert any("mylib::fused_kernel" in line and "calling them again" in line for line in lines)
    assert "note: the guard at backend.py:12 cannot see the capture without CUDA" in lines
    write_report(tmp_path, views, environment=ENV, duration_s=1.0, command="x", generated=None)
    page = next(p for p in _pages(tmp_path) if "tiny_pad_tail" in p.name)
    assert "<code>mylib::fused_kernel</code>" in _text(page) and "cannot see the capture" in _text(page)
    back = {v.name: v for v in read_results(tmp_path / "results.json")[0]}  # the fields travel through JSON
    assert back[PAD].graph.rerun_ops == ("mylib::fused_kernel",) and back[PAD].graph.notes == graph.notes

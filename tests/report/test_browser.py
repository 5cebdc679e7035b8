"""The report as a reviewer's browser runs it: headless Chromium over the DevTools protocol.

One browser for the module (``harness.report.browser``: a pipe, no port), pages from a real small run of
the sample scenarios. Each page must load with no console error, no uncaught exception and no request
but the file itself; the index's filter must hide what it filters out; a diverging scenario's page must
show its heatmaps, slot maps and first-divergence sentence, and link that divergence to the audit finding
that explains it; and a report made of hostile strings must run none of them. Skipped, with the reason, where no Chromium is installed (``make chromium`` installs it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.check.matrix.case import cases
from harness.check.matrix.matrix import run_case
from harness.report.browser import Chromium, find_chromium
from harness.report.build import case_view
from harness.report.html import write_report
from harness.report.slots import first_divergence_sentence
from harness.scenario import load_scenario

from ._hostile import hostile
from ._samples import SAMPLES, many_unexpected, pick

pytestmark = pytest.mark.slow  # a headless Chromium per module: seconds

PAD = "tiny_pad_tail[forward_batch-full-torch_native]"
ERROR = "tiny_stale_error[stale_state-eager-torch_native]"
ENV = {"harness": "0", "torch": "0", "flashinfer": "0", "python": "3"}


@pytest.fixture(scope="module")
def browser():
    if find_chromium() is None:
        pytest.skip("needs chromium: none on PATH or in $CHROMIUM (`make chromium` installs it with apt-get as root)")
    with Chromium(width=1400, height=900, timeout=30) as b:
        yield b


@pytest.fixture(scope="module")
def report(sample_views, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("browser-report")
    write_report(out, sample_views, environment=ENV, generated=None)
    return out


def visible_rows(page, selector: str) -> list[dict]:
    return page.evaluate(f"""Array.from(document.querySelectorAll({selector!r})).filter(r => !r.hidden &&
        r.getClientRects().length > 0).map(r => Object.assign({{}}, r.dataset))""")


def choose(page, select_id: str, value: str) -> None:
    page.evaluate(f"""(() => {{ const s = document.getElementById({select_id!r}); s.value = {value!r};
        s.dispatchEvent(new Event("change")); }})()""")


def test_index_loads_cleanly_and_its_filter_hides_rows(browser, report, sample_views):
    page = browser.open(report / "index.html")
    assert page.problems() == []
    assert page.evaluate("document.querySelectorAll('table.matrix tr[data-matrix-row]').length") == 4
    assert len(visible_rows(page, "tr[data-run]")) == len(sample_views)

    choose(page, "f-verdict", "diverge")
    diverging = [v for v in sample_views if v.verdict == "diverge"]
    shown = visible_rows(page, "tr[data-run]")
    assert {r["verdict"] for r in shown} == {"diverge"} and len(shown) == len(diverging)
    assert page.evaluate("document.getElementById('filter-count').textContent") == (
        f"showing {len(diverging)} of {len(sample_views)} runs: {len(diverging)} diverge")
    assert {r["family"] for r in visible_rows(page, "tr[data-matrix-row]")} == {"tiny_pad_", "tiny_wrong_"}
    assert "verdict=diverge" in page.evaluate("location.hash")

    choose(page, "f-verdict", "")
    choose(page, "f-family", "tiny_pad_")
    choose(page, "f-mode", "full")
    assert {(r["family"], r["mode"]) for r in visible_rows(page, "tr[data-run]")} == {("tiny_pad_", "full")}
    assert len(visible_rows(page, "tr[data-matrix-row]")) == 1
    assert {r["mode"] for r in visible_rows(page, "table.matrix th[data-col]")} == {"full"}

    page.evaluate("document.getElementById('filter-form').reset()")
    page.evaluate("new Promise(done => setTimeout(done, 50))")
    assert len(visible_rows(page, "tr[data-run]")) == len(sample_views)
    assert page.problems() == []
    page.close()


def test_a_filtered_index_can_be_shared_as_a_link(browser, report, sample_views):
    page = browser.open(report / "index.html", fragment="verdict=error")
    assert page.evaluate("document.getElementById('f-verdict').value") == "error"
    assert [r["verdict"] for r in visible_rows(page, "tr[data-run]")] == ["error"]
    assert page.problems() == []
    page.close()


def test_diverging_scenario_page_shows_where_it_diverged(browser, report, sample_views):
    view = pick(sample_views, PAD)
    page = browser.open(report / "scenarios" / "tiny_pad_tail.html")
    assert page.problems() == []
    section = "section[data-run-section][data-verdict='diverge']"
    assert page.evaluate(f"document.querySelector(\"{section} details\").open") is True
    assert page.evaluate(f"document.querySelector(\"{section} [data-first-divergence]\").textContent").endswith(
        first_divergence_sentence(view))
    sizes = page.evaluate(f"""Array.from(document.querySelectorAll("{section} svg")).map(s => [s.dataset.figure,
        s.getBoundingClientRect().width > 100 && s.getBoundingClientRect().height > 20])""")
    assert sorted(sizes) == [["heatmap", True], ["heatmap", True], ["slotmap", True], ["slotmap", True]]
    assert page.evaluate("document.querySelectorAll('svg[data-figure=timeline] rect[data-first-divergence]').length") == 1
    hot = page.evaluate(f"""Array.from(document.querySelectorAll("{section} rect[data-count]"))
        .filter(r => +r.dataset.count > 0).length""")
    assert hot == len({(h.step, h.pool, h.layer) for h in view.heat if h.pool != "hidden"})
    first = page.evaluate(f"""(() => {{ const r = document.querySelector("{section} rect[data-first='1']");
        return [r.dataset.slot, r.dataset.owner, r.querySelector('title').textContent]; }})()""")
    assert first[:2] == [str(view.first.slot), view.first.owner] and first[2].startswith("the first divergence")

    # the bad-slot table sorts by a column when its header is clicked
    page.evaluate(f"""document.querySelectorAll("{section} table.bad-slots th")[3].click()""")
    slots = page.evaluate(f"""Array.from(document.querySelectorAll("{section} table.bad-slots tbody tr"))
        .map(r => +r.cells[3].textContent)""")
    assert slots == sorted(slots) and len(slots) == len(view.details)
    assert page.problems() == []
    page.close()


def test_a_report_of_hostile_strings_runs_none_of_them(browser, sample_views, tmp_path):
    views = [hostile(pick(sample_views, PAD), design="evil<img src=x onerror=alert(1)>"),
             hostile(pick(sample_views, ERROR))]
    index = write_report(tmp_path, views, environment=ENV)
    for path in (index, next((tmp_path / "scenarios").glob("*.html"))):
        page = browser.open(path)
        assert page.evaluate("typeof window.__pwned") == "undefined"
        assert page.evaluate("document.querySelectorAll('script').length") == (2 if path == index else 1)
        assert page.evaluate("document.querySelectorAll('img').length") == 0
        assert page.problems() == [], path  # a blocked inline script would show here as a CSP error
        page.close()


def test_a_report_of_many_unexpected_runs_keeps_the_matrix_in_view_and_pages_the_runs(browser, sample_views, tmp_path):
    views = many_unexpected(sample_views)  # 240 runs, 40 unexpected, 22 of them metadata x full
    page = browser.open(write_report(tmp_path, views, environment=ENV, generated=None))
    assert page.problems() == []
    assert page.evaluate("document.getElementById('matrix').getBoundingClientRect().top") < 900  # the viewport
    # expected cells neutral, unexpected ones bold and red-bordered
    style = """(sel => { const c = document.querySelector(sel), a = c.querySelector('a');
        return [getComputedStyle(c).backgroundColor, getComputedStyle(a).fontWeight, getComputedStyle(c).boxShadow]; })"""
    ok = page.evaluate(f"{style}('td[data-cell][data-status=ok]')")
    bad = page.evaluate(f"{style}('td[data-cell][data-status=unexpected]')")
    assert ok[0] == "rgb(255, 255, 255)" and ok[1] == "400" and ok[2] == "none"
    assert bad[1] == "700" and "rgb(207, 34, 46)" in bad[2]

    pager = "document.getElementById('runs-page').textContent"
    assert len(visible_rows(page, "tr[data-run]")) == 100 and page.evaluate(pager) == "rows 1\u2013100 of 240"
    assert {r["status"] for r in visible_rows(page, "tr[data-run]")[:40]} == {"unexpected"}
    page.evaluate("document.getElementById('runs-next').click()")
    page.evaluate("document.getElementById('runs-next').click()")
    assert len(visible_rows(page, "tr[data-run]")) == 40 and page.evaluate(pager) == "rows 201\u2013240 of 240"
    page.evaluate("document.getElementById('runs-all').click()")
    assert len(visible_rows(page, "tr[data-run]")) == 240

    # a banner group links to its runs: the filter set, the table filtered and in view
    page.evaluate("document.querySelector('tr[data-unexpected-group] a[data-filter-link]').click()")
    assert [page.evaluate(f"document.getElementById('{s}').value") for s in ("f-design", "f-mode", "f-verdict")] == [
        "metadata", "full", "unexpected"]
    shown = visible_rows(page, "tr[data-run]")
    assert len(shown) == 22 and {(r["design"], r["mode"], r["status"]) for r in shown} == {
        ("metadata", "full", "unexpected")}
    assert page.evaluate("document.getElementById('runs-pager').hidden") is True
    assert 0 <= page.evaluate("document.getElementById('runs-table').getBoundingClientRect().top") < 900
    page.evaluate("document.getElementById('all-unexpected').click()")
    assert len(visible_rows(page, "tr[data-run]")) == 40 and page.evaluate(
        "document.getElementById('f-design').value") == ""
    assert page.problems() == []
    page.close()


def test_the_first_divergence_links_to_the_audit_finding_that_explains_it(browser, tmp_path, monkeypatch):
    # one run of a planted design (a second): its decode graph replays SWA locations frozen at capture
    monkeypatch.syspath_prepend(str(SAMPLES))
    scenario = load_scenario(SAMPLES / "tiny_planted.toml")
    case = next(c for c in cases(scenario) if c.design.endswith(":frozen_translation"))
    write_report(tmp_path, [case_view(run_case(case))], environment=ENV)
    page = browser.open(tmp_path / "scenarios" / "tiny_planted.html")
    assert page.problems() == []
    page.evaluate("document.querySelector('[data-first-divergence] a[data-cause-link]').click()")
    target = page.evaluate("""(() => { const t = document.querySelector(':target'); const r = t.getBoundingClientRect();
        return [t.tagName, t.dataset.finding, 'explains' in t.dataset, r.top >= 0 && r.bottom <= innerHeight]; })()""")
    assert target == ["TR", "stale", True, True]  # the finding's row of the input audit, scrolled into view
    beside = page.evaluate("document.querySelector('[data-first-divergence] + [data-cause]').textContent")
    assert "pool._frozen_swa_loc" in beside
    assert page.problems() == []
    page.close()

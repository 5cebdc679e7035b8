"""The HTML renderer: page view models (``pages.py``) through Jinja2 templates into self-contained files.

Each page carries its stylesheet and script inline and its pictures as inline SVG, so a report attached
to a code review opens anywhere and requests nothing. A Content-Security-Policy in every page forbids
any fetch, and lets only the page's own script run (by hash): were an escaping bug ever to let markup
from a scenario file through, it still could not execute.

Every string reaching a page passes through autoescaping, after ``printable`` has made control
characters visible; data embedded for the page's script is JSON with ``<``, ``>``, ``&`` and the line
separators escaped, so no string can close the ``<script>`` element that holds it.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup, escape

from .figures import Figure
from .files import PAGES_DIR, ReportFolder
from .matrix import results_csv
from .pages import VERDICTS, IndexPage, index_page
from .paths import page_names
from .records import environment as current_environment
from .records import document_text, results_document
from .scenario_page import BadRow, ScenarioPage, run_anchors, scenario_page
from .text import printable
from .views import CaseView

RUNS_PAGE_SIZE = 100
"""rows of the index's runs table shown at once (the library has well over a thousand runs)"""

SCENARIO_DIR = PAGES_DIR
"""scenario pages live in this subfolder of the report folder"""


def json_for_script(value: Any) -> Markup:
    """``value`` as JSON that is safe inside ``<script>``: nothing in it can end the element or the line."""
    text = json.dumps(value, ensure_ascii=True, separators=(",", ":"))
    for raw, escaped in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e")):
        text = text.replace(raw, escaped)
    # ensure_ascii already wrote U+2028/U+2029 as escapes; said here so that changing it breaks a test, not a page
    return Markup(text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _finalize(value: Any) -> Any:
    # every {{ }} passes here before autoescaping: strings from files and exceptions show their control
    # characters instead of carrying them into the page
    if value is None:
        return ""
    if isinstance(value, Markup) or not isinstance(value, str):
        return value
    return printable(value, keep_newlines=True)


def _attr(value: Any) -> str:
    """One ``{{ value }}`` of a template: finalized, then escaped (numbers print as themselves)."""
    kind = type(value)
    if kind in _NUMBERS:
        return str(value)
    # most values are names and labels that neither finalizing nor escaping changes
    if kind is str and value.isprintable() and _ESCAPED.search(value) is None:
        return value
    return str(escape(_finalize(value)))


_NUMBERS = frozenset({int, float, bool})
_ESCAPED = re.compile("[&<>\"']")
"""the characters ``markupsafe.escape`` replaces"""


def svg_figure(f: Figure) -> Markup:
    """A figure as inline SVG, every value finalized and escaped as a template's are. Written here rather than as
    a template macro: the library's pages hold hundreds of thousands of shapes, and a macro cost twenty template
    expressions per shape (a third of the time a report took to write)."""
    a = _attr
    out = [f'<svg class="fig fig-{a(f.name)}" data-figure="{a(f.name)}" role="img" aria-label="{a(f.label)}" '
           f'width="{a(f.width)}" height="{a(f.height)}" viewBox="0 0 {a(f.width)} {a(f.height)}" '
           'xmlns="http://www.w3.org/2000/svg">\n']
    for s in f.shapes:
        title = f"<title>{a(s.title)}</title>" if s.title else ""
        dash = f' stroke-dasharray="{a(s.dash)}"' if s.dash else ""
        if s.kind == "rect":
            stroke = f' stroke="{a(s.stroke)}" stroke-width="{a(s.stroke_width)}"' if s.stroke else ""
            data = "".join(f' data-{a(k)}="{a(v)}"' for k, v in s.data)
            out.append(f'<rect x="{a(s.x)}" y="{a(s.y)}" width="{a(s.w)}" height="{a(s.h)}" rx="{a(s.rx)}" '
                       f'fill="{a(s.fill)}"{stroke}{dash}{data}>{title}</rect>\n')
        elif s.kind == "line":
            out.append(f'<line x1="{a(s.x)}" y1="{a(s.y)}" x2="{a(s.x + s.w)}" y2="{a(s.y + s.h)}" '
                       f'stroke="{a(s.stroke)}" stroke-width="{a(s.stroke_width)}"{dash}/>\n')
        else:
            out.append(f'<text x="{a(s.x)}" y="{a(s.y)}" text-anchor="{a(s.anchor)}" font-size="{a(s.size)}" '
                       f'font-weight="{a(s.weight)}" fill="{a(s.fill)}">{title}{a(s.text)}</text>\n')
    out.append("</svg>")
    return Markup("".join(out))


def bad_rows(rows: Sequence[BadRow]) -> Markup:
    """The rows of a run's bad-slots table, written here for the reason ``svg_figure`` is: a run can list
    thousands of slots, and each row cost ten template expressions. Rows after the first are indented as the
    template's line that holds them is."""
    a = _attr
    return Markup("\n    ".join(
        f'<tr data-class="{a(b.classification)}"><td>{a(b.step)}</td><td>{a(b.pool)}</td>'
        f'<td>{"" if b.layer is None else a(b.layer)}</td><td>{"" if b.slot is None else a(b.slot)}</td>'
        f'<td><code>{a(b.owner)}</code></td><td>{a(b.observed)}</td>'
        f'<td><span class="badge c-{a(b.classification)}">{a(b.classification)}</span></td><td>{a(b.what)}</td></tr>'
        for b in rows))


def _asset(name: str) -> str:
    return (resources.files(__package__) / "static" / name).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader(__package__, "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        finalize=_finalize,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    script = _asset("report.js")
    env.globals.update(
        css=Markup(_asset("report.css")),
        script=Markup(script),
        script_hash="'sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode() + "'",
    )
    env.filters["json_script"] = json_for_script
    env.filters["svg"] = svg_figure
    env.filters["bad_rows"] = bad_rows
    return env


def render(template: str, **context: Any) -> str:
    return _environment().get_template(template).render(**context)


def render_index(page: IndexPage) -> str:
    return render("index.html.j2", page=page, verdicts=VERDICTS, page_size=RUNS_PAGE_SIZE)


def render_scenario(page: ScenarioPage) -> str:
    return render("scenario.html.j2", page=page)


def now_label() -> str:
    return dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")


def report_pages(views: Sequence[CaseView]) -> tuple[dict[tuple[str, str], str], dict[str, str]]:
    """(scenario key -> page path relative to the report folder, run name -> anchor)."""
    names = page_names((v.scenario, v.path) for v in views)
    return {key: f"{SCENARIO_DIR}/{name}" for key, name in names.items()}, run_anchors(views)


def write_report(
    directory: Path,
    views: Sequence[CaseView],
    *,
    environment: Mapping[str, str] | None = None,
    duration_s: float | None = None,
    complete: bool = True,
    command: str | None = None,
    generated: str | None = None,
    compare_href: str | None = None,
    load_errors: Sequence[str] = (),
    document: dict[str, Any] | None = None,
    extra: Mapping[str, str] | None = None,
) -> Path:
    """Write ``index.html``, one page per scenario under ``scenarios/``, ``results.json`` and ``results.csv``
    into ``directory``, and remove the pages of an earlier report there; the index's path. ``document``: a
    results document to write as it is (a report rendered from a results file keeps that file's
    environment), else one is made from ``views``. ``extra``: more top-level files (``compare.html``) that
    belong to this report, written with it. Nothing lands unless everything does (``ReportFolder``)."""
    directory = Path(directory)
    env = dict(environment if environment is not None else current_environment())
    pages, anchors = report_pages(views)
    groups: dict[tuple[str, str], list[CaseView]] = {}
    for v in views:
        groups.setdefault((v.scenario, v.path), []).append(v)
    with ReportFolder(directory) as folder:  # writes inside the folder only
        for key, group in groups.items():
            page = scenario_page(group, index_href="../index.html", anchors=anchors)
            folder.write(pages[key], render_scenario(page))
        doc = document if document is not None else results_document(views, complete=complete, duration_s=duration_s)
        folder.write("results.json", document_text(doc))
        folder.write("results.csv", results_csv(views))
        for name, text in (extra or {}).items():
            folder.write(name, text)
        index = index_page(views, page_of=pages, anchors=anchors, environment=env, duration_s=duration_s,
                           complete=complete, command=command, generated=generated, compare_href=compare_href,
                           load_errors=load_errors)
        path = folder.write("index.html", render_index(index))  # last: the index links to pages that exist by now
        folder.remove_stale(keep=[compare_href] if compare_href else ())  # one report per folder, at the commit
    return path

"""The report's fast paths give what the general code they replace gave: records as ``dataclasses.asdict`` made
them, ``results.json`` that parses to the same document, text escaped as the per-character loop escaped it,
and figures as the template macro that used to draw them wrote them, byte for byte, hostile strings included."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections import namedtuple

import jinja2
import pytest
from markupsafe import Markup

from harness.report import html
from harness.report.figures import Figure, Shape
from harness.report.records import document_text, results_document
from harness.report.scenario_page import BadRow, run_anchors, scenario_page
from harness.report.text import printable
from harness.report.views import plain

from ._hostile import EVIL, EVIL_RID, hostile


class _Colour(enum.Enum):
    RED = "red"


_Pair = namedtuple("_Pair", "a b")


@dataclasses.dataclass(frozen=True)
class _Inner:
    pair: _Pair
    colour: _Colour
    items: list
    table: dict


@dataclasses.dataclass
class _Outer:
    inner: _Inner
    many: tuple
    none: None = None


def test_plain_is_asdict_for_every_view_and_for_what_views_never_hold(sample_views):
    for view in sample_views:
        assert plain(view) == dataclasses.asdict(view)
        assert json.dumps(plain(view)) == json.dumps(dataclasses.asdict(view))
    odd = _Outer(inner=_Inner(pair=_Pair(1, [2.5, "x"]), colour=_Colour.RED, items=[(1, 2), {"k": [3]}],
                              table={"a": _Pair("p", None), 3: True}),
                 many=(_Inner(pair=_Pair(0, 0), colour=_Colour.RED, items=[], table={}),) * 2)
    got, want = plain(odd), dataclasses.asdict(odd)
    assert got == want
    assert type(got["inner"]["pair"]) is _Pair and got["inner"]["colour"] is _Colour.RED
    # lists are copies, never the view's own (a record is edited after it is made)
    items = [1, 2]
    assert plain(_Inner(pair=_Pair(0, 0), colour=_Colour.RED, items=items, table={}))["items"] is not items


def test_results_text_parses_to_its_document_with_a_line_per_record(sample_views):
    views = [*sample_views, hostile(sample_views[1])]
    doc = results_document(views, duration_s=1.25)
    text = document_text(doc)
    assert json.loads(text) == json.loads(json.dumps(doc))
    assert list(json.loads(text)) == list(doc)  # the fields in their order
    lines = text.splitlines()
    records = lines[lines.index(' "records": [') + 1 : -2]
    assert len(records) == len(views)
    assert [json.loads(line.rstrip(",")) for line in records] == json.loads(json.dumps(doc["records"]))
    assert text.endswith("\n ]\n}\n")
    empty = {**doc, "records": []}
    assert json.loads(document_text(empty)) == empty
    assert json.loads(document_text({})) == {}


@pytest.mark.parametrize("keep_newlines", [False, True])
def test_printable_is_the_per_character_escape(keep_newlines):
    def by_character(text: str) -> str:
        return "".join(ch if ch.isprintable() or (keep_newlines and ch == "\n") else
                       ch.encode("unicode_escape").decode("ascii") for ch in text)

    texts = ["", "plain words", "a\nb", "\n", "\r\n", "tab\there", EVIL, EVIL_RID, "\u2028\u2029", "\x7f", "é ü 漢字",
             "\x1b[31mred\x1b[0m\n", "line\n\x00end", 12, 3.5, None, True]
    for text in texts:
        assert printable(text, keep_newlines=keep_newlines) == by_character(str(text))


# the macro that drew every figure before ``html.svg_figure`` (the templates' Jinja2 settings)
_MACRO = """{% macro figure(f) -%}
<svg class="fig fig-{{ f.name }}" data-figure="{{ f.name }}" role="img" aria-label="{{ f.label }}" width="{{ f.width }}" height="{{ f.height }}" viewBox="0 0 {{ f.width }} {{ f.height }}" xmlns="http://www.w3.org/2000/svg">
{% for s in f.shapes %}
{% if s.kind == "rect" %}
<rect x="{{ s.x }}" y="{{ s.y }}" width="{{ s.w }}" height="{{ s.h }}" rx="{{ s.rx }}" fill="{{ s.fill }}"{% if s.stroke %} stroke="{{ s.stroke }}" stroke-width="{{ s.stroke_width }}"{% endif %}{% if s.dash %} stroke-dasharray="{{ s.dash }}"{% endif %}{% for k, v in s.data %} data-{{ k }}="{{ v }}"{% endfor %}>{% if s.title %}<title>{{ s.title }}</title>{% endif %}</rect>
{% elif s.kind == "line" %}
<line x1="{{ s.x }}" y1="{{ s.y }}" x2="{{ s.x + s.w }}" y2="{{ s.y + s.h }}" stroke="{{ s.stroke }}" stroke-width="{{ s.stroke_width }}"{% if s.dash %} stroke-dasharray="{{ s.dash }}"{% endif %}/>
{% else %}
<text x="{{ s.x }}" y="{{ s.y }}" text-anchor="{{ s.anchor }}" font-size="{{ s.size }}" font-weight="{{ s.weight }}" fill="{{ s.fill }}">{% if s.title %}<title>{{ s.title }}</title>{% endif %}{{ s.text }}</text>
{% endif %}
{% endfor %}
</svg>
{%- endmacro %}"""


def _environment() -> jinja2.Environment:
    """The report templates' Jinja2 settings."""
    return jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, finalize=html._finalize,
                              trim_blocks=True, lstrip_blocks=True)


def _pages(sample_views):
    """The scenario pages of the sample views and of their hostile twins."""
    views = [*sample_views, *(hostile(v) for v in sample_views)]
    anchors = run_anchors(views)
    return [scenario_page([v for v in views if v.scenario == name], index_href="../index.html", anchors=anchors)
            for name in dict.fromkeys(v.scenario for v in views)]


def test_figures_are_drawn_as_the_macro_drew_them(sample_views):
    figures = []
    for page in _pages(sample_views):
        figures += [page.timeline] if page.timeline is not None else []
        figures += [p.figure for s in page.sections for p in (*s.heatmaps, *s.slotmaps)]
    evil = Figure(width=10.5, height=3, label=EVIL, name=EVIL_RID, shapes=(
        Shape(kind="rect", x=0, y=1.5, w=2, h=3, fill=EVIL, stroke=EVIL, dash="2 1", title=EVIL,
              data=((EVIL_RID, EVIL), ("slot", "3"))),
        Shape(kind="rect", x=0, y=0, stroke="", title="", dash=None),
        Shape(kind="line", x=1, y=2, w=-0.5, h=1e-9, stroke=None, dash=EVIL),
        Shape(kind="text", x=1, y=2, text=EVIL, title=EVIL, anchor=EVIL, weight=EVIL, size=7),
        Shape(kind="text", x=True, y=False, text="", title=None),
    ))
    figures.append(evil)
    assert len({f.name for f in figures}) >= 3  # timelines, heatmaps and slot maps, and the hostile one
    macro = _environment().from_string(_MACRO).module.figure
    for f in figures:
        drawn = html.svg_figure(f)
        assert isinstance(drawn, Markup)
        assert str(drawn) == str(macro(f))
    assert "<script>" not in str(html.svg_figure(evil))


def test_a_value_is_written_as_a_template_expression_writes_it():
    env = jinja2.Environment(autoescape=True, finalize=html._finalize)
    expression = env.from_string("{{ v }}")
    values = ["", "plain", "a&b", "<b>", '"q"', "it's", "tab\t", "a\nb", EVIL, EVIL_RID, "é 漢", "\u2028",
              Markup("<i>kept</i>"), 0, -3, 2.5, 1e-9, True, None, ("t", 1)]
    for v in values:
        assert html._attr(v) == expression.render(v=v), v


# the rows of the bad-slots table as the template wrote them before ``html.bad_rows``
_BAD_ROWS = """    {% for b in bad %}
    <tr data-class="{{ b.classification }}"><td>{{ b.step }}</td><td>{{ b.pool }}</td><td>{{ b.layer if b.layer is not none else "" }}</td><td>{{ b.slot if b.slot is not none else "" }}</td><td><code>{{ b.owner }}</code></td><td>{{ b.observed }}</td><td><span class="badge c-{{ b.classification }}">{{ b.classification }}</span></td><td>{{ b.what }}</td></tr>
    {% endfor %}
    </tbody>
"""


def test_bad_slot_rows_are_written_as_the_template_wrote_them(sample_views):
    tables = [s.bad for page in _pages(sample_views) for s in page.sections if s.bad]
    evil = BadRow(step=0, pool=EVIL, layer=None, slot=None, owner=EVIL_RID, observed=EVIL, classification=EVIL,
                  what="<kv>")
    tables += [(evil,), (evil, *tables[0])]
    assert sum(map(len, tables)) > 4 and any(b.layer is None for t in tables for b in t)
    env = _environment()
    env.filters["rows"] = html.bad_rows
    template, ours = env.from_string(_BAD_ROWS), env.from_string("    {{ bad|rows }}\n    </tbody>\n")
    for bad in tables:
        assert ours.render(bad=bad) == template.render(bad=bad)

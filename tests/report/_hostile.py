"""Case views whose every string from a file, an exception or a design name is an attack on the page."""

from __future__ import annotations

import json
import shlex
from html.parser import HTMLParser
from pathlib import Path

from harness.report.views import CaseView

EVIL = ("x\"><script>window.__pwned=1</script><img src=x onerror=\"window.__pwned=2\">'"
        "\x1b[31m\x00\u2028\u202e</script><!--")
EVIL_NAME = "../../evil/<script>alert(1)</script>\"'\x1b"
EVIL_RID = "r<b>\"'"


def hostile(view: CaseView, *, design: str | None = None) -> CaseView:
    """``view`` with hostile strings in its scenario name, path, description, why, tags, design, owners and
    holders, mismatch details, error message and frames, audit findings (and the graphs forwards replayed) and
reproduce lines."""
    rec = json.loads(json.dumps(view.to_record()))
    design = design or rec["design"]
    rec["scenario"] = EVIL_NAME
    rec["name"] = f"{EVIL_NAME}[{design}-{rec['mode']}-{rec['backend']}]"
    rec["design"] = design
    rec["path"] = f"scenarios/{EVIL_NAME}.toml"
    rec["description"] = rec["why"] = EVIL
    rec["tags"] = [EVIL]
    rec["reproduce_pytest"] = shlex.join(["pytest", f"{rec['path']}::{rec['name']}"])
    rec["reproduce_cli"] = shlex.join(["python", "-m", "harness", "run", rec["path"]])
    rid = None
    for m in [*rec["details"], *([rec["first"]] if rec["first"] else [])]:
        rid = m["owner"].rsplit("@", 1)[0]
        m["owner"] = f"{EVIL_RID}@{m['owner'].rsplit('@', 1)[1]}"
        m["detail"] = EVIL
        m["holder"] = f"{EVIL_RID}@0"
    if rec["error"]:
        rec["error"]["message"] = rec["error"]["type"] = EVIL
        for frame in rec["error"]["frames"]:
            frame["file"] = frame["function"] = EVIL
    if rec["graph"]:
        for f in rec["graph"]["findings"]:
            f["path"] = f["graph"] = f["captured"] = f["now"] = EVIL

    def ren(r: str) -> str:
        return EVIL_RID if r == rid else r

    for step in rec["steps"]:
        for forward in step["forwards"]:
            forward["graph"] = EVIL if forward["graph"] else None  # as the findings' graphs: the cause is shown too
        step["tokens"] = [[ren(r), n] for r, n in step["tokens"]]
        step["evicted"] = [[ren(r), p] for r, p in step["evicted"]]
        step["finished"] = [ren(r) for r in step["finished"]]
        step["written"] = [[ren(rid), *rest] for rid, *rest in step["written"]]
    return CaseView.from_record(rec)


class Elements(HTMLParser):
    """Every start tag of a page with its attributes, and the text of each ``<script>``."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._in_script = True
            self.scripts.append("")

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts[-1] += data


def elements(path: Path) -> Elements:
    parser = Elements()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser

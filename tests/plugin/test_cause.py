"""The cause beside the symptom, as a user meets it: ``python -m harness run`` on a tiny scenario of two planted
wrong designs (``samples/tiny_planted.toml``), once for the module (one subprocess, decode graphs only, about
five seconds on a loaded machine). One design freezes its SWA locations into the decode graph: the terminal
shows its failure block with the input audit's finding beside the first divergence, and its scenario page
links the divergence to that finding. The other raises ``KeyError``: the terminal, the JSON record and the
page say which line of the design raised it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness.cli import main
from harness.report.cause import first_divergence_cause
from harness.report.html import write_report
from harness.report.records import read_results, write_results
from harness.report.text import failure_block

from .conftest import SAMPLES, _write_scenario

pytestmark = pytest.mark.slow  # one CLI subprocess for the module

FROZEN = "tiny_planted[misbehaving_designs:frozen_translation-full-torch_native]"
MISSES_KEY = "tiny_planted[misbehaving_designs:misses_key-full-torch_native]"


def _design_line(marker: str) -> int:
    """The line of ``misbehaving_designs.py`` that holds ``marker``."""
    lines = (SAMPLES / "misbehaving_designs.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line)


KEY_LINE = _design_line("return _SWA_LOC_BY_LAYER[layer_id]")


@dataclasses.dataclass(frozen=True)
class PlantedRun:
    root: Path
    stdout: str
    returncode: int

    def records(self) -> dict[str, dict]:
        return {r["name"]: r for r in json.loads((self.root / "r.json").read_text())["records"]}

    def page(self) -> str:
        return (self.root / "rep" / "scenarios" / "tiny_planted.html").read_text()


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> PlantedRun:
    root = tmp_path_factory.mktemp("planted")
    _write_scenario(root, "tiny_planted")
    shutil.copy(SAMPLES / "misbehaving_designs.py", root)
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, "-m", "harness", "run", "--jobs", "1", "--json", "r.json",
                           "--report-dir", "rep"], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    return PlantedRun(root=root, stdout=proc.stdout, returncode=proc.returncode)


def _block(stdout: str, name: str) -> str:
    """The failure block of run ``name`` in the CLI's output: its head line up to the next blank line."""
    start = stdout.index(f"{name}: expected ")
    return stdout[start:stdout.index("\n\n", start)]


def test_cli_prints_the_failure_block_of_a_planted_design_with_the_finding_that_explains_it(planted):
    assert planted.returncode == 1, planted.stdout
    block = _block(planted.stdout, FROZEN)
    lines = block.splitlines()
    assert lines[0] == f"{FROZEN}: expected match, observed diverge"
    observed = next(i for i, line in enumerate(lines) if line.startswith("  observed: diverge: first at step 1"))
    # the cause right under the symptom, then the graph statistics and both reproduce lines
    assert lines[observed + 1] == "  cause: the input audit of the graph step 1 replayed (decode/bs2) found:"
    assert lines[observed + 2] == "    decode/bs2: unregistered graph input pool._frozen_swa_loc int32[2]"
    assert "  graph: 1 graphs captured, 3 replays (0 padded), 0 eager fallbacks" in lines
    reproduce = lines[-1]
    # the planted design's module lies in the run's folder: the line sets PYTHONPATH so that it imports
    assert reproduce.startswith(f"  reproduce: PYTHONPATH=.\"${{PYTHONPATH:+:$PYTHONPATH}}\" pytest "
                                f"'scenarios/tiny_planted.toml::{FROZEN}'")
    assert "   or   " in reproduce and "python -m harness run" in reproduce


def test_a_design_raising_keyerror_is_shown_at_its_own_line_in_terminal_json_and_html(planted):
    frame = f"misbehaving_designs.py:{KEY_LINE} in misses_key"
    block = _block(planted.stdout, MISSES_KEY)
    assert "  observed: error: KeyError: 0" in block
    shown = block.split("raised at, innermost last (the harness's own machinery left out):\n", 1)[1].splitlines()
    # the harness frame that called the design (which hook), then the design's own line; no driver frames
    assert shown[0] == "    harness/backends/base.py in AttentionImpl._get_layer_cache_loc", shown
    assert shown[1] == f"    {frame}" and shown[2].startswith("  reproduce: "), shown

    error = planted.records()[MISSES_KEY]["error"]
    assert error["type"] == "KeyError" and error["frames"][-1] == {
        "file": "misbehaving_designs.py", "line": KEY_LINE, "function": "misses_key"}
    assert len(error["frames"]) == 2

    frames = re.search(r"<div class=\"frames\" data-frames>(.*?)</div>", planted.page(), re.S)
    assert frames is not None and f"<li><code>{frame}</code></li>" in frames.group(1)


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def _elements(html: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = _Elements()
    parser.feed(html)
    return parser.tags


def test_scenario_page_links_the_first_divergence_to_the_finding_it_names_beside_it(planted):
    page = planted.page()
    tags = _elements(page)
    sections = [a for t, a in tags if t == "section" and "data-run-section" in a]
    frozen = next(a for a in sections if a["data-verdict"] == "diverge")
    # the links of the diverging run's first-divergence paragraph, in its section
    section_html = page.split(f'id="{frozen["id"]}"', 1)[1].split("</section>", 1)[0]
    paragraph = section_html.split("data-first-divergence>", 1)[1].split("</p>", 1)[0]
    links = re.findall(r'<a href="#([^"]+)" data-cause-link>([^<]*)</a>', paragraph)
    assert [text for _, text in links] == ["stale pool._frozen_swa_loc", "unregistered pool._frozen_swa_loc"]
    rows = {a["id"]: a for t, a in tags if t == "tr" and a.get("id")}
    for anchor, text in links:
        assert anchor.startswith(f"{frozen['id']}-finding-")
        assert rows[anchor]["data-finding"] == text.split()[0] and "data-explains" in rows[anchor]
    # the finding itself, next to the divergence
    assert "cause: the input audit of the graph step 1 replayed (decode/bs2)" in section_html
    assert "<code>pool._frozen_swa_loc</code>" in section_html.split("data-cause>", 1)[1].split("</div>", 1)[0]
    # the error run's section has no cause to link
    error = next(a for a in sections if a["data-verdict"] == "error")
    assert "data-cause" not in page.split(f'id="{error["id"]}"', 1)[1].split("</section>", 1)[0]


def test_a_finding_of_another_graph_than_the_first_divergent_steps_is_not_shown_as_its_cause(planted, tmp_path):
    views, _ = read_results(planted.root / "r.json")
    frozen = next(v for v in views if v.name == FROZEN)
    assert first_divergence_cause(frozen) is not None
    # the same findings, reported by a graph step 1 did not replay: nothing explains the divergence
    graph = dataclasses.replace(frozen.graph, findings=tuple(dataclasses.replace(f, graph="decode/bs8")
                                                              for f in frozen.graph.findings))
    elsewhere = dataclasses.replace(frozen, graph=graph)
    assert first_divergence_cause(elsewhere) is None
    write_report(tmp_path, [elsewhere])
    page = next((tmp_path / "scenarios").glob("*.html")).read_text()
    assert "data-cause" not in page and "data-explains" not in page
    block = failure_block(elsewhere)
    assert "unregistered graph input pool._frozen_swa_loc" in block and "cause:" not in block


def test_a_results_file_without_frames_or_forward_graphs_still_reads_and_compares(planted, tmp_path):
    doc = json.loads((planted.root / "r.json").read_text())
    for record in doc["records"]:  # as a harness that kept neither wrote it
        if record["error"]:
            del record["error"]["frames"]
        for step in record["steps"]:
            for forward in step["forwards"]:
                del forward["graph"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    old, _ = read_results(tmp_path / "old.json")
    by_name = {v.name: v for v in old}
    assert by_name[MISSES_KEY].error.frames == () and first_divergence_cause(by_name[FROZEN]) is None

    write_results(tmp_path / "new.json", read_results(planted.root / "r.json")[0])
    assert main(["compare", str(tmp_path / "old.json"), str(tmp_path / "new.json")]) == 0

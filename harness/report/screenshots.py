"""``python -m harness.report.screenshots``: PNGs of a written report for the README (``make screenshots``).

Takes the index and one diverging scenario page (its first diverging run opened) from a report folder,
``reports/`` by default (``make report`` writes it), in headless Chromium.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from .browser import BrowserError, Chromium, find_chromium

DEFAULT_SCENARIO = "swa_decode_no_preset_swa_loc"
"""a named overwrite (a@1's K/V in a@0's slot) and a stale graph input (pool.swa_loc) on one page"""


def take(report: Path, out: Path, *, scenario: str, width: int = 1400) -> list[Path]:
    """Write ``report-index.png`` and ``report-scenario.png`` into ``out``; their paths."""
    page_path = report / "scenarios" / f"{scenario}.html"
    for needed in (report / "index.html", page_path):
        if not needed.exists():
            raise FileNotFoundError(f"{needed} does not exist: write the report first (make report)")
    written = []
    with Chromium(width=width, height=1000) as browser:
        index = browser.open(report / "index.html")
        bottom = index.evaluate("document.querySelector('#runs').getBoundingClientRect().top + window.scrollY + 520")
        written.append(index.screenshot(out / "report-index.png", clip={"x": 0, "y": 0, "width": width,
                                                                       "height": min(bottom, 2200)}))
        page = browser.open(page_path)
        # the first diverging run, opened, from the top of the page down to the end of its input audit
        bottom = page.evaluate("""(() => {
            const run = document.querySelector("section[data-run-section][data-verdict='diverge']");
            run.querySelector("details").open = true;
            const audit = run.querySelector("table.findings") || run;
            return audit.getBoundingClientRect().bottom + window.scrollY + 16; })()""")
        written.append(page.screenshot(out / "report-scenario.png", clip={"x": 0, "y": 0, "width": width,
                                                                         "height": min(bottom, 4200)}))
        problems = index.problems() + page.problems()
    if problems:
        raise BrowserError("the pages did not load cleanly: " + "; ".join(problems))
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.report.screenshots", description=__doc__)
    parser.add_argument("--report", default="reports", help="the report folder (default: reports)")
    parser.add_argument("--out", default="docs", help="where the PNGs go (default: docs)")
    parser.add_argument("--scenario", default=DEFAULT_SCENARIO, help=f"a diverging scenario (default: {DEFAULT_SCENARIO})")
    args = parser.parse_args(argv)
    if find_chromium() is None:
        print("needs chromium: none on PATH or in $CHROMIUM (make chromium installs it)", file=sys.stderr)
        return 2
    try:
        for path in take(Path(args.report), Path(args.out), scenario=args.scenario):
            print(path)
    except (FileNotFoundError, BrowserError) as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

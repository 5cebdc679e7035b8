"""The front door: the README stays three screens with its picture, and every path it and docs/ name exists,
so a newcomer never follows a link to nothing."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_SCREEN_LINES = 50
"""lines of a terminal or a browser window at a reading size"""


def test_the_readme_fits_three_screens_and_shows_a_failing_run():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 3 * _SCREEN_LINES
    picture = re.search(r"!\[[^\]]+\]\(([^)]+\.png)\)", readme)
    assert picture is not None and (ROOT / picture.group(1)).is_file()
    for command in ("make report", "make test"):
        assert command in readme


def test_every_path_the_readme_and_docs_name_exists():
    named = re.compile(r"`((?:docs|scenarios|tests|harness|scripts|constraints)/[\w./-]+?\.(?:md|py|toml|png|txt|json))`")
    missing = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for path in named.findall(doc.read_text()):
            # a file a user would write (``harness/backends/my_kernel.py``) is an example, not a link
            if not Path(path).name.startswith("my") and not (ROOT / path).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {path}")
    assert not missing, "\n".join(missing)

"""Profile library runs where they spend their time: in the forked children, one cProfile per case.

    .venv/bin/python scripts/profile_library.py OUT.pstats [python -m harness run/report options...]

The harness forks a child per scenario group (``check/run/workers.py``), so a profile of the parent sees
only waiting. This wraps ``check.matrix.matrix.run_case`` (the function every child calls per case) in a
profiler, writes one stats file per case into a temporary folder, and merges them into ``OUT.pstats``
when the command ends; it then prints the top entries by internal and by cumulative time. It changes no
behaviour of the runs (the profiler slows every Python call, so read shares, not absolute times).
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import tempfile
from pathlib import Path
from typing import Any


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    # the checkout this script belongs to, not whatever an editable install of the harness points at
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    folder = Path(tempfile.mkdtemp(prefix="harness-profile-"))

    from harness import cli
    from harness.check.matrix import matrix

    original = matrix.run_case
    counter = [0]

    def profiled(case: Any) -> Any:
        counter[0] += 1
        profiler = cProfile.Profile()
        try:
            return profiler.runcall(original, case)
        finally:
            profiler.dump_stats(folder / f"{os.getpid()}-{counter[0]}.pstats")

    matrix.run_case = profiled
    try:
        code = cli.main(argv[1:])
    finally:
        matrix.run_case = original
    files = sorted(folder.glob("*.pstats"))
    if not files:
        print(f"no case was profiled (nothing ran in {folder})", file=sys.stderr)
        return 1
    stats = pstats.Stats(str(files[0]))
    for path in files[1:]:
        stats.add(str(path))
    stats.dump_stats(out)
    for path in files:
        path.unlink()
    folder.rmdir()
    print(f"{len(files)} cases profiled into {out}", file=sys.stderr)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(40)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

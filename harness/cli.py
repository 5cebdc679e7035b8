"""Command line: ``python -m harness {report,bench} ...``."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Sequence

from .designs import DESIGNS
from .model import PRESETS, model_spec
from .pool import PoolSpec
from .run import RunSpec, execute
from .verdict import judge
from .workloads import WORKLOADS


def _cmd_report(args: argparse.Namespace) -> int:
    """Eager comparison of every design on the built-in workloads, one table."""
    rows = []
    for preset in args.preset or sorted(PRESETS):
        ms = model_spec(preset)
        for name, workload in WORKLOADS.items():
            base = RunSpec(model=ms, pool=PoolSpec(full_size=96, swa_size=48), timeline=workload(ms.window))
            reference = execute(base.reference())
            for design in DESIGNS:
                verdict = judge(execute(dataclasses.replace(base, design=design)), reference)
                rows.append((preset, name, design, "eager", verdict.summary()))
    _print_table(("model", "workload", "design", "mode", "verdict"), rows)
    return 0


def _print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [str(c).ljust(w) for c, w in zip(row, widths)] + [str(row[-1])]
        print("  ".join(cells))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness",
        description="CUDA-graph correctness harness for attention backends with hybrid sliding-window KV caches.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    report = sub.add_parser("report", help="compare every SWA-location design against the eager reference")
    report.add_argument("--preset", action="append", choices=sorted(PRESETS), help="model preset (repeatable)")
    report.set_defaults(func=_cmd_report)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

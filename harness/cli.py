"""Command line: ``python -m harness {run,list,report,compare}`` (the benchmark is ``python -m harness.bench``)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Sequence

import torch

from .check.case import Case, cases
from .check.run import limit_threads, run_case
from .report.build import case_view
from .report.compare import run_compare
from .report.html import now_label, write_report
from .report.matrix import matrix_text
from .report.records import write_results
from .report.text import printable, progress_line, run_table, table, totals_line
from .report.views import CaseView
from .runspec import Mode
from .scenario.loader import SCENARIO_ROOT_DEFAULT, load_all
from .scenario.spec import ScenarioSpec
from .serving.designs import DESIGNS
from .serving.faults import FAULTS


def _select(args: argparse.Namespace) -> tuple[list[ScenarioSpec], list[str]]:
    specs, errors = load_all(args.paths or [SCENARIO_ROOT_DEFAULT])
    if args.fault:
        specs = [s for s in specs if set(s.faults) & set(args.fault)]
    return specs, [str(e) for e in errors]


def _cases(args: argparse.Namespace, specs: list[ScenarioSpec]) -> list[Case]:
    out = []
    for spec in specs:
        out.extend(cases(spec, designs=args.design, modes=args.mode, backends=args.backend, engine=args.engine,
                         device=args.device))
    return out


def _run_group(batch: list[Case]) -> list[CaseView]:
    # one worker takes all cases of a scenario, so the reference run is computed once there
    limit_threads()
    views = []
    for case in batch:
        if case.unsupported is not None:
            views.append(case_view(None, case=case))
            continue
        start = time.perf_counter()
        result = run_case(case)
        views.append(case_view(result, duration_s=time.perf_counter() - start))
    return views


def _run_all(all_cases: list[Case], jobs: int) -> list[CaseView]:
    groups: dict[tuple[Path, str], list[Case]] = {}
    for case in all_cases:
        groups.setdefault((case.scenario.path, case.backend), []).append(case)
    views: list[CaseView] = []
    done, total, start = 0, len(all_cases), time.perf_counter()
    tty = sys.stderr.isatty()

    def progress(batch: list[CaseView]) -> None:
        nonlocal done
        for v in batch:
            done += 1
            line = progress_line(done, total, v)
            if tty:
                sys.stderr.write("\r\033[K" + line[:150])
            elif not v.ok or done == total or done % 25 == 0:
                sys.stderr.write(line + "\n")
        sys.stderr.flush()

    if jobs <= 1 or len(groups) == 1:
        for batch in groups.values():
            out = _run_group(batch)
            progress(out)
            views.extend(out)
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for out in pool.map(_run_group, groups.values()):
                progress(out)
                views.extend(out)
    if tty:
        sys.stderr.write("\r\033[K")
    sys.stderr.write(f"{total} runs in {time.perf_counter() - start:.1f}s\n")
    order = {c.name: i for i, c in enumerate(all_cases)}
    return sorted(views, key=lambda v: order.get(v.name, 0))


def _cmd_run(args: argparse.Namespace) -> int:
    specs, load_errors = _select(args)
    for err in load_errors:
        print(printable(err, keep_newlines=True), file=sys.stderr)
    needs_cuda = args.device == "cuda" or args.engine == "cuda"
    if needs_cuda and not torch.cuda.is_available():
        print("--engine cuda and --device cuda need a CUDA device; this machine has none "
              "(the tape engine on the CPU is the default)", file=sys.stderr)
        return 2
    all_cases = _cases(args, specs)
    if not all_cases:
        print("no runs selected", file=sys.stderr)
        return 2 if not load_errors else 1
    start = time.perf_counter()
    views = _run_all(all_cases, args.jobs)
    print(run_table(views))
    print()
    print(matrix_text(views))
    print(f"\n{totals_line(views, len(load_errors))}")
    if args.json:
        write_results(Path(args.json), views, duration_s=time.perf_counter() - start)
        print(f"JSON: {Path(args.json).resolve()}")
    if args.report_dir:
        index = write_report(Path(args.report_dir), views, duration_s=time.perf_counter() - start,
                             command=args.command_line, generated=now_label(), load_errors=load_errors)
        print(f"KV report: {index.resolve().as_uri()}")
    return 0 if all(v.ok for v in views) and not load_errors else 1


def _cmd_compare(args: argparse.Namespace) -> int:
    report_dir = Path(args.report_dir) if args.report_dir else None
    return run_compare(Path(args.base), Path(args.head), report_dir=report_dir, out=sys.stdout, err=sys.stderr)


def _cmd_list(args: argparse.Namespace) -> int:
    specs, load_errors = load_all(args.paths or [SCENARIO_ROOT_DEFAULT])
    rows = [
        (s.name, ",".join(s.tags), ",".join(s.modes), ",".join(s.designs), ",".join(sorted(s.faults)) or "-")
        for s in specs
    ]
    print(table(("scenario", "tags", "modes", "designs", "faults"), rows))
    for err in load_errors:
        print(printable(err, keep_newlines=True), file=sys.stderr)
    return 1 if load_errors else 0


def _add_matrix_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", help=f"scenario files or folders (default: {SCENARIO_ROOT_DEFAULT}/)")
    p.add_argument("--design", action="append", help=f"only this design (repeatable): {', '.join(DESIGNS)} "
                   "or an import path the scenario names")
    p.add_argument("--mode", action="append", choices=tuple(Mode), help="only this mode (repeatable)")
    p.add_argument("--backend", action="append", help="only this backend (repeatable)")
    p.add_argument("--fault", action="append", choices=sorted(FAULTS),
                   help="only scenarios that inject this fault (repeatable)")
    p.add_argument("--engine", choices=("tape", "cuda"), help="graph engine (default: tape on cpu, cuda on cuda)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: all cores)")
    p.add_argument("--json", metavar="FILE", help="write one JSON record per run")
    p.add_argument("--report-dir", metavar="DIR",
                   help="write the HTML report there: index.html, a page per scenario, results.json and .csv")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness",
        description="CUDA-graph correctness harness for attention backends with hybrid sliding-window KV caches.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the scenario matrix and compare verdicts with expectations")
    _add_matrix_options(run)
    run.set_defaults(func=_cmd_run)
    report = sub.add_parser("report", help="the main job: the whole matrix on the CPU default, HTML report in reports/")
    _add_matrix_options(report)
    report.set_defaults(func=_cmd_run, report_dir_default="reports")
    compare = sub.add_parser("compare", help="what changed between two results.json files; exits 1 when a run "
                             "changed for the worse (gave its expected verdict in BASE, not in HEAD; or is new and "
                             "does not)")
    compare.add_argument("base", metavar="BASE.json")
    compare.add_argument("head", metavar="HEAD.json")
    compare.add_argument("--report-dir", metavar="DIR",
                         help="write compare.html there, beside HEAD's report pages")
    compare.set_defaults(func=_cmd_compare)
    lst = sub.add_parser("list", help="list scenarios with tags, modes, designs and faults")
    lst.add_argument("paths", nargs="*")
    lst.set_defaults(func=_cmd_list)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    limit_threads()
    if getattr(args, "report_dir_default", None) and not args.report_dir:
        args.report_dir = args.report_dir_default
    args.command_line = shlex.join(["python", "-m", "harness", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

"""Command line: ``python -m harness {run,list,report,bench}``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Sequence

import torch

from .check.matrix import Case, CaseResult, cases, limit_threads, run_case
from .check.run import MODES
from .scenario import SCENARIO_ROOT_DEFAULT, ScenarioSpec, load_all
from .serving.designs import DESIGNS
from .serving.faults import FAULTS


def _select(args: argparse.Namespace) -> tuple[list[ScenarioSpec], list[str]]:
    specs, errors = load_all(args.paths or [SCENARIO_ROOT_DEFAULT])
    if args.fault:
        specs = [s for s in specs if s.faults & set(args.fault)]
    return specs, [str(e) for e in errors]


def _cases(args: argparse.Namespace, specs: list[ScenarioSpec]) -> list[Case]:
    device = args.device
    engine = args.engine or ("cuda" if device == "cuda" else "tape")
    out = []
    for spec in specs:
        out.extend(cases(spec, designs=args.design, modes=args.mode, backends=args.backend, engine=engine,
                         device=device))
    return out


def _run_scenario_cases(batch: list[Case]) -> list[CaseResult]:
    # one worker takes all cases of a scenario, so the reference run is computed once there
    limit_threads()
    return [run_case(case) for case in batch]


def _run_all(all_cases: list[Case], jobs: int) -> list[CaseResult]:
    groups: dict[tuple[Path, str], list[Case]] = {}
    for case in all_cases:
        groups.setdefault((case.scenario.path, case.backend), []).append(case)
    results: list[CaseResult] = []
    done, total, start = 0, len(all_cases), time.perf_counter()
    tty = sys.stderr.isatty()

    def progress(batch: list[CaseResult]) -> None:
        nonlocal done
        for r in batch:
            done += 1
            mark = "ok" if r.ok else "UNEXPECTED"
            line = f"[{done}/{total}] {r.case.name}: {r.verdict.outcome} ({mark})"
            if tty:
                sys.stderr.write("\r\033[K" + line[:150])
            elif not r.ok or done == total or done % 25 == 0:
                sys.stderr.write(line + "\n")
        sys.stderr.flush()

    if jobs <= 1 or len(groups) == 1:
        for batch in groups.values():
            out = _run_scenario_cases(batch)
            progress(out)
            results.extend(out)
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for out in pool.map(_run_scenario_cases, groups.values()):
                progress(out)
                results.extend(out)
    if tty:
        sys.stderr.write("\r\033[K")
    sys.stderr.write(f"{total} runs in {time.perf_counter() - start:.1f}s\n")
    order = {id(c): i for i, c in enumerate(all_cases)}
    return sorted(results, key=lambda r: order.get(id(r.case), 0))


def record(result: CaseResult) -> dict[str, object]:
    """One JSON record per run."""
    case, verdict = result.case, result.verdict
    first = verdict.first
    diff = verdict.diff
    return {
        "scenario": case.scenario.name,
        "path": str(case.scenario.path),
        "design": case.design,
        "mode": case.mode,
        "backend": case.backend,
        "engine": case.engine,
        "device": case.device,
        "faults": sorted(case.faults),
        "expected": case.expected,
        "verdict": verdict.outcome,
        "ok": result.ok,
        "why": case.why,
        "first_divergent_step": first.step if first else None,
        "first_divergence": None if first is None else {
            "step": first.step, "pool": first.pool, "layer": first.layer, "slot": first.slot,
            "owner": f"{first.rid}@{first.pos}", "what": first.what, "classification": first.classification,
            "detail": first.detail,
        },
        "mismatches": diff.total if diff else 0,
        "mismatched_slots": diff.mismatched_slots if diff else 0,
        "classes": dict(diff.classes) if diff else {},
        "dummy_writes": diff.dummy_writes if diff else 0,
        "error": None if verdict.error is None else {
            "type": verdict.error.type, "message": verdict.error.message, "step": verdict.error.step,
        },
        "notes": list(verdict.notes),
    }


def verdict_matrix(results: list[CaseResult]) -> str:
    """Observed verdicts per design and mode, counted over every scenario (what a reviewer scans first)."""
    import pandas as pd

    frame = pd.DataFrame(
        [{"design": r.case.design, "mode": r.case.mode, "verdict": r.verdict.outcome} for r in results
         if r.case.with_faults]
    )
    if frame.empty:
        return ""
    counts = frame.groupby(["design", "mode", "verdict"]).size().unstack("verdict", fill_value=0)
    cells = counts.apply(lambda row: " ".join(f"{v}:{n}" for v, n in row.items() if n), axis=1)
    table = cells.unstack("mode", fill_value="-")
    return table.to_string()


def write_json_atomic(path: Path, data: object) -> None:
    """Write to a temporary file beside ``path`` and rename it into place, as pytest writes its caches."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def _first_divergence(result: CaseResult) -> str:
    v = result.verdict
    if v.outcome == "error" and v.error is not None:
        return f"{v.error.type}: {v.error.message}"[:90]
    if v.first is not None:
        f = v.first
        return f"{f.where()}: {f.classification}"
    return ""


def _cmd_run(args: argparse.Namespace) -> int:
    specs, load_errors = _select(args)
    for err in load_errors:
        print(err, file=sys.stderr)
    needs_cuda = args.device == "cuda" or args.engine == "cuda"
    if needs_cuda and not torch.cuda.is_available():
        print("--engine cuda and --device cuda need a CUDA device; this machine has none "
              "(the tape engine on the CPU is the default)", file=sys.stderr)
        return 2
    all_cases = _cases(args, specs)
    if not all_cases:
        print("no runs selected", file=sys.stderr)
        return 2 if not load_errors else 1
    results = _run_all(all_cases, args.jobs)
    rows = [
        (r.case.name, r.case.expected, r.verdict.outcome, "" if r.ok else "UNEXPECTED", _first_divergence(r))
        for r in results
    ]
    _print_table(("run", "expected", "observed", "", "first divergence / error"), rows)
    print()
    print(verdict_matrix(results))
    bad = [r for r in results if not r.ok]
    print(f"\n{len(results) - len(bad)} as expected, {len(bad)} unexpected, {len(load_errors)} scenario files "
          f"failed to load")
    if args.json:
        write_json_atomic(Path(args.json), [record(r) for r in results])
        print(f"JSON: {Path(args.json).resolve()}")
    return 0 if not bad and not load_errors else 1


def _cmd_list(args: argparse.Namespace) -> int:
    specs, load_errors = load_all(args.paths or [SCENARIO_ROOT_DEFAULT])
    rows = [
        (s.name, ",".join(s.tags), ",".join(s.modes), ",".join(s.designs), ",".join(sorted(s.faults)) or "-")
        for s in specs
    ]
    _print_table(("scenario", "tags", "modes", "designs", "faults"), rows)
    for err in load_errors:
        print(err, file=sys.stderr)
    return 1 if load_errors else 0


def _print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [str(c).ljust(w) for c, w in zip(row, widths)] + [str(row[-1])]
        print("  ".join(cells).rstrip())


def _add_matrix_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", help=f"scenario files or folders (default: {SCENARIO_ROOT_DEFAULT}/)")
    p.add_argument("--design", action="append", help=f"only this design (repeatable): {', '.join(DESIGNS)} "
                   "or an import path the scenario names")
    p.add_argument("--mode", action="append", choices=MODES, help="only this mode (repeatable)")
    p.add_argument("--backend", action="append", help="only this backend (repeatable)")
    p.add_argument("--fault", action="append", choices=sorted(FAULTS),
                   help="only scenarios that inject this fault (repeatable)")
    p.add_argument("--engine", choices=("tape", "cuda"), help="graph engine (default: tape on cpu, cuda on cuda)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: all cores)")
    p.add_argument("--json", metavar="FILE", help="write one JSON record per run")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness",
        description="CUDA-graph correctness harness for attention backends with hybrid sliding-window KV caches.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the scenario matrix and compare verdicts with expectations")
    _add_matrix_options(run)
    run.set_defaults(func=_cmd_run)
    report = sub.add_parser("report", help="the main job: the whole matrix on the CPU default, results in reports/")
    _add_matrix_options(report)
    report.set_defaults(func=_cmd_run, json_default="reports/results.json")
    lst = sub.add_parser("list", help="list scenarios with tags, modes, designs and faults")
    lst.add_argument("paths", nargs="*")
    lst.set_defaults(func=_cmd_list)
    bench = sub.add_parser("bench", help="graph replay time against eager time per preset and bucket")
    bench.add_argument("--repeats", type=int, default=20)
    bench.add_argument("--out", default="BENCHMARKS.md", help="markdown file the table is written into")
    bench.set_defaults(func=_cmd_bench)
    return parser


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import run_bench

    return run_bench(repeats=args.repeats, out=Path(args.out))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    limit_threads()
    if getattr(args, "json_default", None) and not args.json:
        args.json = args.json_default
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

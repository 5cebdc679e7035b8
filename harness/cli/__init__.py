"""Command line: ``python -m harness {run,list,report,compare,fuzz}`` (the benchmark is ``python -m harness.bench``)."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import enum
import os
import shlex
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

# what the parser, option errors and refusals need, none of which imports torch or pandas; the scenario
# loader and the run machinery (the matrix, the report writers) are imported by the commands that use them,
# so --help and an option error do not wait for them (tests/plugin/test_front_door.py holds this)
from ..check.matrix.expect import EXPECT_DEFAULT, expect_problem
from .keywords import KeywordError, Keywords
from .types import int_at_least
from ..check.run.malloc import keep_freed_memory
from ..check.run.workers import Terminated, output_block, terminate_like_ctrl_c
from ..imports import is_import_path, name_type, unknown_name
from ..options import add_cli_option
from ..report.files import destination_problems
from ..report.text import (
    GREEN,
    RED,
    failure_blocks,
    paint,
    printable,
    progress_line,
    record,
    run_table,
    table,
    time_left,
    totals_line,
    wants_colour,
)
from ..runners.registry import runner_option
from ..runspec import TIMEOUT_MAX_S, Device, Engine, Mode
from ..serving.designs import DESIGNS
from ..serving.faults import FAULTS
from ..serving.registry import STACKS

if TYPE_CHECKING:
    from ..check.matrix.case import Case
    from ..report.session import ReportSession
    from ..report.views import CaseView
    from ..scenario.loader import ScenarioError
    from ..scenario.spec import ScenarioSpec

SCENARIO_ROOT = "scenarios"
"""``scenario.loader.SCENARIO_ROOT_DEFAULT`` (a test holds them equal), not imported: the loader imports torch"""


def _load(args: argparse.Namespace) -> tuple[list[ScenarioSpec], list[ScenarioError]]:
    from ..scenario.loader import load_all

    return load_all(args.paths or [SCENARIO_ROOT])


def _path_problems(paths: Sequence[str]) -> list[str]:
    """One line per scenario path that names nothing, with the closest existing file or folder: a typo is a
    usage error (exit 2), not a file that failed to load."""
    out = []
    for raw in paths:
        path = Path(raw)
        if path.exists():
            continue
        close = difflib.get_close_matches(str(path), _path_candidates(path), n=1, cutoff=0.6)
        guess = f" (did you mean {printable(close[0])}?)" if close else ""
        out.append(f"no scenario file or folder {printable(raw)}{guess}")
    return out


def _path_candidates(path: Path) -> list[str]:
    """The scenario files and folders a mistyped ``path`` may have meant: beside its nearest existing folder,
    and (for a path that does not start outside it) everywhere under the scenario root."""
    base = next((p for p in path.parents if p.is_dir()), Path("."))
    found = {q for q in base.iterdir() if q.is_dir() or q.suffix == ".toml"} if base.is_dir() else set()
    root = Path(SCENARIO_ROOT)
    if root.is_dir() and not path.is_absolute():
        found |= {q for q in root.rglob("*") if q.is_dir() or q.suffix == ".toml"}
    return sorted(str(q) + ("/" if q.is_dir() and str(path).endswith("/") else "") for q in found)


def _select(args: argparse.Namespace, specs: list[ScenarioSpec]) -> list[ScenarioSpec]:
    if args.serving is not None:  # what the scenarios run on, not which of them run: before the filters
        specs = [dataclasses.replace(s, serving=args.serving) for s in specs]
    if args.fault:
        specs = [s for s in specs if set(s.faults) & set(args.fault)]
    if args.no_faults:  # by what a scenario does, not where it lives: faults act outside scenarios/faults/ too
        specs = [s for s in specs if not s.faults]
    return specs


def _cases(args: argparse.Namespace, specs: list[ScenarioSpec], *, keywords: bool = True) -> list[Case]:
    extra = [d for d in args.design or () if is_import_path(d)]
    from ..check.matrix.case import Selection, cases
    from .cells import added_backends

    selection = Selection(designs=args.design, modes=args.mode, backends=args.backend, engine=args.engine,
                          device=args.device, extra_designs=extra, extra_backends=added_backends(args.backend or ()),
                          runners=dict(args.runner or ()), timeout_s=args.timeout)
    out = []
    for spec in specs:
        out.extend(cases(spec, selection, expect=args.expect))
    if keywords and args.keywords is not None:
        out = [c for c in out if args.keywords.matches(_names(c))]
    if getattr(args, "quick", False):
        from ..check.matrix.quick import quick

        out = quick(out)
    return out


def _names(case: Case) -> tuple[str, ...]:
    """What ``-k`` matches, as pytest matches an item: its name, its tags, its file's and folder's names."""
    path = case.scenario.path
    return (case.name, *case.scenario.tags, path.name, path.parent.name)


def _why_nothing(args: argparse.Namespace, specs: list[ScenarioSpec], loaded: int,
                 load_errors: list[ScenarioError]) -> str:
    """Why the selection is empty: no scenario file, none that loads, or the filter that emptied it, in the
    words of the option that did it. ``loaded``: the scenarios that loaded, before the filters."""
    where = " ".join(map(str, args.paths)) if args.paths else f"{SCENARIO_ROOT}/"
    if not loaded and not load_errors:
        return f"no scenario files (*.toml) under {where}"
    if not loaded:
        names = ", ".join(printable(e.path) for e in load_errors)
        return f"every scenario file under {where} failed to load ({len(load_errors)}: {names}; their problems are above)"
    if not specs:
        if args.fault and args.no_faults:
            return "--fault keeps scenarios that inject a fault, --no-faults leaves every one of them out"
        if args.fault:
            return f"no scenario under {where} injects {' or '.join(args.fault)}"
        if args.no_faults:
            return f"every scenario under {where} injects a fault (--no-faults leaves them out)"
    if args.keywords is not None and _cases(args, specs, keywords=False):
        return f"-k {args.keywords.text}: no run of the selected scenarios matches it"
    for option, values, have in (
        ("--design", args.design, {d for s in specs for d in s.designs}),
        ("--mode", args.mode, {m for s in specs for m in s.modes}),
        ("--backend", args.backend, {b for s in specs for b in s.backends}),
    ):
        added = option in ("--design", "--backend") and any(map(is_import_path, values or ()))
        if values and not set(values) & have and not added:
            return f"{option} {' '.join(values)}: no selected scenario runs it; they run {', '.join(sorted(have))}"
    return "the filters together select no run: no scenario runs that combination of design, mode and backend"


class MaxFailReached(Exception):
    """``--maxfail N`` (``-x``: 1) unexpected runs finished: the rest are not run."""

    def __init__(self, unexpected: int) -> None:
        super().__init__(unexpected)
        self.unexpected = unexpected


def _run_all(all_cases: list[Case], jobs: int, session: ReportSession, maxfail: int | None = None) -> None:
    """Run every case, adding views to the session as they finish (so an interrupt keeps what finished);
    ``maxfail``: stop (``MaxFailReached``) once that many runs gave an unexpected verdict."""
    from ..check.matrix.matrix import run_cases
    from ..report.build import case_view

    done_count, total, start = 0, len(all_cases), time.perf_counter()
    tty = sys.stderr.isatty()

    runnable = [c for c in all_cases if c.unsupported is None]
    ran = 0  # of the runnable: the skipped ones are added at once and would make the pace look fast

    unexpected = 0

    def add(view: CaseView) -> None:
        nonlocal done_count, ran, unexpected
        done_count += 1
        ran += view.skip_reason is None
        session.add(view)
        left = time_left(time.perf_counter() - start, ran, len(runnable) - ran)
        if tty:
            sys.stderr.write("\r\033[K" + progress_line(done_count, total, view, width=150, left_s=left))
        elif not view.ok or done_count == total or done_count % 25 == 0:
            sys.stderr.write(progress_line(done_count, total, view, left_s=left) + "\n")
        sys.stderr.flush()
        unexpected += not view.ok
        if maxfail is not None and unexpected >= maxfail:
            raise MaxFailReached(unexpected)  # out of the pool of children, which it stops (workers.run_grouped)

    for case in all_cases:
        if case.unsupported is not None:
            add(case_view(None, case=case))
    started = {id(c): time.perf_counter() for c in runnable}

    def show_output(index: int, text: str) -> None:
        # what a run printed, escaped and marked as its own, just before its result line
        sys.stderr.write(("\r\033[K" if tty else "") + output_block(runnable[index].name, text) + "\n")

    run_cases(runnable, jobs=jobs, output=show_output,
              done=lambda i, result: add(case_view(result, duration_s=result.duration_s if result.duration_s is not None
                                                   else time.perf_counter() - started[id(runnable[i])])))
    if tty:
        sys.stderr.write("\r\033[K")
    sys.stderr.write(f"{total} runs in {time.perf_counter() - start:.1f}s\n")


def _cmd_run(args: argparse.Namespace) -> int:
    if problems := destination_problems(results=("--json", Path(args.json) if args.json else None),
                                        folder=("--report-dir", Path(args.report_dir) if args.report_dir else None)):
        print("\n".join(printable(p) for p in problems), file=sys.stderr)
        return 2
    if problems := _path_problems(args.paths):
        print("\n".join(problems), file=sys.stderr)
        return 2
    import torch

    from ..check.matrix.matrix import limit_threads
    from ..report.session import ReportSession

    limit_threads()  # before the loader's dry runs, which go through torch too
    loaded, load_errors = _load(args)
    specs = _select(args, loaded)
    _print_problems(load_errors)
    needs_cuda = args.device == "cuda" or args.engine == "cuda"
    if needs_cuda and not torch.cuda.is_available():
        print("--engine cuda and --device cuda need a CUDA device; this machine has none "
              "(the tape engine on the CPU is the default)", file=sys.stderr)
        return 2
    all_cases = _cases(args, specs)
    if not all_cases:
        print(f"no runs selected: {_why_nothing(args, specs, len(loaded), load_errors)}", file=sys.stderr)
        return 2 if not load_errors else 1
    session = ReportSession(json_path=Path(args.json) if args.json else None,
                            report_dir=Path(args.report_dir) if args.report_dir else None,
                            command=args.command_line, planned=[c.name for c in all_cases],
                            load_errors=[e.problems for e in load_errors])
    try:
        _run_all(all_cases, args.jobs, session, maxfail=args.maxfail)
    except MaxFailReached as stop:
        if sys.stderr.isatty():
            sys.stderr.write("\r\033[K")
        sys.stderr.write(f"stopped after {stop.unexpected} unexpected run{'s' if stop.unexpected != 1 else ''} "
                         f"(--maxfail {args.maxfail}): {len(session.views)} of {len(all_cases)} runs finished\n")
        _finish(session, complete=False, verbose=args.verbose)
        return 1
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, Terminated) else signal.SIGINT
        how = "interrupted" if signum == signal.SIGINT else f"terminated ({signal.Signals(signum).name})"
        sys.stderr.write(f"\n{how}: {len(session.views)} of {len(all_cases)} runs finished\n")
        _finish(session, complete=False, verbose=args.verbose)
        return 128 + signum
    return _finish(session, complete=True, verbose=args.verbose)


def _finish(session: ReportSession, *, complete: bool, verbose: bool) -> int:
    views = session.ordered()
    # the table lists what needs a look (every run with -v, or what finished of an interrupted run); the
    # totals below count them all
    colour = wants_colour(sys.stdout)
    if shown := [v for v in views if verbose or not complete or not v.ok]:
        print(run_table(shown, colour=colour))
        print()
    if blocks := failure_blocks(views):
        print(blocks)  # the cause beside the symptom: audit findings, graph statistics, the traceback's frames
        print()
    totals = totals_line(views, len(session.load_errors))
    good = complete and all(v.ok for v in views) and not session.load_errors
    print("\n".join(paint(line, GREEN if good else RED) if colour and line == totals else line
                    for line in session.summary_lines()))
    if len(shown) < len(views):
        print("-v lists every run in the table, each skipped one with why")
    session.finish(complete=complete)
    if session.json_path is not None and session.results_written:
        print(f"JSON: {session.json_path.resolve()}" + ("" if complete else " (incomplete)"))
    if (line := session.report_line()) is not None:
        print(line)
    for problem in session.problems:  # a full disk after the runs: what was kept is above, what was not here
        print(printable(problem), file=sys.stderr)
    return 0 if good and not session.problems else 1


def _cmd_compare(args: argparse.Namespace) -> int:
    report_dir = Path(args.report_dir) if args.report_dir else None
    if problems := destination_problems(results=("", None), folder=("--report-dir", report_dir)):
        print("\n".join(printable(p) for p in problems), file=sys.stderr)
        return 2
    from ..report.compare import run_compare

    return run_compare(Path(args.base), Path(args.head), report_dir=report_dir, out=sys.stdout, err=sys.stderr)


LIST_WIDTH = 100
"""columns the tables of ``list`` fit in (their widest cells wrap)"""


def _cmd_list(args: argparse.Namespace) -> int:
    from ..scenario.loader import load_all

    if problems := _path_problems(args.paths):
        print("\n".join(problems), file=sys.stderr)
        return 2

    # the backends' declarations and hooks live on classes in modules that compute with torch, and the dry run
    # of a timeline allocates through torch: only a listing that shows the backends pays for them
    backends = args.backends or bool(args.backend)
    if backends:
        from ..check.matrix.matrix import limit_threads

        limit_threads()
    specs, load_errors = load_all(args.paths or [SCENARIO_ROOT], full=backends)
    # a scenario's name and lists together run to 270 columns: each scenario is a record, not a table row
    for s in specs:
        print(record(s.name, [("tags", ",".join(s.tags)), ("modes", ",".join(s.modes)),
                              ("faults", ",".join(sorted(s.faults))), ("designs", ",".join(s.designs)),
                              ("references", "; ".join(s.references))], width=LIST_WIDTH))
    if backends:
        _list_backends(args, specs)
    elif specs:
        print()
        print(textwrap.fill("--backends adds each backend's declaration and cells, and why the ones this machine "
                            "cannot run are skipped (it imports torch, checks the files against the backends and "
                            "dry-runs their timelines, as run does)", width=LIST_WIDTH))
    _print_problems(load_errors)
    return 1 if load_errors else 0


def _list_backends(args: argparse.Namespace, specs: list[ScenarioSpec]) -> None:
    from ..check.matrix.case import Selection, cases
    from .cells import added_backends, backend_rows, skipped_rows

    # every cell of the listed scenarios on this machine's default device, the named GPU backends added
    selection = Selection(backends=args.backend, extra_backends=added_backends(args.backend or ()))
    cells = [c for s in specs for c in cases(s, selection)]
    print()
    print(table(("backend", "runs on", "graphs", "page sizes", "cells", "skipped here"), backend_rows(cells),
                width=LIST_WIDTH))
    if skipped := skipped_rows(cells):
        print()
        print("skipped here:")  # a reason runs to 300 columns: a record each, not a table row
        for scenario, backend, count, modes, why in skipped:
            print(record(f"{scenario} on {backend}: {count} cells ({modes})", [("why", why)], width=LIST_WIDTH))


def _print_problems(errors: list[ScenarioError]) -> None:
    # one escaped line per problem: a newline inside a file name must not start a line of its own
    for err in errors:
        for line in err.problems:
            print(printable(line), file=sys.stderr)


def _add_matrix_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", help=f"scenario files or folders (default: {SCENARIO_ROOT}/)")
    p.add_argument("-k", dest="keywords", type=_keywords, metavar="EXPR",
                   help="only runs whose name, tags, file or folder name hold these words, joined by and, or, not "
                        "and parentheses (pytest's -k)")
    # the options pytest shares, described once (options.py); what is the command line's own: types, defaults
    add_cli_option(p, "design", type=_design, help_values={"designs": ", ".join(DESIGNS)})
    add_cli_option(p, "expect", type=_expect, help_values={"expect_default": EXPECT_DEFAULT})
    add_cli_option(p, "timeout", type=_positive_float)
    p.add_argument("--mode", action="append", type=name_type("mode", Mode), metavar=_choices(Mode),
                   help="only this mode (repeatable)")
    add_cli_option(p, "backend", type=_backend)
    add_cli_option(p, "runner", type=_runner)
    add_cli_option(p, "serving", type=_serving)
    p.add_argument("--fault", action="append", type=name_type("fault", sorted(FAULTS)), metavar="FAULT",
                   help="only scenarios that inject this fault (repeatable; the faults column of list)")
    p.add_argument("--no-faults", action="store_true",
                   help="leave out every scenario that injects a fault (its run.faults, wherever the file is)")
    p.add_argument("--quick", action="store_true",
                   help="only make test's share of the runs: on each scenario's first backend, with its faults on, "
                        "each design's every distinct expected verdict once, a graph mode first")
    add_cli_option(p, "engine", type=name_type("engine", Engine), metavar=_choices(Engine))
    add_cli_option(p, "device", type=name_type("device", Device), metavar=_choices(Device), default="cpu")
    p.add_argument("--jobs", type=_positive_int, default=os.cpu_count() or 1,
                   help="runs at a time, each in its own process (default: all cores)")
    add_cli_option(p, "json")
    add_cli_option(p, "report")
    p.add_argument("--maxfail", type=_positive_int, metavar="N",
                   help="stop after N runs gave an unexpected verdict, as pytest's --maxfail does (the table, the "
                        "totals and the JSON, marked incomplete, cover the runs that finished)")
    p.add_argument("-x", "--exitfirst", dest="maxfail", action="store_const", const=1,
                   help="stop at the first unexpected run (--maxfail 1)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="list every run in the result table (by default it lists the unexpected ones only)")


def _choices(values: type[enum.StrEnum]) -> str:
    """``{eager,full,piecewise}``: the metavar argparse's ``choices`` would show, from plain values."""
    return "{" + ",".join(map(str, values)) + "}"


def _design(text: str) -> str:
    if text in DESIGNS or is_import_path(text):
        return text
    raise argparse.ArgumentTypeError(unknown_name("design", text, DESIGNS,
                                                  also="an import path 'package.module:function'"))


def _serving(text: str) -> str:
    if text in STACKS or is_import_path(text):
        return text
    raise argparse.ArgumentTypeError(unknown_name("serving stack", text, STACKS,
                                                  also="an import path 'package.module:Class'"))


def _backend(text: str) -> str:
    from ..backends.registry import BACKENDS

    if text in BACKENDS or is_import_path(text):
        return text
    raise argparse.ArgumentTypeError(unknown_name("backend", text, BACKENDS,
                                                  also="an import path 'package.module:Class'"))


def _keywords(text: str) -> Keywords:
    try:
        return Keywords(text)
    except KeywordError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _expect(text: str) -> str:
    if (problem := expect_problem(text)) is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def _runner(text: str) -> tuple[str, str]:
    try:
        return runner_option(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_positive_int = int_at_least(1, "a positive integer")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value <= TIMEOUT_MAX_S:
        raise argparse.ArgumentTypeError(f"expected seconds from 0 (excluded) to {TIMEOUT_MAX_S:g}, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness",
        description="CUDA-graph correctness harness for attention backends with hybrid sliding-window KV caches.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{run,report,compare,list,fuzz}",
                                help="what to do (python -m harness COMMAND --help for its options)")
    run = sub.add_parser("run", help="run the scenario matrix and compare verdicts with expectations")
    _add_matrix_options(run)
    run.set_defaults(func=_cmd_run)
    report = sub.add_parser("report", help="the main job: the whole matrix on the CPU default, HTML report in reports/")
    _add_matrix_options(report)
    report.set_defaults(func=_cmd_run, report_dir_default="reports")
    compare = sub.add_parser("compare", help="what changed between two results.json files; exits 1 when a run "
                             "changed for the worse (gave its expected verdict in BASE, not in HEAD; is new and "
                             "does not; or matched in BASE and fails in HEAD under an edited expectation)")
    compare.add_argument("base", metavar="BASE.json", help="the results before (python -m harness run --json)")
    compare.add_argument("head", metavar="HEAD.json", help="the results after, compared with BASE")
    compare.add_argument("--report-dir", metavar="DIR",
                         help="write compare.html there, beside HEAD's report pages")
    compare.set_defaults(func=_cmd_compare)
    lst = sub.add_parser("list", help="list scenarios with tags, modes, designs and faults (with --backends, then the "
                         "backends with their cells and why the ones this machine cannot run are skipped)")
    lst.add_argument("paths", nargs="*", help=f"scenario files or folders (default: {SCENARIO_ROOT}/)")
    lst.add_argument("--backends", action="store_true",
                     help="also each backend's declaration, its cells and why the ones this machine cannot run are "
                          "skipped (imports torch: slower; checks the files in full, as run does)")
    lst.add_argument("--backend", action="append",
                     help="only this backend's cells (repeatable; implies --backends); a GPU backend (flashinfer) or "
                          "an import path is added to every scenario, as run adds it")
    lst.set_defaults(func=_cmd_list)
    for command in (run, report, compare, lst):
        command.set_defaults(parser=command)
    from .fuzz import add_fuzz_command

    add_fuzz_command(sub)
    return parser


def _unrecognized(parser: argparse.ArgumentParser, extra: Sequence[str]) -> str:
    """argparse's ``unrecognized arguments`` with a close match for each unknown option."""
    options = list(parser._option_string_actions)  # argparse keeps no public list of a parser's options
    parts = []
    for arg in extra:
        name = arg.split("=", 1)[0]
        close = difflib.get_close_matches(name, options, n=1) if arg.startswith("-") else []
        parts.append(f"{printable(arg)} (did you mean {close[0]}?)" if close else printable(arg))
    return f"unrecognized arguments: {' '.join(parts)}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    given = list(sys.argv[1:] if argv is None else argv)
    commands = _commands(parser)
    if given and not given[0].startswith("-") and given[0] not in commands:
        parser.error(unknown_name("command", given[0], commands))  # argparse's own message guesses nothing
    args, extra = parser.parse_known_args(argv)
    if extra:  # the subcommand's own usage, not the top-level one argparse would print
        args.parser.error(_unrecognized(args.parser, extra))
    if getattr(args, "report_dir_default", None) and not args.report_dir:
        args.report_dir = args.report_dir_default
    args.command_line = shlex.join(["python", "-m", "harness", *(sys.argv[1:] if argv is None else argv)])
    keep_freed_memory()  # the command's own process (its references, the report), as its worker children do
    with terminate_like_ctrl_c():
        try:
            return args.func(args)
        except KeyboardInterrupt as exc:  # before or after the runs: nothing was lost, nothing to write
            signum = exc.signum if isinstance(exc, Terminated) else signal.SIGINT
            print(f"\ninterrupted ({signal.Signals(signum).name})", file=sys.stderr)
            return 128 + signum


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    return [name for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for name in action.choices]


if __name__ == "__main__":
    sys.exit(main())

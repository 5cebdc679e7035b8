"""``python -m harness fuzz``: search one design, mode, backend and fault set with Hypothesis for a time budget,
and write each failure found, shrunk, as a regression scenario (docs/fuzzing.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..imports import name_type
from ..runspec import Mode
from .types import int_at_least

BUDGET_DEFAULT_S = 60.0


def add_fuzz_command(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from . import _backend, _design, _positive_float

    p = sub.add_parser("fuzz", help="search random timelines of one design and mode for a run that does not match the "
                       "reference; write each failure, shrunk, as a scenario under scenarios/regressions/")
    from ..fuzz.properties import FUZZ_PROPERTIES, LIBRARY

    p.add_argument("--target", type=name_type("fuzz target", (LIBRARY, *FUZZ_PROPERTIES)), default=LIBRARY,
                   help=f"{LIBRARY} (default): one design and mode against the eager reference; a target's own "
                        f"property ({', '.join(FUZZ_PROPERTIES) or 'none registered'}: docs/fuzzing.md), which takes no "
                        "--design, --mode, --backend or --serving, and --fault only where it names its own faults")
    p.add_argument("--design", type=_design, help="the design under test (required for the library target)")
    p.add_argument("--mode", type=name_type("mode", Mode), metavar="{" + ",".join(Mode) + "}",
                   help="the runner mode under test (required for the library target)")
    p.add_argument("--backend", type=_backend, default=None, help="the attention backend (default: "
                   "torch_native)")
    # checked once the target is known: the library's faults are the catalog's, a property names its own
    p.add_argument("--fault", action="append", default=[], metavar="FAULT",
                   help="switch this fault on in every run (repeatable; a property that takes it: its own faults)")
    p.add_argument("--serving", default=None, metavar="STACK",
                   help="move every run onto this serving stack (a target's, as it registered it: sglang with the "
                        "SGLang install), its free order and eviction with it (default: the harness's miniature)")
    p.add_argument("--budget", type=_positive_float, default=BUDGET_DEFAULT_S, metavar="SECONDS",
                   help=f"seconds of search before giving up, and again at most for shrinking what it found "
                        f"(default: {BUDGET_DEFAULT_S:g})")
    p.add_argument("--seed", type=_seed, default=0, help="Hypothesis's seed: the same seed and database, the same search "
                   "(default: 0)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="where findings are written as scenario files (default: scenarios/regressions/)")
    p.add_argument("--database", default=None, metavar="DIR",
                   help="Hypothesis's example database, replayed first (default: .cache/fuzz/)")
    p.add_argument("--no-write", action="store_true", help="report findings without writing scenario files")
    p.set_defaults(func=_cmd_fuzz, parser=p)
    return p


_seed = int_at_least(0, "a non-negative integer")


def _cmd_fuzz(args: argparse.Namespace) -> int:
    from ..fuzz.properties import LIBRARY

    if args.target != LIBRARY:
        return _cmd_fuzz_property(args)
    if args.design is None or args.mode is None:
        args.parser.error("the library target needs --design and --mode")
    from ..fuzz import DATABASE_DEFAULT, REGRESSIONS_DEFAULT, FuzzTarget, fuzz, write_regression
    from ..fuzz.search import print_findings, progress_printer

    target = FuzzTarget(design=args.design, mode=Mode(args.mode), backend=args.backend or "torch_native",
                        faults=frozenset(args.fault), serving=args.serving or "miniature")
    if problems := target.problems():
        print("\n".join(problems), file=sys.stderr)
        return 2
    tty = sys.stderr.isatty()
    progress = progress_printer(target.label, tty)
    command = target.command(seed=args.seed)
    report = fuzz(target, budget_s=args.budget, seed=args.seed, progress=progress,
                  database=Path(args.database) if args.database else DATABASE_DEFAULT)
    folder = Path(args.out) if args.out else REGRESSIONS_DEFAULT
    return print_findings(target.label, report, tty=tty,
                          write=None if args.no_write else
                          lambda finding: write_regression(finding, folder=folder, command=command),
                          already=lambda finding: f"{folder}/*{finding.key}.toml")


def _cmd_fuzz_property(args: argparse.Namespace) -> int:
    """A property a target registered (``fuzz.properties``)."""
    from ..fuzz.properties import FUZZ_PROPERTIES, PROPERTY_FLAGS

    takes = PROPERTY_FLAGS.get(args.target, ())
    if stray := [flag for flag, value in (("--design", args.design), ("--mode", args.mode),
                                          ("--backend", args.backend), ("--fault", args.fault),
                                          ("--serving", args.serving)) if value and flag not in takes]:
        args.parser.error(f"--target {args.target} takes no {', '.join(stray)}")
    from ..imports import load_named

    run = load_named(args.target, dict(FUZZ_PROPERTIES), kind="fuzz property",
                     check=lambda o: None if callable(o) else "not a function")
    return run(args)

"""The differential property under the SGLang target: on every generated timeline SGLang can express, the
miniature and the installed SGLang (``harness/sglang/differential.py``: SGLang's own ``Req`` and
``ScheduleBatch`` path over its allocator) agree step by step on what each allocates, evicts and frees, apart
from the differences that module names (``DIFFERENCES``).

A case is a timeline drawn by ``strategies.run_specs`` (the same valid scenarios the library property
draws; its page size one of 1, 4 and 16), without draft steps, without the prefix cache, and one of
SGLang's eviction intervals, 1 and 128; a case the adapter cannot express (``differential.not_expressible``:
fp8 pools, models of one layer kind, ...) is discarded, never judged. It fails in one of two ways:

- **fidelity**: the traces part (``first_difference``: the first step and field that differ): the miniature
  models SGLang wrongly there, or the difference is one ``DIFFERENCES`` should name;
- **SGLang raised**: SGLang's side raised (running out of a pool aside, which both sides must do alike),
  with its invariant checks on at their strictest (``SGLANG_INVARIANT_CHECK=2``, strict: a breached check
  raises): a candidate defect of the real code, to be read against its source lines before it is reported.

Each failure's signature is its kind and field (or the exception's type and message, numbers blanked), not
its step; Hypothesis shrinks each on its own. A finding is written once per signature as a scenario file
under ``scenarios/regressions/`` whose model, pool and timeline are the shrunk case's: the differential
test (``tests/sglang/test_differential.py``) runs every library scenario at pages of 1, 4 and 16 and
intervals of 1 and 128, so it fails on the file until the difference is fixed or named.

SGLang is imported only when a case is checked. The SGLang target registers ``main`` as the fuzz property
``sglang-differential`` (``fuzz.properties``), so ``python -m harness fuzz --target sglang-differential`` runs it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..fuzz.search import (DATABASE_DEFAULT, Progress, PropertyReport, print_findings, progress_printer,
                           search_property)
from ..fuzz.target import FuzzTarget
from ..runspec import Mode, RunSpec

NAME = "sglang-differential"
"""the target's name on the command line and its example database folder"""

INTERVALS = (1, 128)
"""the SWA eviction intervals drawn: every token, and SGLang's default (SWA_EVICTION_INTERVAL)"""

DRAW_TARGET = FuzzTarget(design="forward_batch", mode=Mode.EAGER)
"""whose runs the strategy draws: only their model, pool and timeline reach the comparison"""

STRICT = "2"
"""SGLANG_INVARIANT_CHECK's strict level (InvariantCheckLevel.STRICT): a breached check raises"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    spec: RunSpec
    interval: int

    @property
    def page_size(self) -> int:
        return self.spec.pool.page_size


def cases():
    """The Hypothesis strategy of ``Case``s SGLang can express."""
    from hypothesis import assume
    from hypothesis import strategies as st

    from ..serving.eviction import EvictionSpec
    from ..fuzz.strategies import run_specs

    @st.composite
    def draw_case(draw: st.DrawFn) -> Case:
        spec = draw(run_specs(DRAW_TARGET))
        # drafts are dropped, not filtered: SGLang's schedule here runs no draft worker, and a timeline without
        # its drafts needs fewer slots than the pool was sized for, so it stays valid
        # nor a prefix cache: SGLang's radix tree acts otherwise than the miniature's cache in ways named per
        # library scenario (differential.PREFIX_CACHE_DIFFERENCES, pinned where they show), which a generated
        # timeline's first difference is not classified against; drawn, they would be reported as fidelity
        # findings that are those named differences or not yet known ones (docs/sglang.md)
        spec = dataclasses.replace(spec, timeline=dataclasses.replace(spec.timeline, draft_steps=0),
                                   eviction=EvictionSpec(prefix_cache=False))
        interval = draw(st.sampled_from(INTERVALS))
        from .differential import not_expressible

        assume(not_expressible(spec, interval=interval) is None)
        return Case(spec=spec, interval=interval)

    return draw_case()


@contextlib.contextmanager
def invariant_checks() -> Iterator[None]:
    """SGLang's invariant checks at their strictest while the block runs (read when each check runs)."""
    before = os.environ.get("SGLANG_INVARIANT_CHECK")
    os.environ["SGLANG_INVARIANT_CHECK"] = STRICT
    try:
        yield
    finally:
        if before is None:
            del os.environ["SGLANG_INVARIANT_CHECK"]
        else:
            os.environ["SGLANG_INVARIANT_CHECK"] = before


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    kind: str
    """'fidelity', 'SGLang raised' or 'the miniature raised'"""
    signature: str
    message: str


_NUMBER = re.compile(r"-?\d+")


def judge(case: Case) -> Failure | None:
    """The comparison of one case, or None when both sides agree throughout."""
    from . import differential

    knobs = {"page_size": case.page_size, "interval": case.interval}
    try:
        miniature = differential.trace(case.spec, installed=False, **knobs)
    except Exception as exc:  # noqa: BLE001 - the harness's own defect, reported as such
        return raised("the miniature raised", exc)
    try:
        with invariant_checks():
            sglang = differential.trace(case.spec, installed=True, **knobs)
    except Exception as exc:  # noqa: BLE001 - any exception inside SGLang is the finding
        return raised("SGLang raised", exc)
    message = differential.first_difference(miniature, sglang)
    if message is None:
        return None
    # the field, not the step or the slots: "step 3: free_swa differs: ..." -> "free_swa differs"
    what = re.sub(r"^step -?\d+: ", "", message).split(":")[0]
    return Failure(kind="fidelity", signature=f"fidelity: {_NUMBER.sub('N', what)}", message=message)


def raised(kind: str, exc: Exception, *, where: str = "") -> Failure:
    """A failure of ``kind`` for an exception: its signature the type and the message with numbers blanked
    (``where`` before it: which run raised)."""
    text = " ".join(str(exc).split())
    said = f"{where}{type(exc).__name__}"
    return Failure(kind=kind, signature=f"{kind}: {said}: {_NUMBER.sub('N', text)[:120]}", message=f"{said}: {text}")


@dataclass(frozen=True, slots=True, kw_only=True)
class TimelineFinding:
    """A shrunk failure of a property over generated timelines (``case.spec`` is the run it drew)."""

    signature: str
    kind: str
    case: Any
    """the last failing case of this signature Hypothesis tried: after shrinking, its minimal one"""
    message: str
    examples: int

    def setting(self) -> str:
        """What the case ran under besides its model, pool and requests (the property's own knobs); none here."""
        return ""

    def heading(self) -> str:
        return self.signature

    def describe(self) -> str:
        """The finding as a person reads it: its signature, the shrunk case in a line, the first failure."""
        spec = self.case.spec
        t, pool = spec.timeline, spec.pool
        requests = ", ".join(f"{r.rid}(arrive {r.arrive}, prompt {r.prompt_len}, output {r.output_len}"
                             + (f", abort {r.abort}" if r.abort is not None else "") + ")" for r in t.requests)
        return (f"{self.heading()}\n  {spec.model.name} (window {spec.model.window}), pool "
                f"{pool.full_size}/{pool.swa_size} (pages of {pool.page_size})"
                + (f", {setting}" if (setting := self.setting()) else "") + f": {requests}"
                + (f", chunk {t.chunk_size}" if t.chunk_size else "")
                + (f", drafts of {t.draft_steps} steps (top-k {t.draft_topk}), accept_lens {list(t.accept_lens)}"
                   if t.draft_steps else "") + f"\n  {self.message}")


@dataclass(frozen=True, slots=True, kw_only=True)
class DifferentialFinding(TimelineFinding):
    @property
    def key(self) -> str:
        return hashlib.sha256(f"{NAME}\n{self.signature}".encode()).hexdigest()[:8]

    def setting(self) -> str:
        prefix = "on" if self.case.spec.eviction.prefix_cache else "off"
        return f"interval {self.case.interval}, prefix cache {prefix}"


DifferentialReport = PropertyReport
"""a search's tally and its ``DifferentialFinding``s"""


def fuzz_differential(
    *,
    budget_s: float,
    seed: int = 0,
    database: Path | None = DATABASE_DEFAULT,
    shrink_s: float | None = None,
    multiple: bool = True,
    max_examples: int | None = None,
    shrink_examples: int | None = None,
    progress: Callable[[Progress], None] | None = None,
    judge_case: Callable[[Case], Failure | None] = judge,
) -> DifferentialReport:
    """Search for ``budget_s`` seconds from ``seed`` for a case where the miniature and SGLang part; every
    distinct failure found, shrunk. The options are ``search.fuzz``'s; ``judge_case`` is the comparison (a
    test's seam: a deliberately wrong one shows the search finds and shrinks what it reports)."""
    import torch

    from .installed import load

    load()  # SGLang missing or too old: its own clear error before anything is drawn
    torch.set_num_threads(1)  # tiny tensors: intra-op threads only contend with each other

    def judge_one(case: Case) -> tuple[str, object, str] | None:
        failure = judge_case(case)
        if failure is None:
            return None
        return (failure.signature, failure,
                f"{NAME} at pages of {case.page_size}, interval {case.interval}: {failure.message}")

    return search_property(
        cases(), judge_one, folder=NAME, budget_s=budget_s, seed=seed, database=database, shrink_s=shrink_s,
        multiple=multiple, max_examples=max_examples, shrink_examples=shrink_examples, progress=progress,
        finding=lambda sig, case, f, n: DifferentialFinding(signature=sig, kind=f.kind, case=case,
                                                            message=f.message, examples=n))


def property_command(target: str, *, seed: int, budget_s: float | None = None, fault: str | None = None) -> str:
    """The command line that runs a search of the fuzz property ``target`` again."""
    words = ["python", "-m", "harness", "fuzz", "--target", target]
    if fault is not None:
        words += ["--fault", fault]
    if budget_s is not None:
        words += ["--budget", f"{budget_s:g}"]
    return shlex.join([*words, "--seed", str(seed)])


def command(*, seed: int, budget_s: float | None = None) -> str:
    """The command line that runs this search again."""
    return property_command(NAME, seed=seed, budget_s=budget_s)


def finding_path(finding: DifferentialFinding, folder: Path) -> Path:
    return folder / f"fuzz_sglang_differential_{finding.key}.toml"


def write_finding(finding: DifferentialFinding, *, folder: Path, command: str) -> Path | None:
    """Write ``finding`` as a scenario file in ``folder`` (its model, pool and timeline, run by ``forward_batch``
    in eager mode, a sound design expected to match; the page size and interval in its description); None
    when its signature is written already."""
    from ..scenario.generated import scenario_of
    from ..scenario.writer import scenario_toml

    path = finding_path(finding, folder)
    if path.exists():
        return None
    case = finding.case
    # the drawn eviction (the policy the scenario checks validated the pools under), not SGLang's at the
    # case's interval: a pool near exhaustion can run dry there, and the loader's dry run would refuse it;
    # the differential test runs the file at every page size and interval drawn, the case's among them
    spec = case.spec
    where = f"pages of {case.page_size}, interval {case.interval}"
    scenario = scenario_of(
        spec, name=path.stem,
        description=(f"Found by the differential fuzzer and shrunk by Hypothesis ({finding.kind}): at {where} "
                     f"the miniature and SGLang 0.5.23 part: {finding.message}. tests/sglang/test_differential.py "
                     f"runs it and fails until the difference is fixed or named in DIFFERENCES. "
                     f"Found by: {command}"),
        tags=("generated", "fuzz", "sglang-differential"),
    )
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(scenario_toml(scenario))
    return path


def main(args) -> int:
    """``python -m harness fuzz --target sglang-differential``: search, print each finding, write it."""
    import sys

    from ..fuzz.regression import REGRESSIONS_DEFAULT
    from .installed import UnsupportedSGLang

    tty = sys.stderr.isatty()
    try:
        report = fuzz_differential(budget_s=args.budget, seed=args.seed, progress=progress_printer(NAME, tty),
                                   database=Path(args.database) if args.database else DATABASE_DEFAULT)
    except (ImportError, UnsupportedSGLang) as exc:
        print(f"--target {NAME}: needs the installed SGLang (run it with .venv-sglang/bin/python): {exc}",
              file=sys.stderr)
        return 2
    folder = Path(args.out) if args.out else REGRESSIONS_DEFAULT
    return print_findings(NAME, report, tty=tty,
                          write=None if args.no_write else
                          lambda finding: write_finding(finding, folder=folder, command=command(seed=args.seed)),
                          already=lambda finding: str(finding_path(finding, folder)))


__all__ = ["INTERVALS", "NAME", "Case", "DifferentialFinding", "DifferentialReport", "Failure", "TimelineFinding",
           "cases", "command", "finding_path", "fuzz_differential", "invariant_checks", "judge", "main",
           "property_command", "raised", "write_finding"]

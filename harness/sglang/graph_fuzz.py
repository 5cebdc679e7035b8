"""The graph-runner property under the SGLang target: on every generated decode timeline SGLang can express, its
own ``DecodeCudaGraphRunner`` over its ``TRTLLMHAAttnBackend`` (``graph_runner.run_timeline``), captured and
replayed on the tape, leaves both pools as the eager run of the same SGLang code does, slot by slot, and that
eager run is certified by the dense oracle.

A case is a timeline drawn by ``strategies.run_specs`` moved onto the installed SGLang before its pools are
sized (its free order, its eviction at the drawn interval: the pools run near exhaustion under SGLang's own
frontier), in ``full`` mode over the drawn decode buckets, without a prefix cache (the radix cache is the
scheduler's, not the runner's); a drawn draft stays as a chain verified by the target, whose verifies run through
SGLang's ``TARGET_VERIFY`` path and its runner's verify graphs (``target_verify.py``) and its ``DRAFT_EXTEND_V2``
draft-extends eagerly, a tree becoming a chain and a v1 draft-extend or an unverified draft dropped (what that
path refuses); without a layer whose window is one
token (``one_token_window``: a finding of its own), and maybe one of the re-created
faults of SGLang's graph path (``GRAPH_FAULTS``), active in the replayed run only. It fails in one of three ways:

- **the reference is not certified**: the eager run of SGLang's code disagrees with the dense oracle (a
  candidate defect of the real code, or of the CPU stand-ins under it);
- **the replay differs**: some slot of some pool differs between the replayed and the eager run;
- **raised**: either run raised (SGLang's own asserts included).

Each failure's signature is its kind and pool (or the exception's type and message, numbers blanked). A finding
is written once per signature under ``scenarios/regressions/``, tagged ``sglang-graph`` and, with a fault,
``graph-fault:NAME``; as a library scenario it runs the timeline through the harness's own runners (a sound
design, expected to match), and ``tests/sglang/test_graph_regressions.py`` replays it through SGLang's runner:
with its fault it must still fail the same way, without it it must hold.

The SGLang target registers ``main`` as the fuzz property ``sglang-graph``: ``python -m harness fuzz --target
sglang-graph [--fault NAME]``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from ..fuzz.search import (DATABASE_DEFAULT, Progress, PropertyReport, print_findings, progress_printer,
                           search_property)
from ..fuzz.target import FuzzTarget
from ..imports import load_named
from ..runspec import Mode, RunSpec
from ..serving.eviction import EvictionSpec
from ..serving.timeline import DRAFT_EXTEND_V2
from .fuzz import Failure, TimelineFinding, property_command, raised

NAME = "sglang-graph"
"""the property's name on the command line and its example database folder"""

GRAPH_FAULTS = {
    "metadata_not_refreshed_on_replay": "harness.sglang.trtllm_faults:metadata_not_refreshed_on_replay",
    "swa_pad_tail_left_stale": "harness.sglang.trtllm_faults:swa_pad_tail_left_stale",
    "swa_loc_not_preset_before_capture": "harness.sglang.trtllm_faults:swa_loc_not_preset_before_capture",
    "padded_out_cache_loc_left_stale": "harness.sglang.graph_runner:padded_out_cache_loc_left_stale",
    "verify_graph_swa_metadata_not_refreshed": "harness.sglang.trtllm_faults:verify_graph_swa_metadata_not_refreshed",
}
"""the re-created faults of SGLang's graph path this property can switch on (docs/sglang-graphs.md); the pre-fix
``_get_layer_cache_loc`` acts only under the overlap ordering, which this property does not run"""

FAULT_TAG = "graph-fault:"
TAG = "sglang-graph"
ATTENTION = "trtllm_mha"


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphCase:
    spec: RunSpec
    fault: str | None = None


def cases(fault: str | None = None):
    """The Hypothesis strategy of ``GraphCase``s SGLang's runner can take, with ``fault`` on each."""
    from hypothesis import assume
    from hypothesis import strategies as st

    from ..fuzz.strategies import run_specs
    from .differential import not_expressible
    from .library import pools_too_small

    draw_target = FuzzTarget(design="forward_batch", mode=Mode.FULL, serving="sglang")

    @st.composite
    def draw_case(draw: st.DrawFn) -> GraphCase:
        spec = draw(run_specs(draw_target))
        spec = runnable(spec)
        # not_expressible refuses drafts for SGLang's own schedule (no draft worker); run_timeline drives a verified
        # chain itself, so the rest of the case is checked without its drafts
        plain = dataclasses.replace(spec, timeline=dataclasses.replace(spec.timeline, draft_steps=0, accept_lens=()))
        assume(not_expressible(plain) is None and one_token_window(spec) is None)
        assume(pools_too_small(_as_scenario(spec)) is None)
        return GraphCase(spec=spec, fault=fault)

    return draw_case()


def runnable(spec: RunSpec) -> RunSpec:
    """``spec`` as the property runs it. What the runner's speculative path cannot take is dropped, not filtered
    (without it the timeline needs no more slots than its pools were sized for, so it stays valid): a tree
    becomes a chain (and loses its draft-extend), a v1 draft-extend goes (0.5.23 has only the V2 form, which stays:
    ``run_timeline`` runs it through SGLang's ``DRAFT_EXTEND_V2`` path after each verify), drafts without a verify
    go; a chain verified by the target stays (``run_timeline`` drives it through SGLang's ``TARGET_VERIFY`` path). The
    eviction is SGLang's at the drawn interval, spelled as ``run_timeline`` reads it (the harness's model of it,
    which the differential test holds to SGLang's)."""
    # a v1 draft-extend has no SGLang form to run; a V2 one runs after each verify (eagerly)
    v2 = spec.timeline.draft_extend_v2 and spec.timeline.draft_topk == 1
    timeline = dataclasses.replace(spec.timeline, draft_topk=1, draft_extend=DRAFT_EXTEND_V2 if v2 else False)
    if not timeline.verifies:
        timeline = dataclasses.replace(timeline, draft_steps=0, accept_lens=())
    return dataclasses.replace(spec, timeline=timeline,
                               eviction=EvictionSpec(policy="sglang", interval=spec.eviction.interval))


def one_token_window(spec: RunSpec) -> str | None:
    """Why SGLang's model layer cannot express ``spec``'s windows, or None: ``RadixAttention`` stores
    ``sliding_window_size or -1``, so a layer whose window is its own token alone (``sliding_window_size`` 0 in
    SGLang's W - 1 convention) attends as a full layer (docs/findings.md); drawn anyway, every such case would
    be that one finding again."""
    narrow = [i for i in range(spec.model.num_layers) if spec.model.layer_window(i) == 1]
    if narrow:
        return (f"layers {narrow} have a window of 1 token: SGLang's RadixAttention reads sliding_window_size 0 "
                "as no window (docs/findings.md)")
    return None


def _as_scenario(spec: RunSpec):
    from ..scenario.generated import scenario_of

    return scenario_of(spec, name="fuzzed", description="a generated case")


GraphFailure = Failure
"""kind: 'the reference is not certified', 'the replay differs' or 'raised'"""


def judge(case: GraphCase) -> GraphFailure | None:
    """One case: the eager run (certified), then the replayed run under the case's fault; None when it holds."""
    from ..fuzz.driven import graph_engine, step_certifier
    from . import graph_runner

    spec = case.spec
    observe, certification = step_certifier(spec)
    try:
        eager = graph_runner.run_timeline(spec, engine=None, attention=ATTENTION, observe=observe)
    except Exception as exc:  # noqa: BLE001 - any exception of the eager run is the finding
        return raised("raised", exc, where="the eager run raised ")
    certified = certification()
    if not certified.ok:
        return GraphFailure(kind="the reference is not certified", signature="the reference is not certified",
                            message="; ".join(certified.problems))
    fault = load_named(case.fault, GRAPH_FAULTS, kind="graph fault",
                       check=lambda o: None if callable(o) else "not a context manager") if case.fault else None
    try:
        with fault() if fault is not None else nullcontext():
            graph = graph_runner.run_timeline(spec, engine=graph_engine(), attention=ATTENTION)
    except Exception as exc:  # noqa: BLE001
        return raised("raised", exc, where="the replayed run raised ")
    if differences := graph_runner.kv_differences(eager, graph):
        first = differences[0]
        pools = sorted({d.pool for d in differences})
        return GraphFailure(kind="the replay differs", signature=f"the replay differs in the {' and '.join(pools)} "
                                                                 f"pool{'s' if len(pools) > 1 else ''}",
                            message=f"{len(differences)} slots differ from the eager run; the first: {first.pool} "
                                    f"pool, layer {first.layer}, slot {first.slot} (max |diff| {first.max_abs:.3g}); "
                                    f"buckets replayed: {sorted({d.bucket for d in graph.decodes if d.bucket})}"
                                    + (f", verify buckets replayed: {sorted({v.bucket for v in graph.verifies if v.bucket})}"
                                       if graph.verifies else ""))
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphFinding(TimelineFinding):
    @property
    def key(self) -> str:
        return hashlib.sha256(f"{NAME}\n{self.case.fault}\n{self.signature}".encode()).hexdigest()[:8]

    def heading(self) -> str:
        return self.signature + (f" with {self.case.fault}" if self.case.fault else "")

    def setting(self) -> str:
        spec = self.case.spec
        return f"interval {spec.eviction.interval}, decode buckets {list(spec.graphs.decode_buckets)}"


GraphReport = PropertyReport
"""a search's tally and its ``GraphFinding``s"""


def fuzz_graph_runner(
    *,
    budget_s: float,
    fault: str | None = None,
    seed: int = 0,
    database: Path | None = DATABASE_DEFAULT,
    shrink_s: float | None = None,
    multiple: bool = True,
    max_examples: int | None = None,
    shrink_examples: int | None = None,
    progress: Callable[[Progress], None] | None = None,
) -> GraphReport:
    """Search for ``budget_s`` seconds from ``seed`` (with ``fault`` on in every replayed run) for a case where
    the property fails; every distinct failure found, shrunk. The options are ``search.fuzz``'s."""
    import torch

    from .installed import load

    if fault is not None and fault not in GRAPH_FAULTS:
        raise ValueError(f"--fault: {fault!r} is not a fault of SGLang's graph path; known: {', '.join(GRAPH_FAULTS)}")
    load()  # SGLang missing or too old: its own clear error before anything is drawn
    torch.set_num_threads(1)  # tiny tensors: intra-op threads only contend with each other

    def judge_one(case: GraphCase) -> tuple[str, object, str] | None:
        failure = judge(case)
        if failure is None:
            return None
        return failure.signature, failure, f"{NAME}: {failure.message}"

    return search_property(
        cases(fault), judge_one, folder=NAME if fault is None else f"{NAME}-{fault}", budget_s=budget_s, seed=seed,
        database=database, shrink_s=shrink_s, multiple=multiple, max_examples=max_examples,
        shrink_examples=shrink_examples, progress=progress,
        finding=lambda sig, case, f, n: GraphFinding(signature=sig, kind=f.kind, case=case, message=f.message,
                                                     examples=n))


def command(*, seed: int, fault: str | None = None, budget_s: float | None = None) -> str:
    """The command line that runs this search again."""
    return property_command(NAME, seed=seed, budget_s=budget_s, fault=fault)


def finding_path(finding: GraphFinding, folder: Path) -> Path:
    return folder / f"fuzz_sglang_graph_{finding.key}.toml"


def write_finding(finding: GraphFinding, *, folder: Path, command: str) -> Path | None:
    """Write ``finding`` as a scenario file in ``folder``: its model, pool, graphs and timeline, run in the
    library by ``forward_batch`` in full mode (a sound design, expected to match), tagged for the SGLang graph
    replay (``case_of``); None when its signature is written already."""
    from ..scenario.generated import scenario_of
    from ..scenario.writer import scenario_toml

    path = finding_path(finding, folder)
    if path.exists():
        return None
    case = finding.case
    tags = (TAG, *((f"{FAULT_TAG}{case.fault}",) if case.fault else ()))
    with_fault = f" with {case.fault} in the replayed run" if case.fault else ""
    scenario = scenario_of(
        case.spec, name=path.stem,
        description=(f"Found by the graph-runner fuzzer and shrunk by Hypothesis{with_fault}: SGLang 0.5.23's "
                     f"decode graph runner over its TRT-LLM MHA backend, replayed on the tape: {finding.message}. "
                     f"tests/sglang/test_graph_regressions.py replays it through SGLang's runner. Found by: "
                     f"{command}"),
        tags=("generated", "fuzz", *tags),
    )
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(scenario_toml(scenario))
    return path


def case_of(scenario) -> GraphCase:
    """The case a written finding replays: its run spec in full mode, and the fault its tags name."""
    faults = [t.removeprefix(FAULT_TAG) for t in scenario.tags if t.startswith(FAULT_TAG)]
    spec = scenario.run_spec(design=scenario.designs[0], mode=Mode.FULL, backend=scenario.backends[0])
    return GraphCase(spec=spec, fault=faults[0] if faults else None)


def main(args) -> int:
    """``python -m harness fuzz --target sglang-graph [--fault NAME]``: search, print each finding, write it."""
    import sys

    from ..fuzz.regression import REGRESSIONS_DEFAULT
    from .installed import UnsupportedSGLang

    if len(args.fault) > 1:
        print(f"--target {NAME}: one --fault at a time, got {', '.join(args.fault)}", file=sys.stderr)
        return 2
    fault = args.fault[0] if args.fault else None
    tty = sys.stderr.isatty()
    label = NAME + (f" with {fault}" if fault else "")
    try:
        report = fuzz_graph_runner(budget_s=args.budget, fault=fault, seed=args.seed,
                                   progress=progress_printer(label, tty),
                                   database=Path(args.database) if args.database else DATABASE_DEFAULT)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    except (ImportError, UnsupportedSGLang) as exc:
        print(f"--target {NAME}: needs the installed SGLang (run it with .venv-sglang/bin/python): {exc}",
              file=sys.stderr)
        return 2
    folder = Path(args.out) if args.out else REGRESSIONS_DEFAULT
    again = command(seed=args.seed, fault=fault)
    return print_findings(label, report, tty=tty,
                          write=None if args.no_write else
                          lambda finding: write_finding(finding, folder=folder, command=again),
                          already=lambda finding: str(finding_path(finding, folder)))


__all__ = ["GRAPH_FAULTS", "NAME", "GraphCase", "GraphFailure", "GraphFinding", "GraphReport", "case_of", "cases",
           "command", "finding_path", "fuzz_graph_runner", "judge", "main", "one_token_window", "write_finding"]

"""Case results to view models: the one place that reads the checking layer's objects."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import shlex
import site
import sys
import sysconfig
from pathlib import Path

from ..check.matrix.case import LIKE, Case, CaseResult
from ..check.diff.diff import KVMismatch
from ..check.run.result import RunError, StepRecord
from ..check.matrix.verdict import MismatchCount
from ..imports import is_import_path
from ..runners.observations import GraphObservations
from ..runspec import Device, Engine
from ..scenario.spec import ScenarioSpec
from ..serving.kv_groups import KVGroups
from ..serving.registry import stack_class, stack_kv_groups
from ..serving.stack import stack_spec
from .slots import groups_of
from .views import (
    CaseView,
    ErrorView,
    FindingView,
    ForwardView,
    FrameView,
    GraphView,
    GroupView,
    HeatView,
    MismatchView,
    SetupView,
    StepView,
    TokenSlotsView,
)


def case_view(result: CaseResult | None, *, case: Case | None = None, duration_s: float = 0.0) -> CaseView:
    """The view of a finished case, or of a skipped one (``result`` None, ``case`` given)."""
    case = result.case if result is not None else case
    assert case is not None
    verdict = result.verdict if result is not None else None
    diff = verdict.diff if verdict is not None else None
    details = tuple(_mismatch(m) for m in diff.mismatches) if diff else ()
    error = verdict.error if verdict is not None else None
    scenario = case.scenario
    pytest_cmd, cli_cmd = reproduce(case)
    return CaseView(
        name=case.name, scenario=scenario.name, path=_display_path(scenario.path), description=scenario.description,
        tags=scenario.tags, references=scenario.references, design=case.design, mode=str(case.mode), backend=case.backend, engine=str(case.engine),
        device=str(case.device), faults=tuple(sorted(case.faults)),
        clean_rerun=not case.with_faults and bool(scenario.faults), expected=str(case.expected),
        verdict=str(verdict.outcome) if verdict is not None else "skipped", why=case.why,
        skip_reason=case.unsupported if verdict is None else None,
        mismatches=diff.total if diff else 0, mismatched_slots=diff.mismatched_slots if diff else 0,
        classes=tuple(diff.classes) if diff else (), dummy_writes=diff.dummy_writes if diff else 0,
        steps_compared=diff.steps_compared if diff else 0, first=details[0] if details else None, details=details,
        error=_error(error) if error else None,
        graph=_graph(verdict.observations) if verdict is not None else None,
        reproduce_pytest=pytest_cmd, reproduce_cli=cli_cmd, duration_s=round(duration_s, 3),
        setup=setup_view(scenario), steps=tuple(_step(s) for s in verdict.steps) if verdict is not None else (),
        heat=tuple(_heat(c) for c in verdict.counts) if verdict is not None else (),
        added_design=not case.listed, judged_by=case.judged_by,
        schedule_note=diff.schedule_note if diff else None,
    )


def setup_view(scenario: ScenarioSpec) -> SetupView:
    """The scenario's setup, its KV groups as its serving stack declares them (SGLang's two when the stack
    cannot be loaded: its runs failed, and say why)."""
    model, pool, timeline, graphs = scenario.model, scenario.pool, scenario.timeline, scenario.graphs
    declared = _declared_groups(scenario)
    layers = (tuple(declared.of_layer(i).name for i in range(model.num_layers)) if declared is not None
              else tuple(model.layer_pattern))  # SGLang's group names are its layer kinds
    setup = SetupView(
        model=model.name, layers=layers, window=model.window, full_size=pool.full_size,
        swa_size=pool.swa_size, kv_dtype=pool.kv_dtype, model_seed=model.seed, timeline_seed=timeline.seed,
        decode_buckets=tuple(graphs.decode_buckets), prefill_buckets=tuple(graphs.prefill_buckets),
        chunk_size=timeline.chunk_size, draft_steps=timeline.draft_steps, page_size=pool.page_size,
        eviction=scenario.eviction.policy, serving=scenario.serving,
    )
    if declared is None:
        return setup
    groups = tuple(GroupView(name=g.name, label=g.title, size=g.size, window=g.window, layers=g.layer_ids)
                   for g in declared)
    # SGLang's two groups are what the fields above already say: records keep their shape for them
    return setup if groups_of(setup) == groups else dataclasses.replace(setup, groups=groups)


def _declared_groups(scenario: ScenarioSpec) -> KVGroups | None:
    try:
        return stack_kv_groups(stack_class(scenario.serving), stack_spec(scenario.model, scenario.pool))
    except (KeyError, ImportError, ValueError):  # a stack that does not load or keep its contract: its runs say why
        return None


def _step(s: StepRecord) -> StepView:
    return StepView(
        index=s.index, kind=s.kind, batch_size=s.batch_size, tokens=s.tokens,
        forwards=tuple(ForwardView(path=str(f.path), rows=f.rows, bucket=f.bucket, captured=f.captured,
                                   graph=f.graph) for f in s.forwards),
        written=tuple(TokenSlotsView(rid=t.rid, pos=t.pos, slots=t.slots) for t in s.written),
        evicted=tuple((k.rid, k.pos) for k in s.evicted), finished=s.finished, aborted=s.aborted,
    )


def _heat(c: MismatchCount) -> HeatView:
    return HeatView(step=c.step, pool=c.pool, layer=c.layer, count=c.count)


def reproduce(case: Case) -> tuple[str, str]:
    """Shell command lines that rerun one case, quoted so that any scenario path pastes safely.

    They carry what the case was made with: a design or backend the scenario does not list and the
    expectation it was judged by, a runner named by import path, a CUDA device, and (before the command) the
    ``PYTHONPATH`` folders the modules it names by import path were found in.
    """
    path = _display_path(case.scenario.path)
    added_design = not case.listed
    expect = None if case.judgement.by_default else (
        f"{LIKE}{case.like}" if case.like is not None else case.expected_override)
    pytest_args = ["pytest", f"{path}::{case.name}"]
    cli_args = ["python", "-m", "harness", "run", path, "--design", case.design, "--mode", str(case.mode),
                "--backend", case.backend, "--engine", str(case.engine)]
    if added_design:
        pytest_args += ["--harness-design", case.design]
        if expect is not None:
            pytest_args += ["--harness-expect", expect]
            cli_args += ["--expect", expect]
    if case.backend not in case.scenario.backends:
        pytest_args += ["--harness-backend", case.backend]
    if case.runner is not None:
        pytest_args += ["--harness-runner", f"{case.mode}={case.runner}"]
        cli_args += ["--runner", f"{case.mode}={case.runner}"]
    if case.device == Device.CUDA:
        pytest_args += ["--harness-device", str(case.device)]
        cli_args += ["--device", str(case.device)]
    if case.engine != (Engine.CUDA if case.device == Device.CUDA else Engine.TAPE):
        pytest_args += ["--harness-engine", str(case.engine)]
    serving = case.scenario.serving
    if (own := _file_serving(str(Path(case.scenario.path).resolve()))) is not None and serving != own:  # --serving replaced it
        pytest_args += ["--harness-serving", serving]
        cli_args += ["--serving", serving]
    folders = dict.fromkeys(f for name in (case.design, case.backend, case.runner or "", serving)
                            if (f := _import_folder(name)) is not None)
    prefix = ""
    if folders:
        prefix = "PYTHONPATH=" + ":".join(map(shlex.quote, folders)) + '"${PYTHONPATH:+:$PYTHONPATH}" '
    return prefix + shlex.join(pytest_args), prefix + shlex.join(cli_args)


@functools.lru_cache(maxsize=256)
def _file_serving(path: str) -> str | None:
    """The serving stack the scenario file itself names; None for a file that does not read (a scenario made
    in memory), whose stack the command lines then leave to the file as before."""
    from ..scenario.loader import ScenarioError, load_scenario

    try:
        return load_scenario(path, full=False).serving
    except ScenarioError:
        return None


def _import_folder(name: str) -> str | None:
    """The folder to put on ``PYTHONPATH`` for the module an import path names (shown like a scenario path);
    None for a registered name, a module Python finds anyway (the harness's, installed ones) or none found."""
    # the answer depends on where Python looks and what the folder is shown relative to: both are the key, so
    # a worker process that moved to another folder (a test's project copy) is not told the first one's
    return _import_folder_from(name, os.getcwd(), tuple(sys.path))


@functools.lru_cache(maxsize=256)
def _import_folder_from(name: str, cwd: str, search_path: tuple[str, ...]) -> str | None:
    if not is_import_path(name):
        return None
    top = name.partition(":")[0].split(".")[0]
    try:
        spec = importlib.util.find_spec(top)  # a top-level name: found on sys.path, nothing imported
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("built-in", "frozen", "namespace"):
        origin = Path(spec.origin)
        folder = origin.parent.parent if origin.name == "__init__.py" else origin.parent
    elif spec.submodule_search_locations:
        folder = Path(next(iter(spec.submodule_search_locations))).parent
    else:
        return None
    if folder.resolve() in _found_anyway():
        return None
    return _display_path(folder)


@functools.lru_cache(maxsize=1)
def _found_anyway() -> frozenset[Path]:
    """Folders every Python of this environment searches: site-packages, the standard library, and the one
    holding the harness (which a reproduce line needs importable in any case)."""
    folders = [*site.getsitepackages(), site.getusersitepackages(),
               *(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")),
               Path(__file__).resolve().parents[2]]
    return frozenset(Path(f).resolve() for f in folders)


def _error(error: RunError) -> ErrorView:
    return ErrorView(type=error.type, message=error.message, step=error.step,
                     frames=tuple(FrameView(file=_frame_file(f.file), line=f.line, function=f.function)
                                  for f in error.frames))


_HARNESS_PARENT = Path(__file__).resolve().parents[2]


def _frame_file(file: str) -> str:
    """A frame's file as a user finds it: the harness's own as ``harness/...`` wherever it is installed (so a
    record does not depend on where), any other relative to the working directory when inside it."""
    path = Path(file)
    try:
        return f"harness/{path.resolve().relative_to(_HARNESS_PARENT / 'harness').as_posix()}"
    except (ValueError, OSError):
        return _display_path(path)


def _mismatch(m: KVMismatch) -> MismatchView:
    return MismatchView(step=m.step, pool=m.pool, layer=m.layer, slot=m.slot, owner=f"{m.rid}@{m.pos}", what=m.what,
                        classification=m.classification, detail=m.detail, holder=m.holder, found_in=m.found_in,
                        written_at=m.written_at)


def _graph(obs: GraphObservations | None) -> GraphView | None:
    if obs is None:
        return None
    return GraphView(
        captures=obs.captures, replays=obs.replays, padded_replays=obs.padded_replays,
        eager_fallbacks=obs.eager_fallbacks,
        findings=tuple(FindingView(kind=str(f.kind), graph=f.graph, path=f.path, dtype=f.dtype, shape=tuple(f.shape),
                                   replays=f.replays, captured=f.captured, now=f.now) for f in obs.findings),
        rerun_ops=tuple(obs.rerun_ops), notes=tuple(obs.notes), forwards=tuple(obs.forwards),
    )


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)

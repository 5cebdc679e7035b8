"""Scenario files as pytest items, shaped like pytest's "non-python tests" example.

``scenarios/swa_prefill_window_edge.toml`` yields ``swa_prefill_window_edge[stale_state-piecewise-torch_native]``
and its siblings, one per (design, mode, backend), plus one item per backend that certifies the
scenario's reference run against the dense oracle. An item whose backend cannot run its case (by the
backend's declaration) is skipped with the reason; one whose backend runs only on CUDA is marked ``gpu``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Iterator

import pytest

from .check.matrix.quick import quick_names
from .check.matrix.case import Case, CaseResult, Selection, cases
from .check.run.oracle import certify_run
from .check.matrix.matrix import NOT_CERTIFIED, run_cases, scenario_reference
from .check.run.result import RunError
from .check.matrix.verdict import Verdict
from .check.run.workers import DIST_INPUT, SESSION_DIR_INPUT, RunningMarks
from .runspec import Outcome
from .report.build import case_view
from .runners.registry import runner_option
from .report.session import RECORD_ATTRIBUTE
from .report.text import failure_block, first_divergence, printable
from .report.views import CaseView
from .scenario.loader import ScenarioError, load_scenario
from .scenario.spec import ScenarioSpec


class ScenarioMismatch(Exception):
    """The observed verdict is not the one the scenario file expects."""

    def __init__(self, view: CaseView) -> None:
        super().__init__(view.name)
        self.view = view


class ReferenceNotCertified(Exception):
    pass


def selection_of(config: pytest.Config) -> Selection:
    """The cells the scenario items run: ``--harness-device``, ``--harness-engine`` (None picks each case's
    default), ``--harness-timeout`` (None keeps each scenario's own), and what ``--harness-design``,
    ``--harness-backend`` and ``--harness-runner`` add to every scenario."""
    options = config.option
    return Selection(device=getattr(options, "harness_device", "cpu") or "cpu",
                     engine=getattr(options, "harness_engine", None),
                     timeout_s=getattr(options, "harness_timeout", None),
                     extra_designs=getattr(options, "harness_design", None) or (),
                     extra_backends=getattr(options, "harness_backend", None) or (),
                     runners=dict(runner_option(t) for t in getattr(options, "harness_runner", None) or ()))


class ScenarioFile(pytest.File):
    def collect(self) -> Iterator[pytest.Item]:
        try:
            scenario = load_scenario(self.path)
        except ScenarioError as err:
            yield BadScenarioItem.from_parent(self, name=f"{printable(self.path.stem)}[load]", error=err)
            return
        if (stack := getattr(self.config.option, "harness_serving", None)) is not None:
            scenario = dataclasses.replace(scenario, serving=stack)  # --harness-serving: what every scenario runs on
        seen_backends: set[str] = set()
        # how an added design is judged (--harness-expect); None: the default expectation
        expect = getattr(self.config.option, "harness_expect", None)
        listed = cases(scenario, selection_of(self.config), expect=expect)
        quick = quick_names(listed)
        for case in listed:
            if case.backend not in seen_backends:
                seen_backends.add(case.backend)
                oracle = OracleItem.from_parent(self, name=f"{scenario.name}[oracle-{case.backend}]",
                                                scenario=scenario, backend=case.backend, device=case.device,
                                                timeout_s=case.timeout_s, declaration_error=case.declaration_error)
                _mark(oracle, case, quick=case.backend not in scenario.backends[1:])
                yield oracle
            item = ScenarioItem.from_parent(self, name=case.name, case=case)
            # tags select with -k, like names do; they are not markers, so no registration is needed
            item.extra_keyword_matches.update(scenario.tags)
            _mark(item, case, quick=case.name in quick)
            yield item


def _mark(item: pytest.Item, case: Case, *, quick: bool) -> None:
    if case.device == "cuda" or case.engine == "cuda":
        item.add_marker("gpu")
    if not quick:
        # what the quick suite (make test) can leave to the full one (make test-slow, CI runs both): a verdict
        # the design gives in another mode too, the scenario's other backends, a fault scenario's clean
        # reruns (check/matrix/quick.py)
        item.add_marker("slow")
    if case.unsupported is not None:
        item.add_marker(pytest.mark.skip(reason=case.unsupported))


class ScenarioItem(pytest.Item):
    def __init__(self, *, case: Case, **kwargs) -> None:
        super().__init__(**kwargs)
        self.case = case

    def runtest(self) -> None:
        start = time.perf_counter()
        marks = _running_marks(self.config)
        if marks is not None and (who := marks.crashed(self.nodeid)) is not None:
            result = _crashed(self.case, who)  # running it again would kill this worker too
            marks.forget(self.nodeid)
        else:
            # in a child process under the case's time limit: a design that exits, aborts or hangs is an error;
            # marked while it runs, in case it takes this whole worker down
            with marks.running(self.nodeid) if marks is not None else contextlib.nullcontext():
                result = _batches(self.session).result(self)
        view = case_view(result, duration_s=result.duration_s if result.duration_s is not None
                         else time.perf_counter() - start)
        _hand_over(self, view)
        if not view.ok:
            raise ScenarioMismatch(view)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ScenarioMismatch):
            return failure_block(excinfo.value.view)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, 0, self.name  # pytest places marker skips at (path, line): an int is required


def _hand_over(item: pytest.Item, view: CaseView) -> None:
    """Give JUnit XML the verdict, the expectation and at most a one-line first divergence; give the report
    session the whole record, which the plugin puts on the test report (pytest-xdist sends it along)."""
    # user_properties are written into JUnit XML as they are: a whole record there was 6.5 KB per passing
    # item and 49 KB per diverging one
    item.user_properties.append(("expected", view.expected))
    item.user_properties.append(("verdict", view.verdict))
    if not view.ok and (first := first_divergence(view)):
        item.user_properties.append(("first_divergence", first))
    setattr(item, RECORD_ATTRIBUTE, json.dumps(view.to_record(timing=True)))


def _running_marks(config: pytest.Config) -> RunningMarks | None:
    """Under pytest-xdist, where this worker marks the item it runs (``plugin._share_running_marks``)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or SESSION_DIR_INPUT not in workerinput:
        return None
    return RunningMarks(Path(workerinput[SESSION_DIR_INPUT]),
                        f"pytest-xdist worker {workerinput.get('workerid', '?')} (pid {os.getpid()})")


def _crashed(case: Case, who: str) -> CaseResult:
    error = RunError(type="WorkerDied", message=f"the {who} died running this case; it was not run again",
                     step=None)
    return CaseResult(case=case, verdict=Verdict(outcome=Outcome.ERROR, diff=None, error=error))


class _Batches:
    """Scenario items run ahead, together with the first of their file to run (``matrix.run_cases`` gives a
    scenario's built-in cases one child), their results kept here by node id until their turn comes."""

    def __init__(self, session: pytest.Session) -> None:
        self._session = session
        self._ahead: dict[str, CaseResult] = {}
        self._position: dict[str, int] | None = None
        # under pytest-xdist a file's items share a child only where the file's items all go to one worker
        workerinput = getattr(session.config, "workerinput", None)
        self._together = workerinput is None or workerinput.get(DIST_INPUT) in ("loadfile", "loadscope")

    def result(self, item: ScenarioItem) -> CaseResult:
        if (ahead := self._ahead.pop(item.nodeid, None)) is not None:
            return ahead
        batch = [item, *self._siblings_after(item)] if self._together and item.case.builtin else [item]
        results = run_cases([i.case for i in batch], jobs=1)
        for sibling, result in zip(batch[1:], results[1:]):
            self._ahead[sibling.nodeid] = result
        return results[0]

    def _siblings_after(self, item: ScenarioItem) -> list[ScenarioItem]:
        items = self._session.items
        if self._position is None:
            self._position = {it.nodeid: k for k, it in enumerate(items)}
        start = self._position.get(item.nodeid)
        if start is None:
            return []
        return [it for it in items[start + 1:]
                if isinstance(it, ScenarioItem) and it.parent is item.parent and it.case.builtin
                and it.case.unsupported is None and it.nodeid not in self._ahead]


_BATCHES = pytest.StashKey[_Batches]()


def _batches(session: pytest.Session) -> _Batches:
    if _BATCHES not in session.stash:
        session.stash[_BATCHES] = _Batches(session)
    return session.stash[_BATCHES]


class OracleItem(pytest.Item):
    """The scenario's reference run agrees with the float64 dense oracle on every live slot and hidden state."""

    def __init__(self, *, scenario: ScenarioSpec, backend: str, device: str, timeout_s: float,
                 declaration_error: str | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.scenario = scenario
        self.backend = backend
        self.device = device
        self.timeout_s = timeout_s
        self.declaration_error = declaration_error
        """the backend does not load (``Case.declaration_error``): this item fails saying so"""

    def runtest(self) -> None:
        if self.declaration_error is not None:
            raise ReferenceNotCertified(f"no reference run: {self.declaration_error}")
        reference = scenario_reference(self.scenario, backend=self.backend, device=self.device, isolate=True,
                                       timeout_s=self.timeout_s)
        spec = reference.spec
        if reference.error is not None and reference.error.type == NOT_CERTIFIED:  # certified already, for a plug-in
            raise ReferenceNotCertified(reference.error.message)
        if reference.error is not None:
            raise ReferenceNotCertified(f"reference run failed at step {reference.error.step}: "
                                        f"{reference.error.type}: {reference.error.message}")
        cert = certify_run(reference.snapshots, spec)
        if not cert.ok:
            raise ReferenceNotCertified("reference run disagrees with the dense oracle:\n  " + "\n  ".join(cert.problems))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ReferenceNotCertified):
            return printable(f"{self.name}: {excinfo.value}", keep_newlines=True)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, 0, self.name  # pytest places marker skips at (path, line): an int is required


class BadScenarioItem(pytest.Item):
    """A scenario file that does not load fails as one item; the other files still run."""

    def __init__(self, *, error: ScenarioError, **kwargs) -> None:
        super().__init__(**kwargs)
        self.error = error

    def runtest(self) -> None:
        raise self.error

    def repr_failure(self, excinfo, style=None):
        # one escaped line per problem: a newline inside a file name must not start a line of its own
        return "\n".join(printable(p) for p in self.error.problems)

    def reportinfo(self):
        return self.path, 0, self.name  # pytest places marker skips at (path, line): an int is required


def scenario_file(parent: pytest.Collector, path: Path) -> ScenarioFile:
    """The collector of one scenario file; a path with control characters gets an escaped node id, since
    pytest prints node ids verbatim (a newline in a file name could forge result lines)."""
    try:
        rel = path.relative_to(parent.config.rootpath).as_posix()
    except ValueError:
        rel = path.as_posix()
    if rel.isprintable():
        return ScenarioFile.from_parent(parent, path=path)
    return ScenarioFile.from_parent(parent, path=path, nodeid=printable(rel))


def is_scenario_file(path: Path, rootpath: Path) -> bool:
    """A ``.toml`` file below a folder named ``scenarios`` inside the project (not above it)."""
    if path.suffix != ".toml":
        return False
    try:
        parts = path.relative_to(rootpath).parts
    except ValueError:
        parts = path.parts
    return "scenarios" in parts[:-1]

"""pytest hooks only: collection goes to ``harness.collect``, results to a ``report.session.ReportSession``."""

from __future__ import annotations

import json
import shlex
from contextlib import ExitStack
from pathlib import Path

import pytest

# light imports only: every pytest session loads this plugin (the repository's root conftest does), and its
# options, refusals and an xdist controller need no torch, pandas or scenario machinery; those come with
# the first scenario file collected or the first result gathered
from .check.workers import DIST_INPUT, SESSION_DIR_INPUT, terminate_like_ctrl_c, watch_parent
from .imports import is_import_path, name_type, unknown_name
from .options import add_plugin_option
from .report.files import destination_problems
from .report.session import RECORD_ATTRIBUTE
from .report.text import printable


def pytest_addoption(parser: pytest.Parser) -> None:
    from .check.expect import EXPECT_DEFAULT  # no torch: the command line imports it before parsing

    group = parser.getgroup("harness", "SWA CUDA-graph harness")
    # the options the command line shares, described once (options.py); what is the plugin's own: types, defaults
    add_plugin_option(group, "device", type=name_type("device", ("cpu", "cuda")), default="cpu")
    add_plugin_option(group, "engine", type=name_type("engine", ("tape", "cuda")), default=None)
    add_plugin_option(group, "timeout", type=float, default=None)
    add_plugin_option(group, "design", default=[])
    add_plugin_option(group, "expect", default=None, help_values={"expect_default": EXPECT_DEFAULT})
    add_plugin_option(group, "backend", default=[])
    add_plugin_option(group, "serving", default=None)
    add_plugin_option(group, "runner", default=[])
    add_plugin_option(group, "json", default=None)
    add_plugin_option(group, "report", default=None)


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        watch_parent()  # a controller killed with SIGKILL cannot stop its workers: they stop themselves
        from .gpuci.pinning import pin_worker

        try:
            # make test-gpu: one worker per GPU; test modules (and whatever they initialise) load later, at collection
            pin_worker()
        except (RuntimeError, ValueError) as exc:
            raise pytest.UsageError(str(exc)) from None
    _check_added_names(config)
    if (expect := config.getoption("harness_expect", None)) is not None:
        from .check.expect import expect_problem

        if problem := expect_problem(expect):
            raise pytest.UsageError(f"--harness-expect: {problem}")
    if runners := config.getoption("harness_runner", None) or ():
        from .runners.registry import runner_option

        for text in runners:
            try:
                runner_option(text)
            except ValueError as exc:
                raise pytest.UsageError(f"--harness-runner: {exc}") from None
    config.addinivalue_line("markers", "gpu: needs CUDA (skipped with a reason when no GPU is present)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    if not hasattr(config, "workerinput"):  # the xdist controller, or a plain run: where results gather
        json_path = config.getoption("harness_json", None)
        report_dir = config.getoption("harness_report", None)
        # judged before collection, so that no result is lost to a bad path once every item has run
        if problems := destination_problems(results=("--harness-json", Path(json_path) if json_path else None),
                                            folder=("--harness-report", Path(report_dir) if report_dir else None)):
            raise pytest.UsageError("; ".join(printable(p) for p in problems))
    if hasattr(config, "workerinput") or getattr(config.option, "dist", "no") == "no":
        from .check.matrix import limit_threads

        limit_threads()  # where tests run: an xdist controller runs none, and needs no torch
    if not hasattr(config, "workerinput") and getattr(config.option, "dist", "no") != "no":
        _share_running_marks(config)
    if not hasattr(config, "workerinput"):
        from .report.session import ReportSession

        signals = ExitStack()
        signals.enter_context(terminate_like_ctrl_c())  # SIGTERM ends the session as Ctrl-C does
        config.add_cleanup(signals.close)
        hooks = _ReportHooks(ReportSession(json_path=Path(json_path) if json_path else None,
                                           report_dir=Path(report_dir) if report_dir else None,
                                           command=shlex.join(["pytest", *config.invocation_params.args])))
        config.pluginmanager.register(hooks, "harness-report-session")


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix != ".toml":  # the common case, answered before the scenario machinery is imported
        return None
    from .collect import is_scenario_file, scenario_file

    # a .toml named on the command line is a scenario wherever it lives; found by walking a folder, only
    # below a folder named scenarios (so pyproject.toml and the like are never taken for one)
    if is_scenario_file(file_path, parent.config.rootpath) or parent.session.isinitpath(file_path):
        return scenario_file(parent, file_path)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any("gpu" in item.keywords for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: no GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if call.when == "call" and (record := getattr(item, RECORD_ATTRIBUTE, None)) is not None:
        # extra report attributes are serialized with the report: this is how a record leaves an xdist worker
        setattr(report, RECORD_ATTRIBUTE, record)
    return report


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    # pytest-xdist sets a worker's own --dist to "no": tell it the controller's, so that a scenario file's items
    # share a child process there only where the whole file goes to that worker (collect._Batches)
    node.workerinput[DIST_INPUT] = getattr(node.config.option, "dist", "no")
    if _MARKS_DIR in node.config.stash:
        node.workerinput[SESSION_DIR_INPUT] = node.config.stash[_MARKS_DIR]


_MARKS_DIR = pytest.StashKey[str]()


def _share_running_marks(config: pytest.Config) -> None:
    """The folder where the workers mark the scenario item each runs (``collect.ScenarioItem.runtest``):
    the worker that replaces a crashed one reports the crashed item instead of running it again."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="harness-xdist-")
    config.stash[_MARKS_DIR] = folder
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched) -> None:
    # a worker died running a scenario item it had marked: the item goes to another worker, which reports the
    # crash as the item's error verdict (its record, in the results) instead of running it again
    from .check.workers import RunningMarks

    folder = report.node.config.stash.get(_MARKS_DIR, None) if hasattr(report, "node") else None
    if folder is None or RunningMarks(Path(folder), "").crashed(crashitem) is None:
        return
    from xdist.scheduler import LoadScopeScheduling

    if not isinstance(sched, LoadScopeScheduling):  # loadfile, loadscope, loadgroup hand it out again already
        try:
            sched.mark_test_pending(crashitem)
        except NotImplementedError:
            return  # no scheduler to hand it to: xdist's own failure stands
    report.outcome = "rerun"  # type: ignore[assignment]
    report.longrepr = f"{report.longrepr}; another worker reports the crash as the item's verdict"


@pytest.hookimpl(optionalhook=True, trylast=True)
def pytest_xdist_setupnodes(config: pytest.Config, specs) -> None:
    # pytest-xdist (3.8) under -q has one status, "bringing up nodes...", and in a non-terminal writes it as the
    # workers start and again once they have collected; without this, `pytest -n 2 -q` says it twice. This
    # hook runs after xdist's own, which wrote the first: later ones write nothing under -q.
    reporter = config.pluginmanager.getplugin("terminaldistreporter")
    if config.option.verbose < 0 and reporter is not None and hasattr(reporter, "ensure_show_status"):
        reporter.ensure_show_status = lambda: None


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config):
    # the crash report ``pytest_handlecrashitem`` turned into a rerun: an R, not pytest's default F
    if report.outcome == "rerun" and report.when == "???":
        return "rerun", "R", ("RERUN", {"yellow": True})
    return None


def _check_added_names(config: pytest.Config) -> None:
    """A usage error for a design, backend or serving stack that is neither registered nor an import path,
    before collection."""
    from .backends.registry import BACKENDS
    from .serving.designs import DESIGNS
    from .serving.registry import STACKS

    for option, kind, known, also in (("harness_design", "design", DESIGNS, "an import path 'package.module:function'"),
                                      ("harness_backend", "backend", BACKENDS, "an import path 'package.module:Class'"),
                                      ("harness_serving", "serving stack", STACKS,
                                       "an import path 'package.module:Class'")):
        given = config.getoption(option, None) or ()
        for name in [given] if isinstance(given, str) else given:
            if name not in known and not is_import_path(name):
                raise pytest.UsageError(f"--{option.replace('_', '-')}: {unknown_name(kind, name, known, also=also)}")


class _ReportHooks:
    """The hooks that feed one run's ``ReportSession``; registered per config, so pytester's in-process runs
    each gather their own results."""

    def __init__(self, session: ReportSession) -> None:
        self.session = session

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" and (record := getattr(report, RECORD_ATTRIBUTE, None)) is not None:
            self.session.add_record(json.loads(record))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if any(item.path.suffix == ".toml" for item in session.items):
            self.session.expect_runs()  # an interrupt before the first result still writes what was asked

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids: list[str]) -> None:
        if any(nodeid.split("::", 1)[0].endswith(".toml") for nodeid in ids):
            self.session.expect_runs()

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # interrupted (Ctrl-C) or stopped early (-x, --maxfail): the results are not the whole selection
        stopped = exitstatus == pytest.ExitCode.INTERRUPTED or session.shouldfail or session.shouldstop
        if stopped:
            self._take_queued_reports(session.config)
        self.session.finish(complete=not stopped)
        if self.session.problems and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # pytest returns it after this hook: not all was kept

    def _take_queued_reports(self, config: pytest.Config) -> None:
        """The reports xdist's controller received from its workers but, interrupted, never processed: their
        results are in, and belong in the files (events are put back, untouched, for xdist)."""
        import queue

        dsession = config.pluginmanager.getplugin("dsession")
        events = getattr(dsession, "queue", None)
        if events is None:
            return
        taken = []
        while True:
            try:
                taken.append(events.get_nowait())
            except queue.Empty:
                break
        for name, kwargs in taken:
            if name == "testreport" and isinstance(kwargs.get("rep"), pytest.TestReport):
                self.pytest_runtest_logreport(kwargs["rep"])
            events.put((name, kwargs))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        lines = self.session.summary_lines()
        if not lines:
            return
        terminalreporter.section("SWA harness verdicts")
        for line in lines:
            terminalreporter.write_line(line)
        if self.session.results_written:
            terminalreporter.write_line(f"KV results: {self.session.json_path.resolve()}")
        if self.session.report_line():
            terminalreporter.write_line(self.session.report_line())
        for problem in self.session.problems:
            terminalreporter.write_line(printable(problem), red=True)

"""Tasks run in groups, one child per group: each task keeps its own deadline, output and result, and a task
that kills its child or hangs costs only itself; the rest of its group runs in a fresh child."""

from __future__ import annotations

import os
import time

import pytest

from harness.check.run import workers
from harness.check.matrix.case import Selection, cases
from harness.check.matrix.matrix import _groups
from harness.check.run.workers import WorkerDied, run_grouped, run_isolated
from harness.scenario.loader import load_scenario

SAMPLES = os.path.join(os.path.dirname(__file__), "..", "plugin", "samples")


def _task(arg: tuple[str, str]) -> int:
    what, text = arg
    print(text)
    if what == "exit":
        os._exit(3)
    if what == "hang":
        time.sleep(60)
    if what == "raise":
        raise ValueError(text)
    return os.getpid()


def _timeout(arg: tuple[str, str]) -> float:
    return 2.0 if arg[0] == "hang" else 30.0


def _run(args: list[tuple[str, str]], groups: list[list[int]]):
    printed: dict[int, str] = {}
    results = run_grouped(_task, args, groups, jobs=1, timeout_s=_timeout,
                          output=lambda i, text: printed.__setitem__(i, text))
    return results, printed


def test_a_group_runs_in_one_child_and_hands_each_task_its_own_output():
    results, printed = _run([("ok", "first"), ("ok", "second"), ("ok", "third")], [[0, 1, 2]])
    assert len(set(results)) == 1 and results[0] != os.getpid()
    assert printed == {0: "first\n", 1: "second\n", 2: "third\n"}


def test_run_isolated_still_gives_every_task_a_child_of_its_own():
    results = run_isolated(_task, [("ok", "a"), ("ok", "b")], jobs=1, timeout_s=_timeout,
                           output=lambda i, text: None)
    assert results[0] != results[1]


def test_a_task_that_kills_its_child_costs_only_itself_and_a_fresh_child_runs_the_rest():
    results, printed = _run([("ok", "a"), ("exit", "b"), ("ok", "c"), ("ok", "d")], [[0, 1, 2, 3]])
    assert isinstance(results[1], WorkerDied) and "status 3" in results[1].reason
    assert results[2] == results[3] != results[0]  # the rest of the group shares the new child
    assert printed == {0: "a\n", 1: "b\n", 2: "c\n", 3: "d\n"}


@pytest.mark.slow  # over two seconds on one core (tests/README.md)
def test_a_hanging_task_times_out_alone_and_the_group_goes_on():
    start = time.monotonic()
    results, _ = _run([("hang", "h"), ("ok", "after")], [[0, 1]])
    assert isinstance(results[0], WorkerDied) and results[0].timed_out
    assert isinstance(results[1], int)
    assert time.monotonic() - start < 30  # the second task kept its own deadline, not the first's leftovers


def test_a_task_that_raises_is_reported_and_its_group_goes_on_in_the_same_child():
    results, _ = _run([("raise", "boom"), ("ok", "x"), ("ok", "y")], [[0, 1, 2]])
    assert isinstance(results[0], WorkerDied) and "ValueError: boom" in results[0].reason
    assert results[1] == results[2]


def test_groups_and_lone_tasks_mix_and_results_come_back_in_argument_order():
    args = [("ok", "g0"), ("ok", "lone"), ("ok", "g1")]
    results, printed = _run(args, [[0, 2], [1]])
    assert results[0] == results[2] != results[1]
    assert printed == {0: "g0\n", 1: "lone\n", 2: "g1\n"}


def test_a_scenarios_builtin_cases_share_a_child_and_a_design_by_import_path_runs_alone():
    scenario = load_scenario(os.path.join(SAMPLES, "tiny_match.toml"))
    added = "harness.serving.designs:forward_batch"
    all_cases = cases(scenario, Selection(extra_designs=[added]))
    groups = _groups(all_cases)
    builtin = [i for i, c in enumerate(all_cases) if c.design != added]
    assert builtin and [builtin] == [g for g in groups if len(g) > 1]
    assert all(len(g) == 1 and all_cases[g[0]].design == added for g in groups if g != builtin)
    assert not any(c.builtin for c in all_cases if c.design == added)


def _kills_parent(arg: str) -> str:
    import signal

    if arg == "kill":
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(60)  # the guard's death reaches this process too (PR_SET_PDEATHSIG)
    if arg == "abort":
        os.abort()
    return f"{arg} in {os.getpid()} below {os.getppid()}"


def test_a_task_that_kills_its_parent_kills_only_its_guard_and_the_group_goes_on():
    # the task's parent is a guard between it and the caller: the caller (a CLI, an xdist worker) lives on
    results = run_grouped(_kills_parent, ["a", "kill", "b", "abort", "c"], [[0, 1, 2, 3, 4]], jobs=1,
                          timeout_s=lambda _: 30.0)
    assert results[1] == WorkerDied("worker died (signal 9)")
    assert results[3] == WorkerDied("worker died (signal 6)")  # the guard dies as its task did
    assert [r.split()[0] for r in results if isinstance(r, str)] == ["a", "b", "c"]
    assert all(int(r.split()[-1]) != os.getpid() for r in results if isinstance(r, str))


class _Cycle:
    def __init__(self) -> None:
        self.me = self


_cycles: list = []


def _collector_task(what: str) -> tuple[bool, bool | None]:
    """The collector's state in a task, and whether the previous task's cyclic garbage was freed before it."""
    import gc
    import weakref

    freed = _cycles[-1]() is None if _cycles else None
    if what == "cycle":
        _cycles.append(weakref.ref(_Cycle()))  # garbage at once, but only the cyclic collector frees it
    return gc.isenabled(), freed


def test_a_task_runs_without_the_cyclic_collector_and_its_cyclic_garbage_is_freed_before_the_next():
    results = run_grouped(_collector_task, ["cycle", "look"], [[0, 1]], jobs=1, timeout_s=lambda _: 30.0)
    assert results == [(False, None), (False, True)]

"""A HypoFuzz campaign (make fuzz-campaign) and the search share the example database: the campaign's test has
the search's database key as HypoFuzz computes it. The campaign runner stops HypoFuzz at its budget and tells
an ending on a failure or at the budget from HypoFuzz breaking. HypoFuzz itself is not installed in .venv
(it lives in .venv-fuzz): these tests stand in for it with what it does (its key) and with small processes
that end the ways it ends."""

import ast
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis.internal.reflection import function_digest

import harness
from harness.fuzz.campaign_run import ALL_FAILED, CAMPAIGN, crashes, run_campaign
from harness.fuzz.search import CAMPAIGN_NODEID, property_test
from harness.fuzz.target import FuzzTarget

ROOT = Path(harness.__file__).resolve().parents[1]


def _key(test) -> bytes:
    return function_digest(test.hypothesis.inner_test)


def _never(spec) -> None:
    raise AssertionError("not run")


def test_the_campaign_node_id_names_its_test_from_the_project_root():
    # pytest names the test from the rootdir (the folder of pyproject.toml): the file's path, then its name
    path, _, name = CAMPAIGN_NODEID.partition("::")
    assert ROOT / path == CAMPAIGN.resolve()
    module = ast.parse(CAMPAIGN.read_text())
    assigned = {t.id for node in module.body if isinstance(node, ast.Assign) for t in node.targets
                if isinstance(t, ast.Name)}
    assert name in assigned


def test_hypofuzz_s_key_for_the_campaign_is_the_search_s_key():
    target = FuzzTarget.parse("stale_state:eager")
    search = property_test(target, _never, database=None, seed=0)
    campaign = property_test(target, _never, database=None)
    # HypoFuzz's collection sets the pytest node id on every test it fuzzes before taking function_digest
    # (hypofuzz/collection.py), whatever the test set there itself
    campaign.hypothesis.inner_test._hypothesis_internal_add_digest = CAMPAIGN_NODEID.encode()
    assert _key(campaign) == _key(search)
    # without the node id in the search's key the two would differ (the keys HypoFuzz 25.11.1 wrote before)
    search.hypothesis.inner_test._hypothesis_internal_add_digest = b""
    assert _key(campaign) != _key(search)


@pytest.mark.slow
def test_pytest_names_the_campaign_s_test_as_the_search_expects():
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly",
                           str(CAMPAIGN.relative_to(ROOT))], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert CAMPAIGN_NODEID in done.stdout.splitlines(), done.stdout[-2000:]


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


@pytest.fixture(params=["default", "ignored"])
def inherited_sigint(request):
    """The harness's SIGINT as it started: as a terminal gives it, or ignored, as a shell without job control
    hands it to a background command (``make fuzz-campaign &`` in a CI script)."""
    if request.param == "default":
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_campaign_that_runs_on_is_stopped_at_its_budget_with_its_workers(tmp_path, inherited_sigint):
    marker = tmp_path / "worker-ended"
    # A hub and a worker process that both run until interrupted, as HypoFuzz's do; the worker notes its end.
    # SIGINT is held from the hub's first line until the worker is inside its try (the worker inherits the
    # mask): on a loaded machine the budget can run out while they start, and a worker interrupted before its
    # try would leave no note whatever the campaign runner did.
    result = run_campaign(_python(f"""
        import signal
        signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGINT}})
        import multiprocessing, time
        def worker():
            try:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGINT}})
                time.sleep(60)
            finally:
                open({str(marker)!r}, "w").close()
        if __name__ == "__main__":
            multiprocessing.Process(target=worker).start()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGINT}})
            print("fuzzing", flush=True)
            time.sleep(60)
        """), budget_s=0.8, grace_s=10)
    assert result.stopped == "budget" and result.ok, result
    assert marker.exists()
    assert result.elapsed_s < 10


def test_a_campaign_that_ends_on_a_failure_is_a_success():
    result = run_campaign(_python(f"import sys; print({ALL_FAILED!r}, file=sys.stderr); sys.exit(1)"), budget_s=30)
    assert result.stopped == "failure" and result.ok and result.returncode == 1


def test_hypofuzz_ending_by_itself_or_raising_in_a_worker_is_a_crash():
    ended = run_campaign(_python("import sys; sys.exit(3)"), budget_s=30)
    assert ended.stopped == "crash" and not ended.ok
    raised = run_campaign(_python(f"""
        import sys
        print("Traceback (most recent call last):")
        print('  File "hypofuzz.py", line 352, in run_one')
        print("AttributeError: 'ConjectureResult' object has no attribute 'slice_comments'")
        print({ALL_FAILED!r}); sys.exit(1)
        """), budget_s=30)
    assert raised.stopped == "failure" and not raised.ok
    assert raised.crashes == ("AttributeError: 'ConjectureResult' object has no attribute 'slice_comments'",)


def test_the_tracebacks_of_hypofuzz_s_own_shutdown_are_not_crashes():
    output = textwrap.dedent("""\
        Process Process-2:
        Traceback (most recent call last):
          File "multiprocessing/connection.py", line 384, in _send
            n = write(self._handle, buf)
                ^^^^^^^^^^^^^^^^^^^^^^^^
        BrokenPipeError: [Errno 32] Broken pipe
        Traceback (most recent call last):
          File "hypofuzz/coverage.py", line 151, in trace_pre_312
            def trace_pre_312(self, frame: Any, event: Any, arg: Any) -> Any:
            
        KeyboardInterrupt
        Traceback (most recent call last):
          File "harness/serving/allocator.py", line 51, in free_slots
        ValueError: a real one
        """)
    assert crashes(output) == ("ValueError: a real one",)


def test_tracebacks_printed_at_once_by_the_hub_and_a_worker_are_read_line_by_line():
    """One pipe: the worker's header can come before the hub's frames (a CI run saw this at the budget)."""
    interleaved = textwrap.dedent("""\
        fuzzing
        Process Process-1:
        Traceback (most recent call last):
        Traceback (most recent call last):
          File "<string>", line 15, in <module>
        KeyboardInterrupt
          File "multiprocessing/process.py", line 314, in _bootstrap
            self.run()
        KeyboardInterrupt
        """)
    assert crashes(interleaved) == ()
    banner_inside = textwrap.dedent("""\
        Traceback (most recent call last):
        Process Process-2:
          File "hypofuzz/hy.py", line 120, in run
        Traceback (most recent call last):
          File "multiprocessing/connection.py", line 384, in _send
        BrokenPipeError: [Errno 32] Broken pipe
        KeyboardInterrupt
        """)
    assert crashes(banner_inside) == ()
    real_one_inside = textwrap.dedent("""\
        Traceback (most recent call last):
        Traceback (most recent call last):
          File "hypofuzz/hy.py", line 120, in run
          File "harness/serving/allocator.py", line 51, in free_slots
        KeyboardInterrupt
        hypothesis.errors.Flaky: Inconsistent results from replaying a failing test case!
        """)
    assert crashes(real_one_inside) == ("hypothesis.errors.Flaky: Inconsistent results from replaying a failing test case!",)


def test_a_traceback_the_output_stops_inside_is_a_crash():
    cut = "Traceback (most recent call last):\n  File \"hypofuzz/hy.py\", line 120, in run\n"
    assert crashes(cut) == ("",)
    chained = textwrap.dedent("""\
        Traceback (most recent call last):
          File "a.py", line 1, in f
        KeyError: 'x'

        During handling of the above exception, another exception occurred:

        Traceback (most recent call last):
          File "a.py", line 3, in f
        RuntimeError: while handling it
        """)
    assert crashes(chained) == ("KeyError: 'x'", "RuntimeError: while handling it")

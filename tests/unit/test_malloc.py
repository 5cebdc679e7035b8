"""The harness's processes keep what they free: a forward's temporaries are not fresh pages at every step.

Each case runs in a fresh interpreter, whose allocator has glibc's defaults whatever this test process did
before (the command line tunes the process it runs in, and tests call it).
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap

import pytest

from harness.check.run.malloc import _glibc_function, keep_freed_memory, release_freed_memory

glibc_only = pytest.mark.skipif(_glibc_function("mallopt", (ctypes.c_int, ctypes.c_int)) is None,
                                reason="the thresholds are glibc's; other C libraries keep their own")

# One round of a forward's temporaries, as malloc sees them: a dozen blocks of 1-4 MiB written and freed. The
# faults of five rounds after a first are printed with the pages they touched.
_ROUNDS = """
import ctypes, resource
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
libc.memset.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)
sizes = [(1 << 20) * (1 + i % 4) for i in range(12)]

def rounds(n):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n):
        blocks = [libc.malloc(size) for size in sizes]
        for block, size in zip(blocks, sizes):
            libc.memset(block, 1, size)
        for block in blocks:
            libc.free(block)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, n * sum(sizes) // 4096
"""


def _faults(body: str) -> tuple[int, int]:
    code = _ROUNDS + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    faults, pages = map(int, done.stdout.split())
    return faults, pages


@glibc_only
def test_freed_blocks_stay_with_the_process_once_kept():
    default, pages = _faults("rounds(1)\nprint(*rounds(5))")
    kept, _ = _faults("""
        from harness.check.run.malloc import keep_freed_memory
        assert keep_freed_memory()
        rounds(1)
        print(*rounds(5))
    """)
    if default < pages // 2:
        pytest.skip(f"this glibc keeps the blocks by default ({default} faults over {pages} pages)")
    assert kept < pages // 100, (kept, pages)


@glibc_only
def test_a_worker_child_keeps_its_freed_memory():
    """The parent here has glibc's defaults; the child that runs the task sets its own."""
    faults, pages = _faults("""
        from harness.check.run.workers import run_one_isolated

        def task(_):
            rounds(1)
            return rounds(5)

        print(*run_one_isolated(task, None, timeout_s=60))
    """)
    assert faults < pages // 100, (faults, pages)


@glibc_only
def test_what_is_kept_goes_back_when_a_measurement_asks():
    """A peak measured as the resident set's growth needs the kept memory given back first (the diff bench)."""
    kept, given_back = _faults("""
        from harness.check.run.malloc import keep_freed_memory, release_freed_memory

        def resident():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1])

        assert keep_freed_memory()
        rounds(1)
        before = resident()
        assert release_freed_memory()
        print(before, resident())
    """)
    assert kept - given_back > 0.9 * 7680, (kept, given_back)  # a round's 30 MiB is 7,680 pages


def test_elsewhere_it_is_a_no_op_that_says_so(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert keep_freed_memory() is False
    assert release_freed_memory() is False

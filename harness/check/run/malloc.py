"""Keep the memory a run frees in its process, so that the next forward's temporaries are not new pages.

torch allocates CPU tensors with ``malloc``. glibc's defaults hand large freed blocks back to the kernel: a
block above its mmap threshold (128 KiB, raised as such blocks are freed) is unmapped at ``free``, and the top
of the heap is trimmed once more than its trim threshold (twice the mmap threshold) lies free there. A forward
whose temporaries add up to a few MiB (a prefill's gathered K/V rows, a big pool's diff) then takes them as
fresh pages every time: each page a fault and a page of zeros written by the kernel. gemma-mini's prefill of
64 tokens took 3,400 faults a forward, 11 ms where the same forward takes 4.2 ms without them, and how many a
forward takes depends on what the process allocated before it, so a benchmark measured the allocator's
history as much as the forward.

``keep_freed_memory`` fixes the thresholds: blocks up to ``MMAP_THRESHOLD`` come from the heap, and the heap
keeps up to ``TRIM_THRESHOLD`` free at its top. A process then holds its high-water mark until it exits, which
the harness's processes do (a worker child lives for one group of runs). Only the harness's own processes call
it (the command line, ``make bench`` and each worker child): a user's process that imports the harness keeps its
allocator as it was. Nothing computed changes: where a tensor's memory lies is no result.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable

MMAP_THRESHOLD = 32 << 20
"""the largest value glibc takes for ``M_MMAP_THRESHOLD`` on 64-bit (half its 64 MiB heap size): a bigger block
(a large pool's snapshot) is still mapped and unmapped on its own"""
TRIM_THRESHOLD = 512 << 20
"""free bytes the heap keeps at its top before it gives any back"""
TOP_PAD = 16 << 20
"""bytes the heap grows by beyond a request, so that growing it is rare"""

# mallopt's parameter numbers (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3


def keep_freed_memory() -> bool:
    """Set glibc's thresholds for this process (and the children it forks from now on); True where they took.
    A no-op returning False where the C library is not glibc (musl, macOS, Windows)."""
    mallopt = _glibc_function("mallopt", (ctypes.c_int, ctypes.c_int))
    if mallopt is None:
        return False
    # the mmap threshold first: setting any of the three stops glibc from raising it by itself
    return all(mallopt(param, value) == 1 for param, value in (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD), (_M_TOP_PAD, TOP_PAD)))


def release_freed_memory() -> bool:
    """Give what the heap holds free back to the kernel now (``malloc_trim``), so that the resident set is the
    live memory again: what a measurement of a call's peak growth needs first. False where not glibc."""
    trim = _glibc_function("malloc_trim", (ctypes.c_size_t,))
    if trim is None:
        return False
    trim(0)
    return True


def _glibc_function(name: str, argtypes: tuple[type, ...]) -> Callable[..., int] | None:
    """glibc's ``name`` (returning an int), or None where the process's C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return None
        found = getattr(ctypes.CDLL(None), name)
    except (ValueError, OSError, AttributeError):  # a libc that does not know the name, or lacks the function
        return None
    found.argtypes, found.restype = argtypes, ctypes.c_int
    return found


__all__ = ["keep_freed_memory", "release_freed_memory"]

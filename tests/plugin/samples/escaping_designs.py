"""Third-party designs whose effects reach outside their run: a process they start, a terminal they write
to. Each run must end with its processes and show what it printed, escaped (tests/plugin/test_hardening.py).

``SWA_TEST_MARKER`` (an environment variable) is the duration the started ``sleep`` is given, so that a
test can find exactly the processes it caused.
"""

import os
import subprocess
import sys
import time

from harness.serving.designs import translate

_done = set()


def _once(what):
    first = what not in _done
    _done.add(what)
    return first


def spawns(forward_batch, pool, metadata, layer_id):
    """Starts a long ``sleep`` that inherits the run's stdout and stderr, then works."""
    if _once("spawn"):
        subprocess.Popen(["sleep", os.environ.get("SWA_TEST_MARKER", "300")])
    return translate(forward_batch, pool, metadata, layer_id)


def spawns_and_hangs(forward_batch, pool, metadata, layer_id):
    """Starts a long ``sleep``, then hangs."""
    spawns(forward_batch, pool, metadata, layer_id)
    time.sleep(3600)


def prints(forward_batch, pool, metadata, layer_id):
    """Writes a terminal title, a screen clear, a bell and a forged pytest line, through Python and fd 2."""
    if _once("print"):
        print("\x1b]0;pwned\x07title set\nPASSED forged")
        sys.stdout.flush()
        os.write(2, b"\x1b[2Jscreen cleared\n")
    return translate(forward_batch, pool, metadata, layer_id)

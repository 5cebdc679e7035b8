"""Third-party designs that kill more than their own run: the process that started the run, or the whole
pytest-xdist worker running their scenario file. Each must cost only its own case, an ``error`` verdict,
while every other case of the file still runs (tests/plugin/test_crash_isolation.py)."""

import os
import signal
import time


def kills_its_parent(forward_batch, pool, metadata, layer_id):
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(60)  # the kill's aftermath reaches this process too: wait for it, as a crash would


def _ancestors():
    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
        yield pid


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def kills_its_worker(forward_batch, pool, metadata, layer_id):
    # a pytest-xdist worker runs as ``python -c ...`` below the controller, ``pytest``: kill the process just
    # below the first ancestor named pytest (the worker itself, whatever runs this case inside it)
    below = os.getppid()
    for pid in _ancestors():
        if b"pytest" in _cmdline(pid):
            break
        below = pid
    os.kill(below, signal.SIGKILL)
    time.sleep(60)

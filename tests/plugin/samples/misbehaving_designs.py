"""Third-party designs that misbehave the ways real code does; each must end as an ``error`` verdict of its
own run while the other runs complete (tests/plugin/test_isolation.py)."""

import os
import sys
import time


def exits(forward_batch, pool, metadata, layer_id):
    sys.exit(3)


def aborts(forward_batch, pool, metadata, layer_id):
    os.abort()


def hangs(forward_batch, pool, metadata, layer_id):
    time.sleep(3600)


def raises(forward_batch, pool, metadata, layer_id):
    raise ValueError("boom")

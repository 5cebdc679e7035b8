"""Third-party designs that misbehave the ways real code does. Those that exit, abort, hang or raise must each
end as an ``error`` verdict of its own run while the other runs complete (tests/plugin/test_isolation.py);
the last two are planted bugs whose cause a report must show beside the symptom (tests/plugin/test_cause.py)."""

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


def frozen_translation(forward_batch, pool, metadata, layer_id):
    # translates once per batch size and keeps the result on the pool: a graph captures the tensor, and its
    # replays write every later batch's SWA K/V into the slots of the batch seen at capture
    frozen = getattr(pool, "_frozen_swa_loc", None)
    if frozen is None or frozen.numel() != forward_batch.out_cache_loc.numel():
        pool._frozen_swa_loc = frozen = pool.translate_loc_from_full_to_swa(forward_batch.out_cache_loc)
    return frozen


_SWA_LOC_BY_LAYER = {}


def misses_key(forward_batch, pool, metadata, layer_id):
    return _SWA_LOC_BY_LAYER[layer_id]  # never filled: KeyError

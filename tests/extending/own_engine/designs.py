"""Designs of one's own: where a layer writes its SWA K/V, computed from what the forward batch holds."""

from __future__ import annotations


def translating(forward_batch, pool, metadata, layer_id):
    """Correct: every forward translates its full-pool locations into the SWA pool itself, never reading the
    SWA locations the scheduler prepared (so a fault that corrupts those never reaches it)."""
    return pool.translate_loc_from_full_to_swa(forward_batch.out_cache_loc)


def flipped(forward_batch, pool, metadata, layer_id):
    """A planted bug: every layer of a multi-token forward writes each token's K/V into another token's slot."""
    loc = translating(forward_batch, pool, metadata, layer_id)
    return loc.flip(0) if loc.numel() > 1 else loc


def hangs_on_decode(forward_batch, pool, metadata, layer_id):
    """Hangs at the first decode batch: a run that never finishes, stopped by its time limit."""
    if forward_batch.forward_mode.is_decode_like:
        _spin_forever()
    return translating(forward_batch, pool, metadata, layer_id)


def _spin_forever():
    while True:
        pass

"""An engine engineer's own designs and runner, as they would try them on the library: one module, named by
import path. Tests copy this file beside a scenario."""

from harness.runners.eager import EagerRunner


def good(forward_batch, pool, metadata, layer_id):
    """The batch's own SWA locations, translating only without them: what forward_batch does."""
    if forward_batch.out_cache_loc_swa is not None:
        return forward_batch.out_cache_loc_swa
    return pool.translate_loc_from_full_to_swa(forward_batch.out_cache_loc)


def wrong(forward_batch, pool, metadata, layer_id):
    """A planted bug: layer 1 of a multi-token forward writes each token's K/V into another token's slot."""
    loc = good(forward_batch, pool, metadata, layer_id)
    return loc.flip(0) if layer_id == 1 and loc.numel() > 1 else loc


class DoublingRunner(EagerRunner):
    """A planted runner bug: it runs every batch eagerly and returns its hidden states doubled."""

    @classmethod
    def for_run(cls, ctx, spec, *, eager=None):
        return cls(ctx)

    def forward(self, batch):
        return super().forward(batch) * 2

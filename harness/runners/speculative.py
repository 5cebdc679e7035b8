"""The speculative worker: runs a draft batch through the runner it owns (the run's dispatcher), as SGLang's
EAGLE worker owns its draft graph runner. When a draft graph takes the whole multi-step loop
(``draft_graph.py``) the batch is one forward; otherwise the worker steps the loop itself, each draft step a
decode-shaped forward (SGLang's ``draft_forward``, run when its graph runner cannot take the batch).

Each draft step points the batch at new write locations (``out_cache_loc`` reassigned to its row of the
batch's ``draft_out_cache_loc``, as ``draft_forward`` does). The precomputed ``out_cache_loc_swa`` belongs to
the whole draft (every step's slots, request-major), so the worker drops it and consumers translate instead
(SGLang PR 24138). ``draft_forward`` itself rebinds ``out_cache_loc`` only: the ``stale_swa_after_reassign``
fault keeps the whole draft's SWA locations on every step, a length mismatch (``batch_size * draft_steps``
locations for ``batch_size`` rows) that fails the write, except for a batch of one request, where the one row
is broadcast over every step's slots and the later steps overwrite the earlier ones silently.

A draft batch with a ``verify`` (a timeline with ``accept_lens``) is followed by its target-verify forward:
the plan gives the draft's slots back and allocates the verify's, the verify runs through the dispatcher (the
verify graphs, ``verify_graph.py``, where the backend captures uniform batches; eagerly otherwise), and the slots of the rejected draft tokens are freed in both pools, as SGLang's
``EagleVerifyInput.verify`` frees them. ``skip_free_rejected`` keeps them and ``free_rejected_swa_only``
frees their SWA slots only: pages no token owns, which the ``leaked`` pool invariant names. A tree draft's
verify (top-k > 1) also moves the kept slots of its accepted branch to the request's next positions of
``req_to_token`` once it ran (``accept``), before the rejected ones are freed.

The draft model has a KV pool of its own (``attach_draft_pool``), which every draft forward writes at the
target's full-pool slot ids; ``draft_pool_sized_before_swa_adjustment`` sizes it below the full pool (before
SGLang PR 17630), and the first draft token given a full slot past it fails the write.

A target forward with a ``draft_extend`` (a timeline with ``draft_extend``: a prefill chunk, or a verify once
its rejected drafts went back) is followed by that draft-extend forward over the tokens the target kept, as
SGLang's EAGLE worker runs ``forward_draft_extend`` and ``forward_draft_extend_after_decode``; the next draft
then runs ``draft_steps - 1`` forwards (``ForwardBatch.draft_forwards``), its first token the draft-extend's.
SGLang 0.5.23's form (``timeline.draft_extend = "v2"``, ``DRAFT_EXTEND_V2``) runs after a verify over its whole
window instead, right after the verify forward and before the rejected drafts are freed.
The draft-extend runs through the dispatcher too: after a verify on the draft-extend graphs of its length
(``draft_extend_graph.py``) where the backend captures uniform batches, eagerly otherwise and after a prefill.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from ..serving.batch import ForwardBatch, ForwardMode, VerifyStep
from ..serving.faults import Component, faults_acting_on
from ..serving.model import DTYPES, ModelSpec
from ..serving.pool import DraftKVPool, HybridSWAKVPool, draft_pool_size
from .base import Runner


def attach_draft_pool(pool: HybridSWAKVPool, model: ModelSpec, faults: Collection[str] = ()) -> DraftKVPool:
    """The draft model's own KV pool, as SGLang's EAGLE worker builds its draft model runner's: sized at least the
    target's full pool (SGLang PR 17630); ``draft_pool_sized_before_swa_adjustment`` sizes it by the token count
    before the hybrid SWA adjustment, below the full pool, as before that fix."""
    before = "draft_pool_sized_before_swa_adjustment" in faults
    size = draft_pool_size(pool.spec, model.layer_is_swa, before_swa_adjustment=before)
    return pool.attach_draft_pool(size, num_layers=model.num_layers, dtype=DTYPES[model.dtype])


class SpeculativeWorker:
    component = Component.SPECULATIVE_WORKER
    known_faults = faults_acting_on(Component.SPECULATIVE_WORKER)

    def __init__(self, runner: Runner, faults: Collection[str] = ()) -> None:
        self.runner = runner
        self.faults = frozenset(faults) & self.known_faults

    def run(self, batch: ForwardBatch) -> list[torch.Tensor]:
        """Hidden states of every forward the batch takes: one, or one per speculative draft step."""
        if batch.forward_mode is not ForwardMode.DRAFT:
            return self._target(batch)
        if self._graph_takes_whole(batch):
            # the draft graph's hidden states, step-major: one [batch_size, hidden] block per draft forward
            outs = list(self.runner.forward(batch).split(batch.batch_size))
        else:
            outs = []
            for step in range(batch.draft_forwards):
                self._enter_draft_step(batch, step)
                outs.append(self.runner.forward(batch))
        if batch.verify is not None:
            outs.extend(self._target(batch.verify.build(), verify=batch.verify))
        return outs

    def _target(self, batch: ForwardBatch, verify: VerifyStep | None = None) -> list[torch.Tensor]:
        """A target forward, the accepted branch kept and the rejected drafts freed after a verify, then its
        draft-extend if it has one."""
        outs = [self.runner.forward(batch)]
        extend = batch.draft_extend
        if verify is not None:
            verify.accept()
            if extend is not None and extend.before_frees:
                # DRAFT_EXTEND_V2: over the verify's window while its rejected drafts still hold their slots
                outs.append(self.runner.forward(extend.build()))
                extend = None
            if "skip_free_rejected" not in self.faults:
                verify.release_rejected(full="free_rejected_swa_only" not in self.faults)
        if extend is not None:
            outs.append(self.runner.forward(extend.build()))
        return outs

    def _graph_takes_whole(self, batch: ForwardBatch) -> bool:
        dispatch = getattr(self.runner, "dispatch", None)  # a dispatcher; a bare runner steps every draft
        if dispatch is None or batch.draft_step is not None or batch.draft_forwards == 0:
            return False
        key = dispatch(batch).key
        return key is not None and key.forward_mode is ForwardMode.DRAFT

    def _enter_draft_step(self, batch: ForwardBatch, step: int) -> None:
        # under the fault the whole draft's out_cache_loc_swa stays
        batch.enter_draft_step(step, keep_swa_loc="stale_swa_after_reassign" in self.faults)

"""The fault catalog: named switches that re-create real bug families in a runner, backend or batch.

Each fault is checked where it acts (``name in faults``); this module is the one place that lists them,
for validation, ``python -m harness list`` and the documentation.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    name: str
    acts_on: str
    """the component whose switch it is"""
    modes: tuple[str, ...]
    """runner modes in which the fault can have an effect"""
    summary: str
    reference: str


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault(name="no_zero_swa_pad", acts_on="decode graph runner", modes=("full",),
              summary="the padded tail of the static out_cache_loc_swa keeps the previous batch's slots, "
                      "so padded rows overwrite live SWA KV of other requests",
              reference="SGLang PR 24743"),
        Fault(name="no_preset_swa_loc", acts_on="decode graph runner", modes=("full",),
              summary="capture does not point pool.swa_loc at the static buffer; the graph bakes in "
                      "whichever tensor the attribute held",
              reference="SGLang PR 23552"),
        Fault(name="rebind_metadata", acts_on="attention backend", modes=("full",),
              summary="replay binds freshly built page table / seq_lens tensors instead of copying into "
                      "the captured static ones",
              reference="SGLang PR 26019 review"),
        Fault(name="baked_scalar", acts_on="attention backend", modes=("full",),
              summary="the kv width (max sequence length of the capture batch) is a Python number frozen "
                      "at capture",
              reference="TensorRT-LLM PR 18769; PyTorch issue 114844"),
        Fault(name="pad_seq_len_zero", acts_on="decode graph runner", modes=("full",),
              summary="padding rows get seq_len 0: an empty softmax yields NaN, written to the dummy slot "
                      "that masked reads touch",
              reference="vLLM PR 38436"),
        Fault(name="pad_slot_minus_one", acts_on="decode graph runner", modes=("full",),
              summary="padding rows write at slot -1, which as a Python-style index is the last slot",
              reference="vLLM issue 43810"),
        Fault(name="window_from_wrong_layer", acts_on="attention backend", modes=("eager", "full", "piecewise"),
              summary="every layer takes the window of the first layer group",
              reference="vLLM PR 51756"),
        Fault(name="stale_swa_after_reassign", acts_on="forward batch", modes=("eager", "full", "piecewise"),
              summary="a draft step reassigns out_cache_loc but keeps the old out_cache_loc_swa",
              reference="SGLang speculative worker; PR 24138"),
        Fault(name="skip_memo_invalidate", acts_on="piecewise prefill runner", modes=("piecewise",),
              summary="the per-forward invalidation of the memoized translation is skipped while static "
                      "buffers keep the same data_ptr and numel for different batches",
              reference="SGLang PR 25824"),
    )
}

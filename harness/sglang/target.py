"""The SGLang target registering itself: its serving stack and its faults on the installed SGLang's code.

The ``harness.targets`` entry point (pyproject.toml) names ``register``, which the registries call at their
first use (``imports.load_targets``); nothing below the target names it. Only names and import paths are
registered here: the stack's module imports the installed SGLang, so nothing of it is imported until a run
builds the stack (a scenario loads without it, the dry run standing the miniature in).
"""

from __future__ import annotations

from ..fuzz.properties import register_fuzz_property, register_fuzz_stack
from ..serving.faults import Component, Fault, register_faults
from ..serving.registry import register_stack

STACK = "sglang"
"""the installed SGLang as a serving stack: ``[serving] stack = "sglang"``"""

FAULTS: tuple[Fault, ...] = (
    Fault(name="sglang_evict_one_page_too_far", acts_on=Component.TARGET, modes=("eager",),
          patch="harness.sglang.faults:evict_one_page_too_far",
          summary="the installed free_swa_out_of_window_slots is called with a sliding window one page short: "
                  "its frontier runs a page past the window and the oldest key still inside it loses its SWA "
                  "slot, which SGLang's allocator hands out again",
          reference="SGLang PR 22470 (the frontier over-evicting); PR 23982 (slots freed inside the window)"),
    Fault(name="sglang_skip_metadata_refresh", acts_on=Component.TARGET, modes=("eager",),
          patch="harness.sglang.designs:skip_metadata_refresh",
          summary="the TRTLLMMHAMetadata the installed _get_layer_cache_loc reads is built for a run's first "
                  "forward only: a longer batch's swa_out_cache_loc passes its length assert and is sliced",
          reference="SGLang PR 24138 (the function's metadata seam); PR 27617 (the per-forward refill)"),
    Fault(name="sglang_reuse_plan", acts_on=Component.TARGET, modes=("eager",),
          patch="harness.sglang.faults:reuse_previous_plan",
          summary="the installed KVIndexTranslator hands each iteration's KVLocPlan the previous plan's "
                  "sliding-window ids: a memo keyed by sub-pool outlives its iteration",
          reference="SGLang PR 35245 and PR 37307 (KVLocPlan's per-iteration memo)"),
    Fault(name="sglang_skip_evict_mid_prefill", acts_on=Component.TARGET, modes=("eager",),
          patch="harness.sglang.faults:skip_evict_mid_prefill",
          summary="the installed ScheduleBatch.maybe_evict_swa skips extend batches: a request in chunked prefill "
                  "keeps every SWA slot behind its window until its first decode",
          reference="SGLang PR 33805 (a path that never ran SWA eviction)"),
    Fault(name="sglang_frontier_in_tokens", acts_on=Component.TARGET, modes=("eager",),
          patch="harness.sglang.faults:frontier_in_tokens",
          summary="the installed radix tree's SWA component frees a request between chunks with its frontier "
                  "counted in tokens, not pages (free_swa_out_of_window_slots at page size 1): at pages longer "
                  "than the window the frontier reaches the page its insert stops at",
          reference="SGLang PR 34870 (the frontier in the wrong unit, a page short)"),
    Fault(name="sglang_match_len_not_reset", acts_on=Component.TARGET, modes=("eager",),
          patch="harness.sglang.faults:match_len_not_reset",
          summary="the installed SWA component's match validator resets its live-token count at a tombstone only "
                  "after a full window: a short run before a second tombstone counts towards the window after it",
          reference="SGLang PR 17061 (reset match_len_since_tombstone at every tombstone)"),
)
"""patches on the installed SGLang 0.5.23's own code"""


def register() -> None:
    """What the entry point calls: the SGLang stack and this target's faults, into the harness's registries."""
    register_stack(STACK, "harness.sglang.stack:SGLangStack", optional_install="SGLang 0.5.23 (make sglang-venv)",
                   scheduler="harness.sglang.schedule:own_scheduler",
                   unavailable="harness.sglang.installed:unavailable_reason")
    register_faults(*FAULTS)
    register_fuzz_property("sglang-differential", "harness.sglang.fuzz:main")
    register_fuzz_property("sglang-graph", "harness.sglang.graph_fuzz:main", takes=("--fault",))
    register_fuzz_stack(STACK, "harness.sglang.library:fuzz_onto_sglang")

"""The fault catalog: named switches that re-create real bug families in one component each.

Each fault is checked where it acts (``name in self.faults``), at the place the real bug lived; this
module is the only list of them. A component takes the faults it knows from here by its ``Component``
(``faults_acting_on``), so adding a fault is one entry here plus the ``if`` where it acts.

A fault on code the harness does not own (the installed SGLang) has no ``if`` to live in: it names a
``patch`` instead, a context manager the run driver enters around the run in the run's own process. Such
faults belong to the target package that owns the adapter and are registered by it (``register_faults``,
from its ``harness.targets`` entry point), so this module names no target.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass

from ..imports import Registry


class Component(enum.StrEnum):
    """The parts of the serving miniature a fault can act in."""

    DECODE_GRAPH_RUNNER = "decode graph runner"
    PIECEWISE_RUNNER = "piecewise prefill runner"
    ATTENTION_BACKEND = "attention backend"
    SPECULATIVE_WORKER = "speculative worker"
    SCHEDULER = "scheduler"
    """its SWA eviction (which slots it frees after a step) and what it hands the prefix cache"""
    PREFIX_CACHE = "prefix cache"
    """the SWA radix cache: what a prompt matches, and what cache pressure evicts"""
    TARGET = "target's own code"
    """code the harness does not own, under a target package that registers its faults itself (``harness/sglang``,
    the installed SGLang's): such faults are patches"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    name: str
    acts_on: Component
    """the one component whose switch it is"""
    modes: tuple[str, ...]
    """runner modes ("eager", "full", "piecewise") in which the fault can have an effect"""
    summary: str
    reference: str
    """the public bug or fix it re-creates"""
    needs_prefix_cache: bool = False
    """acts only in a run that keeps a prefix cache (``eviction.prefix_cache``)"""
    needs_fused_write: bool = False
    """acts only where K/V is written through the fused FP8 path (``run.kv_write = "fused_fp8"``)"""
    needs_drafts: bool = False
    """acts only in a run that speculates (``timeline.draft_steps`` > 0), whose radix keys are EAGLE's bigrams"""
    needs_verify: bool = False
    """acts only in a run that verifies its drafts (``timeline.accept_lens`` set)"""
    masked_by: str | None = None
    """why the shipped code masks it, for a switch that can no longer change a verdict: its scenario shows every
    design matching with it on (a regression of what masks it would diverge there); None: it is flagged"""
    needs_tree: bool = False
    """acts only in a run that drafts trees (``timeline.draft_topk`` > 1)"""
    needs_draft_extend: bool = False
    """acts only in a run with draft-extend forwards (``timeline.draft_extend``)"""
    patch: str | None = None
    """``package.module:function``, a context manager that applies the fault to code the harness does not own;
    ``check/run/drive.execute`` enters it around the run, in the run's process (a forked child under ``harness run``
    and the scenario items). None: a switch inside a component of the harness"""


FAULTS: Registry[Fault] = Registry({
    f.name: f
    for f in (
        Fault(name="no_zero_swa_pad", acts_on=Component.DECODE_GRAPH_RUNNER, modes=("full",),
              summary="the padded tail of the static out_cache_loc_swa keeps the previous batch's slots, "
                      "so padded rows overwrite live SWA KV of other requests",
              reference="SGLang PR 24743"),
        Fault(name="no_preset_swa_loc", acts_on=Component.DECODE_GRAPH_RUNNER, modes=("full",),
              summary="capture does not point pool.swa_loc at the static buffer; the graph bakes in "
                      "whichever tensor the attribute held",
              reference="SGLang PR 23552"),
        Fault(name="rebind_metadata", acts_on=Component.ATTENTION_BACKEND, modes=("full",),
              summary="replay binds freshly built page table / seq_lens tensors instead of copying into "
                      "the captured static ones",
              reference="SGLang PR 26019 review"),
        Fault(name="baked_scalar", acts_on=Component.ATTENTION_BACKEND, modes=("full",),
              summary="the kv width (max sequence length of the capture batch) is a Python number frozen "
                      "at capture",
              reference="TensorRT-LLM PR 18769; PyTorch issue 114844"),
        Fault(name="pad_seq_len_zero", acts_on=Component.DECODE_GRAPH_RUNNER, modes=("full",),
              summary="padding rows get seq_len 0: an empty softmax yields NaN, written to the dummy slot "
                      "that masked reads touch",
              reference="vLLM PR 38436"),
        Fault(name="pad_slot_minus_one", acts_on=Component.DECODE_GRAPH_RUNNER, modes=("full",),
              summary="padding rows write at slot -1, which as a Python-style index is the last slot",
              reference="vLLM issue 43810"),
        Fault(name="window_from_wrong_layer", acts_on=Component.ATTENTION_BACKEND,
              modes=("eager", "full", "piecewise"),
              summary="every layer takes the window of the first layer group",
              reference="vLLM PR 51756"),
        Fault(name="verify_without_swa_window", acts_on=Component.ATTENTION_BACKEND,
              modes=("eager", "full", "piecewise"), needs_verify=True,
              summary="target-verify forwards are built without the SWA window's page table: the SWA layers read "
                      "the SWA pool at the full pool's slot ids",
              reference="SGLang PR 29858 (the SWA window indices hard-coded to none on a speculative path); "
                        "issue 22679"),
        Fault(name="draft_tree_swa_untranslated", acts_on=Component.ATTENTION_BACKEND,
              modes=("eager", "full", "piecewise"), needs_drafts=True, needs_verify=True, needs_tree=True,
              summary="a tree draft's (top-k > 1) per-branch keys, in its draft steps and its verify, reach the SWA "
                      "layers at full-pool slot ids: the request's own part of the table is translated, the "
                      "branch part is not",
              reference="SGLang PR 24617 (the top-k > 1 page table not translated for SWA layers)"),
        Fault(name="draft_extend_without_swa_window", acts_on=Component.ATTENTION_BACKEND,
              modes=("eager", "full", "piecewise"), needs_draft_extend=True,
              summary="draft-extend forwards are built without the SWA window's page table (that path alone): the "
                      "SWA layers of the draft-extend read the SWA pool at the full pool's slot ids",
              reference="SGLang PR 29858 (the SWA window indices hard-coded to none on the draft-extend path only)"),
        Fault(name="stale_swa_after_reassign", acts_on=Component.SPECULATIVE_WORKER,
              modes=("eager", "full", "piecewise"),
              summary="a draft step rebinds out_cache_loc to its row but keeps the draft batch's out_cache_loc_swa, "
                      "which holds every step's SWA slots: a length mismatch that fails the write, or for one "
                      "request a row broadcast over every step's slots",
              reference="SGLang's EAGLE draft_forward (out_cache_loc rebound per step); the staleness PR 24138's "
                        "review rejected"),
        Fault(name="draft_metadata_captured_once", acts_on=Component.SPECULATIVE_WORKER, modes=("full",),
              needs_drafts=True,
              summary="the draft graph is captured with one attention metadata for all its steps: every draft step "
                      "after the first attends with the first step's lengths and page table (its own key and the "
                      "earlier drafts' unseen) and, where the backend keeps them, writes at its SWA locations",
              reference="SGLang's multi-step draft backend (one backend and metadata per draft step, "
                        "attn_backends[i]); the family of TensorRT-LLM PR 18769 (state captured once, never refreshed on "
                        "replay)"),
        Fault(name="skip_memo_invalidate_in_draft_graph", acts_on=Component.SPECULATIVE_WORKER, modes=("full",),
              needs_drafts=True,
              summary="the draft graph invalidates the memoized translation once for the whole loop, not before "
                      "each step's forward: the step rows of one out_cache_loc share a storage and a length, so the "
                      "memo keyed on them serves step 0's SWA translation to every later step, and the graph captures it",
              reference="SGLang PR 26152 (the memo invalidation moved to where graph paths run it); PR 26184"),
        Fault(name="skip_memo_invalidate_before_step_metadata", acts_on=Component.SPECULATIVE_WORKER,
              modes=("full",), needs_drafts=True,
              summary="the draft graph runner invalidates the memoized translation once before it refreshes its "
                      "steps' metadata, not before each step's: the step backends' page tables are rows of one "
                      "buffer (one storage, one length), so the read path serves every later step step 0's SWA "
                      "page table, and its SWA layers read their newest keys at the dummy slot",
              reference="SGLang PR 26184 (invalidate before every init_forward_metadata call of the graph runners: a "
                        "backend's page-table translation met the key a previous translation left); PR 25824"),
        Fault(name="draft_pool_sized_before_swa_adjustment", acts_on=Component.SPECULATIVE_WORKER,
              modes=("eager", "full", "piecewise"), needs_drafts=True,
              summary="the draft model's KV pool is sized by the token count before the hybrid SWA adjustment, "
                      "below the target's full pool, while the draft writes at the target's full-pool slot ids: "
                      "the first draft token given a full slot past it is written out of bounds",
              reference="SGLang PR 17630 (the draft pool sized at least the target's full pool after the SWA "
                        "adjustment)"),
        Fault(name="skip_free_rejected", acts_on=Component.SPECULATIVE_WORKER, modes=("eager", "full", "piecewise"),
              needs_verify=True,
              summary="the target verify keeps the slots of the draft tokens it rejected: full and SWA pages no "
                      "token owns, never freed again",
              reference="SGLang's EagleVerifyInput.verify (frees out_cache_loc[evict_mask] after acceptance)"),
        Fault(name="free_rejected_swa_only", acts_on=Component.SPECULATIVE_WORKER,
              modes=("eager", "full", "piecewise"), needs_verify=True,
              summary="the target verify frees its rejected draft tokens through the eviction call, the SWA pool "
                      "only: their full slots stay handed out, owned by no token",
              reference="SGLang's EagleVerifyInput.verify (both pools freed through the hybrid allocator's free)"),
        Fault(name="skip_evict_on_spec_decode", acts_on=Component.SCHEDULER, modes=("eager", "full", "piecewise"),
              needs_drafts=True,
              summary="requests that decode speculatively are never SWA-evicted: every draft batch keeps the SWA "
                      "slots its tokens left the window with, until the SWA pool runs dry",
              reference="SGLang PR 33805 (a speculative decode path never ran SWA eviction); PR 34924"),
        Fault(name="skip_memo_invalidate_at_capture", acts_on=Component.DECODE_GRAPH_RUNNER, modes=("full",),
              summary="the decode runner captures without invalidating the memoized translation: the memo a "
                      "warm-up run left (same static buffer, same data_ptr and numel) is frozen into the graph",
              reference="SGLang PR 25824"),
        Fault(name="skip_memo_invalidate_on_replay", acts_on=Component.DECODE_GRAPH_RUNNER, modes=("full",),
              summary="decode graph replays skip the per-forward invalidation of the memoized translation (the model "
                      "runner's call sat after its graph early return): the replay's refresh translates the static "
                      "page table, the previous replay's storage and length, and where no allocation invalidated in "
                      "between (the steps of a draft stepped on the decode graphs) it is served that replay's SWA "
                      "page table",
              reference="SGLang PR 26152 (invalidate_loc_cache moved before the can_run_graph check); PR 25824"),
        Fault(name="rebind_static_swa_loc", acts_on=Component.DECODE_GRAPH_RUNNER, modes=("full",),
              summary="the decode runner binds a new static out_cache_loc_swa at every replay instead of copying "
                      "into the captured one, which then holds whatever it held at the last copy",
              reference="SGLang PR 26019 review (the same shape for the runner's own buffer)"),
        Fault(name="evict_one_past_window", acts_on=Component.SCHEDULER, modes=("eager", "full", "piecewise"),
              summary="the eviction frontier runs one page (one token at page size 1) too far: the oldest key "
                      "still inside the window loses its SWA slot, which is poisoned and handed out again",
              reference="SGLang PR 22470 (the frontier over-evicting to the insert boundary); PR 23982 (slots "
                        "freed while still inside the active window)"),
        Fault(name="evict_not_page_aligned", acts_on=Component.SCHEDULER, modes=("eager", "full", "piecewise"),
              summary="the eviction frontier is not floored to a page: a page free under it gives back the whole "
                      "page, while tokens of that page are still inside the window and still mapped to it",
              reference="SGLang PR 22470 (page-align the SWA eviction boundary); PR 25419 (page-level "
                        "accounting mismatch in the SWA allocator's free path)"),
        Fault(name="skip_evict_mid_prefill", acts_on=Component.SCHEDULER, modes=("eager", "full", "piecewise"),
              summary="requests still in chunked prefill are never evicted: a long prompt keeps every SWA slot "
                      "it was given until its first decode, and the SWA pool runs dry",
              reference="SGLang PR 33805 (a path that never ran SWA eviction)"),
        Fault(name="evict_by_token_count", acts_on=Component.SCHEDULER, modes=("eager", "full", "piecewise"),
              needs_prefix_cache=True, needs_drafts=True,
              summary="with EAGLE's bigram radix keys (one entry per pair of adjacent tokens) the eviction frontier "
                      "is counted back from the request's tokens, not from its key's length: at a page multiple the "
                      "key ends a page earlier, and the leaf inserted between chunks keeps a page less than a window "
                      "of live SWA KV, so no match can end there",
              reference="SGLang PR 34870 (count the frontier from the key's length; PR 34823 had gated off the "
                        "pool-accounting crash the unit mix caused)"),
        Fault(name="release_before_last_batch", acts_on=Component.SCHEDULER, modes=("eager", "full", "piecewise"),
              summary="a request is released (both pools) when its last token is scheduled, not once it is written: "
                      "the decode batch that carries the last token still holds the request, whose window and write "
                      "slots are back on the free lists for the allocator to hand to the next batch's tokens",
              reference="SGLang PR 18803 (defer a finished request's release past the overlapped forward that still "
                        "reads it); PRs 29353, 31687 (order the scheduler's frees and rewrites behind that forward)"),
        Fault(name="reuse_stale_plan", acts_on=Component.SCHEDULER, modes=("eager", "full", "piecewise"),
              summary="the translator serves the previous iteration's plan for the SWA sub-pool: its ids belong to "
                      "another batch, and a longer tensor passes the length check and is sliced silently",
              reference="SGLang 0.5.23's KVLocPlan memo (PRs 35245, 37307); the staleness PR 24138's review "
                        "rejected"),
        Fault(name="read_page_tail", acts_on=Component.ATTENTION_BACKEND, modes=("eager", "full", "piecewise"),
              summary="the page table expands a request's last page whole, its unwritten tail included: a dense "
                      "kernel masks those keys, but a reused page's poison turns the masked product into NaN",
              reference="vLLM PR 47574 (freed SWA blocks reused before being written decode to NaN)"),
        Fault(name="skip_memo_invalidate", acts_on=Component.PIECEWISE_RUNNER, modes=("piecewise",),
              summary="the per-forward invalidation of the memoized translation is skipped while static "
                      "buffers keep the same data_ptr and numel for different batches",
              reference="SGLang PR 25824; PR 26152 (the piecewise replay path skipped it: a warning, not a stale hit)",
              masked_by="every piecewise forward is an extend whose allocation invalidated the memo just before it "
                        "(PR 25824's allocator), and the backend's page-table translation takes the memo's one "
                        "entry before the first SWA write: no stale hit is left to serve"),
        Fault(name="match_len_not_reset", acts_on=Component.PREFIX_CACHE, modes=("eager", "full", "piecewise"),
              needs_prefix_cache=True,
              summary="a match resets its count of live SWA tokens since the last tombstone only when that run "
                      "was a full window: a short run before a second tombstone counts towards the window after "
                      "it, and the match ends with tombstoned (freed) tokens inside the window its query reads",
              reference="SGLang PR 17061 (reset match_len_since_tombstone at every tombstone)"),
        Fault(name="unfinished_insert_no_evicted_len", acts_on=Component.SCHEDULER,
              modes=("eager", "full", "piecewise"), needs_prefix_cache=True,
              summary="a request between chunks of its prefill is inserted into the prefix cache without its "
                      "evicted length: the SWA slots it already freed are cached as live SWA KV",
              reference="SGLang PRs 30845 and 36909 (carry swa_evicted_seqlen into cache_unfinished_req)"),
        Fault(name="tombstone_last_leaf", acts_on=Component.SCHEDULER, modes=("eager", "full", "piecewise"),
              needs_prefix_cache=True,
              summary="before a request between chunks is inserted, its out-of-window SWA slots are freed keeping "
                      "only the window, not a page past it: at pages longer than the window the frontier reaches "
                      "the last full page, and the inserted leaf is all tombstone",
              reference="SGLang PR 29860 (keep max(window, page) when freeing before a radix insert)"),
        Fault(name="evict_branch_tail_first", acts_on=Component.PREFIX_CACHE, modes=("eager", "full", "piecewise"),
              needs_prefix_cache=True,
              summary="cache pressure tombstones SWA nodes in plain least-recently-used order: an idle branch's "
                      "trailing window goes first, and the whole branch is unmatchable while its full KV stays",
              reference="SGLang PR 35515 (evict a branch's trailing sliding window last)"),
        # index-space mistakes: an id of one space (full pool, SWA pool, pages, tokens) used in another
        Fault(name="swa_read_untranslated", acts_on=Component.ATTENTION_BACKEND,
              modes=("eager", "full", "piecewise"),
              summary="the SWA layers' page table is the full one, never translated through "
                      "full_to_swa_index_mapping: the kernel reads the SWA pool at full-pool slots (another "
                      "token's K/V or poison once the pools part, past the pool a device-side assert)",
              reference="SGLang PRs 24617, 23984 (the SWA read page table left untranslated)"),
        Fault(name="page_ids_translated_as_slots", acts_on=Component.ATTENTION_BACKEND, modes=("full",),
              summary="the decode-graph refill pushes page ids through the token-slot full_to_swa_index_mapping, "
                      "never divided by the page size: SWA token slots are read as page ids, up to page_size "
                      "times past the SWA pool (eager builds are right; pages of one token hide it)",
              reference="SGLang PR 38187 (page ids read from the graph tables at page_size > 1)"),
        Fault(name="swa_table_sized_by_swa_pages", acts_on=Component.ATTENTION_BACKEND,
              modes=("eager", "full", "piecewise"),
              summary="the SWA side's page translation table is sized by the SWA pool's pages but indexed by "
                      "full-pool page ids: once a request holds a full page past the SWA page count the lookup "
                      "runs off the table (a device-side assert)",
              reference="SGLang PR 37560 (size a non-owner's v2p by the id space it must address)"),
        Fault(name="static_batch_without_swa_loc", acts_on=Component.PIECEWISE_RUNNER, modes=("piecewise",),
              summary="replay builds the static batch without out_cache_loc_swa (the copy tests the incoming "
                      "batch, not the runner's buffer): a design that falls back to translating hides it, one "
                      "that reads pool.swa_loc writes at the last eager batch's SWA slots",
              reference="SGLang PR 14248 (the out_cache_loc_swa condition in replay_prepare)"),
        Fault(name="swa_loc_not_narrowed", acts_on=Component.PIECEWISE_RUNNER, modes=("piecewise",),
              summary="replay narrows out_cache_loc to the real tokens but leaves the SWA write ids at the "
                      "bucket's length: the SWA write of n tokens at bucket-many ids is a shape mismatch",
              reference="SGLang PR 29460 (slice the SWA cache loc to the token count for every backend)"),
        # FlashInfer's own forms of graph-metadata bugs: their switches sit in the flashinfer backend
        Fault(name="skip_replan_before_replay", acts_on=Component.ATTENTION_BACKEND, modes=("full",),
              summary="the decode graph's FlashInfer wrappers are planned for the capture batch and never re-planned "
                      "before a replay: the lists are refreshed, but the kernel runs the capture batch's plan (its "
                      "work split sized by the all-padding batch's one-page rows), the baked kv width in its real form",
              reference="TensorRT-LLM PR 18769 (state sized from the capture batch, frozen into the graph)"),
        Fault(name="indices_in_eager_buffer", acts_on=Component.ATTENTION_BACKEND, modes=("full",),
              summary="the decode-graph refresh rebuilds kv_indices in the eager path's buffer, not in the one the "
                      "captured wrapper is bound to: the plan is handed the graph-bound buffer, which keeps the "
                      "capture batch's page ids (the dummy page) while the new ones go unread",
              reference="SGLang PR 37975 (rebuild the replay metadata in the capture-stable buffer)"),
        Fault(name="swa_prefill_plan_without_window", acts_on=Component.ATTENTION_BACKEND,
              modes=("eager", "full", "piecewise"),
              summary="the SWA layers' prefill wrapper is planned without window_left and run with the planned one: "
                      "extend queries attend to every key of their pages, the tokens before the window included, "
                      "while decode wrappers keep W - 1",
              reference="SGLang PR 31501 (pass the sliding window to the SWA prefill wrapper's plan)"),
        Fault(name="fused_fp8_scale_dropped", acts_on=Component.ATTENTION_BACKEND,
              modes=("eager", "full", "piecewise"), needs_fused_write=True,
              summary="the fused FP8 quantize-and-store write never receives the layer's k/v scales and quantizes "
                      "with 1.0, while every read dequantizes with them: each stored K/V is off by the scale "
                      "(and saturates e4m3 where it would not have)",
              reference="SGLang PR 26852 (AMD's fused FP8 KV write: the per-layer scale not passed to the fused kernel)"),
    )
})
"""the harness's own faults, then those target packages register (``register_faults``)"""


def register_faults(*faults: Fault) -> None:
    """Add a target's faults to the catalog. Each acts on the target's own code (``Component.TARGET``) and so
    names the ``patch`` that applies it; a name already taken is refused."""
    for fault in faults:
        if fault.name in FAULTS and FAULTS[fault.name] != fault:
            raise ValueError(f"fault {fault.name!r} is in the catalog already")
        if fault.acts_on is not Component.TARGET or fault.patch is None:
            raise ValueError(f"fault {fault.name!r}: a target's fault acts on the target's own code "
                             "(Component.TARGET) through a patch ('package.module:function')")
        FAULTS[fault.name] = fault


def faults_acting_on(component: Component) -> frozenset[str]:
    """The names of the catalog's faults whose switch sits in ``component``."""
    return frozenset(name for name, fault in FAULTS.items() if fault.acts_on is component)


def patches_of(names: Collection[str]) -> list[str]:
    """The ``patch`` import paths of the named catalog faults that have one, in catalog order."""
    return [f.patch for name, f in FAULTS.items() if name in names and f.patch is not None]

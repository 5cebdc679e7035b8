"""Faults on the installed SGLang's own code: patches, each a context manager that a catalog fault names
(``Fault.patch`` in ``serving/faults.py``) and the run driver enters around one run in that run's process (a
forked child under ``harness run`` and the scenario items), so the parent's SGLang stays as installed.

Each re-creates a bug family that exists in 0.5.23's code paths the adapter drives; the third,
``skip_metadata_refresh``, lives beside the design it breaks (``designs.py``).
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from .installed import load


@contextmanager
def evict_one_page_too_far() -> Iterator[None]:
    """The installed ``free_swa_out_of_window_slots`` called with a sliding window one page short: its frontier
    runs one page past the window (SGLang PR 22470's over-eviction), and the oldest key still inside a
    request's window loses its SWA slot. Patched where SGLang's callers look it up (its module)."""
    api = load()
    common = sys.modules[api.free_swa_out_of_window_slots.__module__]
    original = common.free_swa_out_of_window_slots

    def one_page_short(req, pre_len, *, sliding_window_size, page_size, **kwargs):  # noqa: ANN001, ANN202
        return original(req, pre_len, sliding_window_size=sliding_window_size - page_size, page_size=page_size,
                        **kwargs)

    common.free_swa_out_of_window_slots = one_page_short
    try:
        yield
    finally:
        common.free_swa_out_of_window_slots = original


@contextmanager
def reuse_previous_plan() -> Iterator[None]:
    """The installed ``KVIndexTranslator.plan`` hands each new iteration's ``KVLocPlan`` the previous plan's
    sliding-window ids: the plan memoizes one id tensor per sub-pool keyed by the sub-pool's ``IdSpace.key``,
    not by the batch, so a memo that outlives its iteration is served as this one's (PRs 35245, 37307). A longer
    stale tensor passes the consumer's length check and is cut; a shorter one is padded with the sink."""
    api = load()
    translator_cls = api.KVIndexTranslator
    original = translator_cls.plan
    last: weakref.WeakKeyDictionary[object, object] = weakref.WeakKeyDictionary()

    def plan(self, **kwargs):  # noqa: ANN001, ANN202
        new = original(self, **kwargs)
        previous = last.get(self)
        space = self.space(api.IdSpaceKind.SLIDING_WINDOW)
        if previous is not None and space is not None and space.key in previous._write_ids:
            new._write_ids[space.key] = previous._write_ids[space.key]
        last[self] = new
        return new

    translator_cls.plan = plan
    try:
        yield
    finally:
        translator_cls.plan = original


@contextmanager
def skip_evict_mid_prefill() -> Iterator[None]:
    """The installed ``ScheduleBatch.maybe_evict_swa`` skips extend batches: a request in chunked prefill never
    frees the SWA slots its earlier chunks left behind the window, and a long prompt holds every SWA slot it
    was given until its first decode (SGLang PR 33805: a path that never ran SWA eviction). Decode batches
    evict as installed. Reached only under SGLang's own schedule (``schedule.py``), which builds real
    ``ScheduleBatch``es."""
    load()
    from sglang.srt.managers.schedule_batch import ScheduleBatch  # noqa: PLC0415 - after the stand-ins

    original = ScheduleBatch.maybe_evict_swa

    def maybe_evict_swa(self):  # noqa: ANN001, ANN202
        if self.forward_mode.is_extend():
            return None
        return original(self)

    ScheduleBatch.maybe_evict_swa = maybe_evict_swa
    try:
        yield
    finally:
        ScheduleBatch.maybe_evict_swa = original


@contextmanager
def frontier_in_tokens() -> Iterator[None]:
    """The radix tree's own SWA frees (the SWA component's ``free_swa_out_of_window_slots`` before an insert
    between chunks, ``checkpoint_into_tree``, and after a branch insert) count the frontier in tokens where
    pages were meant: the call gets a page size of 1, so the kept span is the window itself, not the window
    rounded up to whole pages, and the frontier is not floored to a page (SGLang PR 34870's family: a frontier
    in the wrong unit, one page short). At pages longer than the window a chunk's frontier reaches the page the
    insert stops at; at page 1 the patch changes nothing. ``ScheduleBatch.maybe_evict_swa``'s own calls (the
    ``common`` module's name) stay as installed."""
    load()
    from sglang.srt.mem_cache.unified_cache.components import swa  # noqa: PLC0415 - after the stand-ins

    original = swa.free_swa_out_of_window_slots

    def in_tokens(req, pre_len, *, page_size, **kwargs):  # noqa: ANN001, ANN202
        return original(req, pre_len, page_size=1, **kwargs)

    swa.free_swa_out_of_window_slots = in_tokens
    try:
        yield
    finally:
        swa.free_swa_out_of_window_slots = original


@contextmanager
def match_len_not_reset() -> Iterator[None]:
    """The installed SWA component's match validator resets its count of live SWA tokens since the last tombstone
    only when the run before that tombstone was a full window (SGLang before PR 17061): a short run before a
    second tombstone counts towards the window after it, and a match may end with tombstoned (freed) tokens
    inside the window its first query reads. Wraps the installed validator (``create_match_validator``), which
    still decides at every tombstone; the wrapper keeps the faulty count beside it and accepts a node the
    faulty count reaches the window at."""
    load()
    from sglang.srt.mem_cache.unified_cache.components.swa import SWAComponent  # noqa: PLC0415

    original = SWAComponent.create_match_validator

    def create_match_validator(self, match_device_only=False):  # noqa: ANN001, ANN202
        installed = original(self, match_device_only=match_device_only)
        window, ct = self.sliding_window_size, self.component_type
        run = [float("inf")]  # live tokens since the last reset, as the faulty count has them

        def validator(node):  # noqa: ANN001, ANN202
            accepted = installed(node)
            if node.component_data[ct].value is None:  # a tombstone (no HiCache here: no host copies)
                if run[0] >= window:
                    run[0] = 0
                return accepted
            run[0] += len(node.key)
            return accepted or run[0] >= window

        return validator

    SWAComponent.create_match_validator = create_match_validator
    try:
        yield
    finally:
        SWAComponent.create_match_validator = original

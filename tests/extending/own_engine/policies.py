"""Eviction policies of one's own, built on the library's as an engine engineer builds on an existing one."""

from __future__ import annotations

from harness.serving.eviction import RequestWindow, TightEviction


class StopsFreeingOnceDecoding(TightEviction):
    """A leak: frees what left the window while the request prefills, nothing once it decodes. Its own frontier
    is where it stopped, so only a bound that is not the policy's catches it."""

    name = "stops_freeing_once_decoding"

    def frontier(self, req: RequestWindow) -> int:
        return req.swa_evicted if req.decoded > 0 else super().frontier(req)


class FreesInBatches(TightEviction):
    """A correct policy of one's own: frees what left the window only once the frontier has moved the
    scenario's interval past what it freed (as SGLang batches its frees), declaring so. It keeps SWA pages
    longer than ``tight``, so pages are reused in another order: another schedule, the same K/V."""

    name = "frees_in_batches"
    frees_every_step = False

    def frontier(self, req: RequestWindow) -> int:
        due = super().frontier(req)
        return due if due >= req.swa_evicted + self.spec.interval else req.swa_evicted

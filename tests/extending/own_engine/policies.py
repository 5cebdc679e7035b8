"""Eviction policies of one's own, built on the library's as an engine engineer builds on an existing one."""

from __future__ import annotations

from harness.serving.eviction import RequestWindow, TightEviction


class StopsFreeingOnceDecoding(TightEviction):
    """A leak: frees what left the window while the request prefills, nothing once it decodes. Its own frontier
    is where it stopped, so only a bound that is not the policy's catches it."""

    name = "stops_freeing_once_decoding"

    def frontier(self, req: RequestWindow) -> int:
        return req.swa_evicted if req.decoded > 0 else super().frontier(req)

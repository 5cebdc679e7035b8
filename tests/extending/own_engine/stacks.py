"""Serving stacks of one's own, built on the library's miniature as an engine engineer patches an allocator."""

from __future__ import annotations

import torch

from harness.serving.miniature import MiniatureStack


class NewestFirstFree(MiniatureStack):
    """Gives a finished request's pages back newest first. A correct change: under FIFO or LIFO free orders
    another page is reused next, so the schedule differs from the built-in stack's, never what a live token
    holds."""

    name = "newest_first_free"

    def free(self, full_slots: torch.Tensor) -> None:
        super().free(full_slots.flip(0))


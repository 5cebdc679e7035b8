"""Argument types the subcommands share: each turns a bad value into argparse's one-line usage error."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def int_at_least(minimum: int, what: str) -> Callable[[str], int]:
    """An argparse type for an integer of at least ``minimum``, named ``what`` in its error (``a positive
    integer``, ``a non-negative integer``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    return parse

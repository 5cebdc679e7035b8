"""Serving stacks and eviction policies by name. One of this package is one module plus one line here; a
third-party one is named by ``package.module:Class`` wherever a name is expected."""

from __future__ import annotations

from ..imports import load_named, subclass_of
from .eviction import EvictionPolicy
from .stack import ServingStack

STACKS: dict[str, str] = {
    "miniature": "harness.serving.miniature:MiniatureStack",
}

EVICTION_POLICIES: dict[str, str] = {
    "tight": "harness.serving.eviction:TightEviction",
}


def stack_class(name: str) -> type[ServingStack]:
    """The serving stack a registered name or ``package.module:Class`` names; KeyError otherwise."""
    return load_named(name, STACKS, kind="serving stack", check=subclass_of(ServingStack))  # type: ignore[return-value]


def eviction_policy(name: str, *, window: int, page_size: int = 1) -> EvictionPolicy:
    """An eviction policy by registered name or ``package.module:Class``, for one model's window."""
    cls = load_named(name, EVICTION_POLICIES, kind="eviction policy", check=subclass_of(EvictionPolicy))
    return cls(window=window, page_size=page_size)  # type: ignore[operator]

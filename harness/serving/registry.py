"""Serving stacks and eviction policies by name. One of this package is one module plus one line here; a
third-party one is named by ``package.module:Class`` wherever a name is expected."""

from __future__ import annotations

from ..imports import load_named, subclass_of
from .eviction import EvictionPolicy, EvictionSpec
from .stack import ServingStack

STACKS: dict[str, str] = {
    "miniature": "harness.serving.miniature:MiniatureStack",
    "sglang": "harness.sglang.stack:SGLangStack",
}
# stacks whose module imports an optional install (the installed SGLang): loading a scenario never imports
# them, so the load-time dry run stands the miniature in for them
OPTIONAL_STACKS = frozenset({"sglang"})

EVICTION_POLICIES: dict[str, str] = {
    "tight": "harness.serving.eviction:TightEviction",
    "sglang": "harness.serving.eviction:SGLangEviction",
}


def stack_class(name: str) -> type[ServingStack]:
    """The serving stack a registered name or ``package.module:Class`` names; KeyError otherwise."""
    return load_named(name, STACKS, kind="serving stack", check=subclass_of(ServingStack))  # type: ignore[return-value]


def eviction_policy(spec: EvictionSpec, *, window: int, page_size: int = 1,
                    prefix_sharing: bool = False) -> EvictionPolicy:
    """The eviction policy ``spec`` names (registered, or ``package.module:Class``), for one model's window."""
    cls = load_named(spec.policy, EVICTION_POLICIES, kind="eviction policy", check=subclass_of(EvictionPolicy))
    return cls(spec, window=window, page_size=page_size, prefix_sharing=prefix_sharing)  # type: ignore[operator]

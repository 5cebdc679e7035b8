"""Serving stacks and eviction policies by name. One of this package is one module plus one line here; a
target package (``harness/sglang``) registers its own through ``register_stack`` from its ``harness.targets``
entry point, touching nothing here; a third-party one is named by ``package.module:Class`` wherever a name is
expected.

Nothing here imports a stack or a policy, nor torch: the tables hold import paths, loaded when a run needs one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..imports import Registry, load_named, subclass_of

if TYPE_CHECKING:
    from .eviction import EvictionPolicy, EvictionSpec
    from .stack import ServingStack

STACKS: Registry[str] = Registry({
    "miniature": "harness.serving.miniature:MiniatureStack",
})
OPTIONAL_STACKS: Registry[str] = Registry()
"""stacks whose module imports an optional install, by name -> the install: loading a scenario never imports
them, so the load-time dry run stands the miniature in for them"""

EVICTION_POLICIES: Registry[str] = Registry({
    "tight": "harness.serving.eviction:TightEviction",
    "sglang": "harness.serving.eviction:SGLangEviction",
})


def register_stack(name: str, path: str, *, optional_install: str | None = None) -> None:
    """Register a serving stack by name: ``path`` is its ``package.module:Class``; ``optional_install`` names
    what its module imports that a default install lacks (the dry run then stands the miniature in)."""
    if name in STACKS and STACKS[name] != path:
        raise ValueError(f"serving stack {name!r} is registered already, as {STACKS[name]}")
    STACKS[name] = path
    if optional_install is not None:
        OPTIONAL_STACKS[name] = optional_install


def register_eviction_policy(name: str, path: str) -> None:
    """Register an eviction policy by name (``package.module:Class``)."""
    if name in EVICTION_POLICIES and EVICTION_POLICIES[name] != path:
        raise ValueError(f"eviction policy {name!r} is registered already, as {EVICTION_POLICIES[name]}")
    EVICTION_POLICIES[name] = path


def stack_class(name: str) -> type[ServingStack]:
    """The serving stack a registered name or ``package.module:Class`` names; KeyError otherwise."""
    from .stack import ServingStack

    return load_named(name, STACKS, kind="serving stack", check=subclass_of(ServingStack))  # type: ignore[return-value]


def eviction_policy(spec: EvictionSpec, *, window: int, page_size: int = 1,
                    prefix_sharing: bool = False) -> EvictionPolicy:
    """The eviction policy ``spec`` names (registered, or ``package.module:Class``), for one model's window."""
    from .eviction import EvictionPolicy

    cls = load_named(spec.policy, EVICTION_POLICIES, kind="eviction policy", check=subclass_of(EvictionPolicy))
    return cls(spec, window=window, page_size=page_size, prefix_sharing=prefix_sharing)  # type: ignore[operator]

"""Serving stacks and eviction policies by name. One of this package is one module plus one line here; a
target package (``harness/sglang``) registers its own through ``register_stack`` from its ``harness.targets``
entry point, touching nothing here; a third-party one is named by ``package.module:Class`` wherever a name is
expected.

Nothing here imports a stack or a policy, nor torch: the tables hold import paths, loaded when a run needs one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..declarations import call_hook, expected, is_int, owner
from ..imports import Registry, load_named, subclass_of

if TYPE_CHECKING:
    from .eviction import EvictionPolicy, EvictionSpec, RequestWindow
    from .kv_groups import KVGroups
    from .stack import ServingStack, StackSpec

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


STACK_SCHEDULERS: Registry[str] = Registry()
"""stacks that bring their own scheduler, by name -> ``package.module:function``: the function takes the run's
stack and ``(timeline, eviction=, vocab_size=, faults=)`` and returns an object driven as
``scheduler.Scheduler``, or None where the harness's scheduler is to drive the stack"""


STACK_AVAILABILITY: Registry[str] = Registry()
"""stacks of an optional install, by name -> ``package.module:function``: a cheap check (it imports nothing of the
install) returning why the stack cannot run on this machine, or None; the matrix skips its runs with that reason"""


def register_stack(name: str, path: str, *, optional_install: str | None = None,
                   scheduler: str | None = None, unavailable: str | None = None) -> None:
    """Register a serving stack by name: ``path`` is its ``package.module:Class``; ``optional_install`` names
    what its module imports that a default install lacks (the dry run then stands the miniature in);
    ``scheduler`` names the stack's own scheduler factory (``STACK_SCHEDULERS``); ``unavailable`` its check
    of the install (``STACK_AVAILABILITY``)."""
    if name in STACKS and STACKS[name] != path:
        raise ValueError(f"serving stack {name!r} is registered already, as {STACKS[name]}")
    STACKS[name] = path
    if optional_install is not None:
        OPTIONAL_STACKS[name] = optional_install
    if scheduler is not None:
        STACK_SCHEDULERS[name] = scheduler
    if unavailable is not None:
        STACK_AVAILABILITY[name] = unavailable


def stack_unavailable(name: str) -> str | None:
    """Why the registered stack ``name`` cannot run on this machine (its install is missing), or None."""
    path = STACK_AVAILABILITY.get(name)
    if path is None:
        return None
    check = load_named(path, {}, kind="stack availability check",
                       check=lambda obj: None if callable(obj) else "is not callable")
    return check()  # type: ignore[operator]


def own_scheduler(name: str, stack: ServingStack, timeline: object, *, eviction: object, vocab_size: int,
                  faults: frozenset[str]) -> object | None:
    """The scheduler the stack registered as ``name`` brings for this run, or None (the harness's drives it)."""
    path = STACK_SCHEDULERS.get(name)
    if path is None:
        return None
    factory = load_named(path, {}, kind="stack scheduler", check=lambda obj: None if callable(obj) else
                         "is not callable")
    return factory(stack, timeline, eviction=eviction, vocab_size=vocab_size, faults=faults)  # type: ignore[operator]


def register_eviction_policy(name: str, path: str) -> None:
    """Register an eviction policy by name (``package.module:Class``)."""
    if name in EVICTION_POLICIES and EVICTION_POLICIES[name] != path:
        raise ValueError(f"eviction policy {name!r} is registered already, as {EVICTION_POLICIES[name]}")
    EVICTION_POLICIES[name] = path


def stack_class(name: str) -> type[ServingStack]:
    """The serving stack a registered name or ``package.module:Class`` names, its declarations checked;
    KeyError otherwise (a ``declarations.DeclarationError`` for a declaration that does not hold)."""
    from .stack import ServingStack

    return load_named(name, STACKS, kind="serving stack", check=_is_declared_stack)  # type: ignore[return-value]


def _is_declared_stack(obj: object) -> str | None:
    from .stack import ServingStack

    if (why := subclass_of(ServingStack)(obj)) is not None:
        return why
    at = owner(obj)
    if hasattr(obj, "name") and not (isinstance(obj.name, str) and obj.name):  # type: ignore[attr-defined]
        raise expected("serving stack", f"{at}.name", "a non-empty str", obj.name)  # type: ignore[attr-defined]
    if not isinstance(asks := getattr(obj, "asks_swa_design"), bool):
        raise expected("serving stack", f"{at}.asks_swa_design", "a bool", asks)
    return None


def stack_kv_groups(cls: type[ServingStack], spec: StackSpec) -> KVGroups:
    """``cls.kv_groups(spec)``, which must return ``KVGroups`` with a group for every layer of the spec's
    model; DeclarationError otherwise (what it raises included: the report asks it outside any run)."""
    layers = len(spec.layer_is_swa)
    return call_hook("serving stack", f"{owner(cls)}.kv_groups()", cls.kv_groups, spec,  # type: ignore[return-value]
                     returns=_groups_wanted(layers), valid=lambda got: _groups_hold(got, layers))


def build_stack(cls: type[ServingStack], spec: StackSpec) -> ServingStack:
    """``cls.build(spec)``, which must return an instance of ``cls`` whose ``groups`` are ``KVGroups`` with a
    group for every layer of the spec's model; DeclarationError otherwise. What ``build`` raises passes
    through: it fails the run, as the stack's own error."""
    stack = cls.build(spec)
    if not isinstance(stack, cls):
        raise expected("serving stack", f"{owner(cls)}.build()", f"an instance of {owner(cls)}", stack)
    if not _groups_hold(stack.groups, len(spec.layer_is_swa)):
        raise expected("serving stack", f"{owner(cls)}.kv_groups()", _groups_wanted(len(spec.layer_is_swa)),
                       stack.groups)
    return stack


def _groups_hold(got: object, num_layers: int) -> bool:
    from .kv_groups import KVGroups

    if not isinstance(got, KVGroups):
        return False
    try:
        for layer in range(num_layers):
            got.of_layer(layer)
    except KeyError:
        return False
    return True


def _groups_wanted(num_layers: int) -> str:
    return f"KVGroups with a group for each of layers 0..{num_layers - 1}"


def eviction_policy(spec: EvictionSpec, *, window: int, page_size: int = 1,
                    prefix_sharing: bool = False) -> EvictionPolicy:
    """The eviction policy ``spec`` names (registered, or ``package.module:Class``), for one model's window;
    KeyError where it does not load (a DeclarationError for a declaration that does not hold)."""
    cls = load_named(spec.policy, EVICTION_POLICIES, kind="eviction policy", check=_is_declared_policy)
    policy = cls(spec, window=window, page_size=page_size, prefix_sharing=prefix_sharing)  # type: ignore[operator]
    if not isinstance(policy, cls):  # a __new__ of its own may return anything
        raise expected("eviction policy", f"{owner(cls)}()", f"an instance of {owner(cls)}", policy)
    return policy


def _is_declared_policy(obj: object) -> str | None:
    from .eviction import EvictionPolicy

    if (why := subclass_of(EvictionPolicy)(obj)) is not None:
        return why
    if hasattr(obj, "name") and not (isinstance(obj.name, str) and obj.name):  # type: ignore[attr-defined]
        raise expected("eviction policy", f"{owner(obj)}.name", "a non-empty str", obj.name)  # type: ignore[attr-defined]
    if not isinstance(every := getattr(obj, "frees_every_step"), bool):
        raise expected("eviction policy", f"{owner(obj)}.frees_every_step", "a bool", every)
    return None


def frontier(policy: EvictionPolicy, req: RequestWindow) -> int:
    """``policy.frontier(req)``, which must return an int position; DeclarationError otherwise. What it raises
    passes through: it fails the run it is in, as the policy's own error."""
    at = policy.frontier(req)
    if not is_int(at):
        raise expected("eviction policy", f"{owner(type(policy))}.frontier()",
                       "an int (the position below which SWA slots are freed)", at)
    return at


# ---- the built-in a plug-in is judged against -----------------------------------------------------------

REFERENCE_STACK = "miniature"
"""the serving stack that judges one named by import path that derives from no registered stack"""
REFERENCE_POLICY = "tight"
"""the eviction policy that judges one named by import path that derives from no registered policy"""


def reference_stack(name: str, spec: StackSpec) -> str:
    """The serving stack whose eager run judges the runs of stack ``name`` over ``spec``. A registered stack is
    its own (the library's, or a target's as SGLang itself). One named by import path is judged against the
    built-in of its kind, so that a bug of its own cannot hide in the reference too: the registered stack it
    derives from (nearest first), else ``REFERENCE_STACK``, the first with its KV groups (the diff compares
    group by group); itself where none has them, or where it does not load (its runs then say why)."""
    if name in STACKS:
        return name
    try:
        cls = stack_class(name)
        groups = stack_kv_groups(cls, spec)
    except KeyError:  # DeclarationError included: a stack that does not load or keep its contract
        return name
    for candidate in dict.fromkeys((*_registered_bases(cls, STACKS), REFERENCE_STACK)):
        if candidate in OPTIONAL_STACKS:
            continue  # its install may be missing; a plug-in over it names it as its own reference by registering
        try:
            if stack_kv_groups(stack_class(candidate), spec) == groups:
                return candidate
        except KeyError:
            continue
    return name


def reference_policy(name: str) -> str:
    """The eviction policy whose eager run judges the runs of policy ``name``: a registered one itself; one
    named by import path the registered policy it derives from (nearest first), else ``REFERENCE_POLICY``.
    Which tokens a run holds does not depend on the policy (the window decides what the next query reads; the
    ``retained`` invariant bounds what a policy may keep), so any policy is judged token by token against
    another; a policy that does not load is its own (its runs say why)."""
    if name in EVICTION_POLICIES:
        return name
    try:
        cls = load_named(name, EVICTION_POLICIES, kind="eviction policy", check=_is_declared_policy)
    except KeyError:
        return name
    return next(iter(_registered_bases(cls, EVICTION_POLICIES)), REFERENCE_POLICY)


def _registered_bases(cls: object, table: Registry[str]) -> list[str]:
    """The registered names among the base classes of ``cls``, nearest first (by import path: nothing loads)."""
    paths = {path: name for name, path in table.items()}
    out = []
    for base in getattr(cls, "__mro__", ())[1:]:
        name = paths.get(f"{base.__module__}:{base.__qualname__}")
        if name is not None:
            out.append(name)
    return out

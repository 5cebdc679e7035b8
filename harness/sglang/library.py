"""The scenario library under the installed SGLang: each scenario it can express, with its serving stack,
free order and eviction switched to SGLang's, judged against the scenario's own expectations.

A scenario moves over with its timeline, window, page size and eviction interval (its ``sglang`` policy's, 1
under the harness's ``tight`` policy, whose frontier SGLang's function reaches at an interval of 1);
frees follow SGLang's order at the page size, and the frontier is the installed
``free_swa_out_of_window_slots``'s (``eviction.InstalledSGLangEviction``). The model, designs, backends and
graph engine stay the harness's: they write and read the installed pool's buffers.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from ..runspec import RunSpec
from ..scenario.spec import ScenarioSpec
from ..serving.eviction import EvictionSpec
from ..serving.stack import StackSpec
from .stack import free_order, unsupported

INSTALLED_EVICTION = "harness.sglang.eviction:InstalledSGLangEviction"

S = TypeVar("S", ScenarioSpec, RunSpec)


def on_sglang(scenario: S) -> S:
    """``scenario`` (a ``ScenarioSpec`` or one ``RunSpec``) with the installed SGLang as its serving stack and
    SGLang's eviction and free order."""
    interval = scenario.eviction.interval if scenario.eviction.policy == "sglang" else 1
    return dataclasses.replace(
        scenario, serving="sglang",
        pool=dataclasses.replace(scenario.pool, free_order=free_order(scenario.pool.page_size)),
        eviction=EvictionSpec(policy=INSTALLED_EVICTION, interval=interval,
                              prefix_cache=scenario.eviction.prefix_cache),
    )


def fuzz_onto_sglang(spec: RunSpec) -> RunSpec | str:
    """A generated run moved onto the installed SGLang (``fuzz --serving sglang``), or why it cannot be."""
    return not_expressible(spec) or on_sglang(spec)


def not_expressible(scenario: ScenarioSpec | RunSpec) -> str | None:
    """Why the scenario cannot run on the installed SGLang through the adapter, or None."""
    if scenario.eviction.policy not in ("tight", "sglang"):
        return f"eviction.policy {scenario.eviction.policy!r}: only the harness's tight and sglang policies " \
               "have a counterpart in SGLang"
    moved = on_sglang(scenario)
    return unsupported(StackSpec(pool=moved.pool, layer_is_swa=tuple(moved.model.layer_is_swa), num_kv_heads=1,
                                 head_dim=1))


def pools_too_small(scenario: ScenarioSpec) -> str | None:
    """Why the scenario's pools, sized for its own eviction, run dry once it is moved onto SGLang's (whose
    frontier keeps the window and a page, where the harness's ``tight`` policy frees at the window), or None.
    The miniature's own schedule under SGLang's eviction and free order says so (the differential test holds
    it to SGLang's step by step), so such a scenario is out of reach, not a failure of SGLang's pool."""
    from ..scenario.dry_run import dry_run

    found = dry_run(on_sglang(scenario), load_policy=True)
    return "; ".join(f"{p.key}: {p.message}" for p in found) or None

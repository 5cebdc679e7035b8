"""``ScenarioSpec`` back to a scenario file: the inverse of the reader.

A fuzzer or a test builds specs in Python; writing one out gives a file a person can read, edit and rerun,
and ``load_scenario`` of that file gives back an equal spec (the library round-trips in the tests). Only
what differs from a default is written, so a written file reads like a hand-written one.
"""

from __future__ import annotations

import dataclasses
import math

from ..runspec import TIMEOUT_DEFAULT_S, GraphSpec, KVWrite, Mode
from ..serving.designs import DEFAULT_DESIGNS
from ..serving.eviction import EvictionSpec
from ..serving.model import PRESETS
from ..serving.pool import PoolSpec
from ..serving.timeline import RequestSpec, TimelineSpec
from .toml_access import toml_key, toml_string
from .spec import DEFAULT_BACKENDS, Expectation, ScenarioSpec


_DEFAULT_STACK = ScenarioSpec.__dataclass_fields__["serving"].default


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return toml_string(str(v))
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to a scenario file")


def _table(name: str, items: list[tuple[str, object]]) -> list[str]:
    return [f"[{name}]", *(f"{toml_key(k)} = {_value(v)}" for k, v in items), ""]


def _changed(spec: object, base: object, skip: tuple[str, ...] = ()) -> list[tuple[str, object]]:
    return [(f.name, getattr(spec, f.name)) for f in dataclasses.fields(spec)
            if f.name not in skip and getattr(spec, f.name) != getattr(base, f.name)]


def scenario_toml(spec: ScenarioSpec) -> str:
    """The text of a scenario file that loads back to ``spec`` (name and path aside)."""
    lines = [f"description = {_value(spec.description)}"]
    if spec.tags:
        lines.append(f"tags = {_value(spec.tags)}")
    if spec.references:
        lines.append(f"references = {_value(spec.references)}")
    lines.append("")
    lines += _table("model", [("preset", spec.model.name), *_changed(spec.model, PRESETS[spec.model.name], ("name",))])
    pool_defaults = PoolSpec(full_size=spec.pool.full_size, swa_size=spec.pool.swa_size)
    lines += _table("pool", [("full_size", spec.pool.full_size), ("swa_size", spec.pool.swa_size),
                             *_changed(spec.pool, pool_defaults, ("full_size", "swa_size", "free_order"))])
    serving = [] if spec.serving == _DEFAULT_STACK else [("stack", spec.serving)]
    if spec.pool.free_order != pool_defaults.free_order:  # the stack's knob: [serving] is its home
        serving.append(("free_order", spec.pool.free_order))
    if serving:
        lines += _table("serving", serving)
    if eviction := _changed(spec.eviction, EvictionSpec()):
        lines += _table("eviction", eviction)
    graphs = _changed(spec.graphs, GraphSpec())
    if spec.modes != tuple(Mode):
        graphs.insert(0, ("modes", spec.modes))
    if graphs:
        lines += _table("graphs", graphs)
    lines += _table("timeline", _changed(spec.timeline, TimelineSpec(requests=()), ("requests",)))
    for req in spec.timeline.requests:
        lines += _table("[timeline.requests]", [("rid", req.rid), ("prompt_len", req.prompt_len),
                                                 *_changed(req, RequestSpec(rid=req.rid, prompt_len=req.prompt_len))])
    run = []
    if spec.designs != DEFAULT_DESIGNS:
        run.append(("designs", spec.designs))
    if spec.backends != DEFAULT_BACKENDS:
        run.append(("backends", spec.backends))
    if spec.kv_write != KVWrite.PLAIN:
        run.append(("kv_write", spec.kv_write))
    if spec.faults:
        run.append(("faults", spec.faults))
    if spec.timeout_s != TIMEOUT_DEFAULT_S:
        run.append(("timeout_s", spec.timeout_s))
    if run:
        lines += _table("run", run)
    for exp in spec.expectations:
        lines += _expectation(exp)
    return "\n".join(lines).rstrip() + "\n"


def _expectation(exp: Expectation) -> list[str]:
    at = f"expect.{toml_key(exp.design)}"
    items: list[tuple[str, object]] = [("verdict", exp.verdict), *exp.by_mode]
    if exp.without_faults is not None:
        items.append(("without_faults", exp.without_faults))
    lines = _table(at, [*items, ("why", exp.why)])
    for override in exp.by_backend:
        sub: list[tuple[str, object]] = []
        if override.verdict is not None:
            sub.append(("verdict", override.verdict))
        sub += list(override.by_mode)
        if override.without_faults is not None:
            sub.append(("without_faults", override.without_faults))
        lines += _table(f"{at}.by_backend.{toml_key(override.backend)}", [*sub, ("why", override.why)])
    return lines

"""A generated run as a scenario: ``RunSpec`` to ``ScenarioSpec``, so that a case a fuzzer or a test made can
be written as a file (``scenario_toml``) a person reads, edits and reruns, and that loads back equal.

The expectations come from the designs' declarations where they say enough: a design declared sound is
expected to match in a run without faults; for a known-wrong design, one that declares nothing, or any run
with faults, the caller says what it expects (``expectations``), and a design left without one is refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ..runspec import Mode, Outcome, RunSpec
from ..serving.designs import declared
from .spec import Expectation, ScenarioSpec


def scenario_of(
    spec: RunSpec,
    *,
    name: str,
    description: str,
    designs: Iterable[str] | None = None,
    modes: Iterable[str] | None = None,
    backends: Iterable[str] | None = None,
    expectations: Iterable[Expectation] = (),
    tags: tuple[str, ...] = ("generated",),
    references: tuple[str, ...] = (),
) -> ScenarioSpec:
    """The scenario that runs ``spec``'s model, pool, timeline, graphs, faults, serving stack and eviction
    over ``designs`` x ``modes`` x ``backends`` (each default: the spec's own one).

    ``expectations`` name their design; every other design takes the one its declaration implies (sound, no
    faults: ``match``) or is a ValueError saying so. The run's engine and device are how it is run, not what
    it is, and stay the caller's; a runner named by import path has no place in a scenario file (ValueError).
    """
    if spec.runner is not None:
        raise ValueError(f"runner {spec.runner!r}: a scenario file names no runner (pass it with --runner)")
    designs = tuple(dict.fromkeys(designs or (spec.design,)))
    given = {e.design: e for e in expectations}
    if stray := [d for d in given if d not in designs]:
        raise ValueError(f"expectations for designs the scenario does not run: {', '.join(stray)}")
    faults = tuple(sorted(spec.faults))
    out = []
    for design in designs:
        exp = given.get(design) or _declared_expectation(design, faulted=bool(faults))
        if exp is None:
            raise ValueError(f"design {design!r}: {_why_no_expectation(design, faulted=bool(faults))}; pass its "
                             "Expectation in expectations")
        out.append(exp)
    return ScenarioSpec(
        name=name, path=Path(f"{name}.toml"), description=description, tags=tags, references=references,
        model=spec.model, pool=spec.pool, timeline=spec.timeline, graphs=spec.graphs,
        modes=tuple(Mode(m) for m in dict.fromkeys(modes or (spec.mode,))), designs=designs,
        backends=tuple(dict.fromkeys(backends or (spec.backend,))), kv_write=spec.kv_write, faults=faults,
        expectations=tuple(out), serving=spec.serving, eviction=spec.eviction,
    )


def _declared_expectation(design: str, *, faulted: bool) -> Expectation | None:
    record = declared(design)
    if faulted or record is None or not record.sound:
        return None
    return Expectation(design=design, verdict=Outcome.MATCH, why=f"declared sound: {record.rule}")


def _why_no_expectation(design: str, *, faulted: bool) -> str:
    record = declared(design)
    if record is None:
        return "it declares nothing (no Design record)"
    if not record.sound:
        return "it is declared known-wrong, and where it fails is the scenario's to say"
    assert faulted
    return "the run has faults, and a declaration says only what a clean run gives"


__all__ = ["scenario_of"]

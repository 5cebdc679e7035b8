"""The competing rules for where a sliding-window layer writes its K/V (docs/design.md section 3).

A design is a function ``(forward_batch, pool, metadata, layer_id) -> swa write locations`` (the
``SWALocDesign`` protocol of ``batch.py``). The backend calls it from ``_get_layer_cache_loc`` for SWA
layers only; full layers always write at ``out_cache_loc``.
``metadata`` is the backend's per-forward metadata; its ``out_cache_loc_swa`` is filled by the backend
once per forward (the ``metadata`` design reads it).

Each built-in design is declared by a ``Design`` record (sound or known-wrong, needs a plan, opt-in, the
real change it stands for, its rule in a line) in ``DESIGN_RECORDS``: the matrix, the report, the design
table of docs/scenarios.md and the tests read the records. A third-party design is a function with the same signature named by
import path, ``package.module:function``; no harness file needs editing, and ``declare`` gives it the same
record.
"""

from __future__ import annotations

import dataclasses
import importlib
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..declarations import expected

if TYPE_CHECKING:  # the names of the designs are what --help and option errors need, not torch
    import torch

    from .batch import BackendMetadata, ForwardBatch, SWALocDesign
    from .pool import HybridSWAKVPool


def translate(
    forward_batch: ForwardBatch, pool: HybridSWAKVPool, metadata: BackendMetadata, layer_id: int
) -> torch.Tensor:
    """Re-translate ``out_cache_loc`` in every layer (SGLang PR 19107; again after PR 25824)."""
    return pool.translate_loc_from_full_to_swa(forward_batch.out_cache_loc)


def stale_state(
    forward_batch: ForwardBatch, pool: HybridSWAKVPool, metadata: BackendMetadata, layer_id: int
) -> torch.Tensor:
    """Read the pool's ``swa_loc`` attribute: first draft of SGLang PR 24138, rejected in review."""
    if pool.swa_loc is None:
        raise RuntimeError("pool.swa_loc is None: no batch has set it yet")
    return pool.swa_loc


def forward_batch(
    forward_batch: ForwardBatch, pool: HybridSWAKVPool, metadata: BackendMetadata, layer_id: int
) -> torch.Tensor:
    """The batch's precomputed ``out_cache_loc_swa``, translating only without it (PR 24138 as merged)."""
    if forward_batch.out_cache_loc_swa is not None:
        return forward_batch.out_cache_loc_swa
    return pool.translate_loc_from_full_to_swa(forward_batch.out_cache_loc)


def memoized(
    forward_batch: ForwardBatch, pool: HybridSWAKVPool, metadata: BackendMetadata, layer_id: int
) -> torch.Tensor:
    """The pool caches the translation by (storage pointer, numel) in one entry the read path's page-table
    translations share (``memoizes_reads``), dropped per forward, before every metadata init and by the
    allocator (PR 25824)."""
    return pool.translate_memoized(forward_batch.out_cache_loc)


def metadata(
    forward_batch: ForwardBatch, pool: HybridSWAKVPool, metadata: BackendMetadata, layer_id: int
) -> torch.Tensor:
    """The backend's own per-forward copy; graphs refill a persistent buffer (PR 27617, upstream today)."""
    if metadata.out_cache_loc_swa is None:
        raise RuntimeError("backend metadata has no out_cache_loc_swa: init_forward_metadata did not run")
    return metadata.out_cache_loc_swa


def plan(
    forward_batch: ForwardBatch, pool: HybridSWAKVPool, metadata: BackendMetadata, layer_id: int
) -> torch.Tensor:
    """This forward's columns of the iteration's location plan, translated once per iteration and shared by
    every forward of it (SGLang 0.5.23's ``KVLocPlan``; PRs 35245, 37307, 37550, 37926)."""
    if forward_batch.kv_loc_plan is None:
        # SGLang 0.5.23's pool asserts a pre-translated SWA location; it never translates itself
        raise RuntimeError("the batch carries no kv_loc_plan: an SWA layer needs a pre-translated location")
    start, stop = forward_batch.kv_loc_cols
    ids = forward_batch.kv_loc_plan.write_ids("swa")[start:stop]
    n = forward_batch.out_cache_loc.shape[0]
    if ids.shape[0] < n:  # trtllm_mha's _get_layer_cache_loc asserts no more than this
        raise RuntimeError(f"the location plan holds {ids.shape[0]} SWA ids for {n} tokens")
    return ids[:n]


def untranslated(
    forward_batch: ForwardBatch, pool: HybridSWAKVPool, metadata: BackendMetadata, layer_id: int
) -> torch.Tensor:
    """Write at the full-pool ``out_cache_loc`` as if its slots were SWA slots (the bug SGLang PR 19107 fixed)."""
    # Right only while both allocators happen to hand out the same ids; once eviction parts them the write
    # lands on another token's SWA slot, and past the SWA pool a GPU's write kernel asserts on the device.
    from .pool import in_bounds

    return in_bounds(forward_batch.out_cache_loc, pool.swa_size, f"the SWA pool ({pool.swa_size} slots)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Design:
    """One rule for where an SWA layer writes, declared as a backend declares itself: what the matrix, the
    report, the design table in docs/scenarios.md and the tests read, instead of lists of names kept beside the functions."""

    name: str
    fn: SWALocDesign
    sound: bool
    """resolves every SWA write location correctly: expected to match the reference in every clean run; a
    known-wrong design (False) is expected to fail somewhere, and what it gives is each scenario's to say"""
    rule: str
    """the rule in one line (the design table in docs/scenarios.md)"""
    reference: str
    """the real change it stands for, e.g. ``SGLang PR 24138 as merged``"""
    needs_plan: bool = False
    """reads the iteration's ``KVLocPlan``: a batch without one is an error, never a silent fallback"""
    opt_in: bool = False
    """run only by the scenarios that list it (a plain bug), not by one that lists no designs"""
    memoizes_reads: bool = False
    """the pool's read-path translations (a backend's SWA page table) go through the same memo as the writes
    (``HybridSWAKVPool.memoize_reads``), as in SGLang PR 25824's pool"""


DESIGN_RECORDS: tuple[Design, ...] = (
    Design(name="translate", fn=translate, sound=True,
           rule="translate out_cache_loc through the pool's mapping in every layer",
           reference="SGLang PR 19107; again after PR 25824"),
    Design(name="stale_state", fn=stale_state, sound=False,
           rule="read the pool's swa_loc attribute, whatever batch last set it",
           reference="SGLang PR 24138, first draft (rejected in review)"),
    Design(name="forward_batch", fn=forward_batch, sound=True,
           rule="the batch's precomputed out_cache_loc_swa, translating only without it (the reference)",
           reference="SGLang PR 24138 as merged"),
    Design(name="memoized", fn=memoized, sound=True, memoizes_reads=True,
           rule="the pool caches the translation by (storage pointer, numel), read path too, invalidated per "
                "forward, per metadata init and by the allocator",
           reference="SGLang PR 25824"),
    Design(name="metadata", fn=metadata, sound=True,
           rule="the backend's per-forward copy; graphs refill a persistent buffer, padded tail zeroed",
           reference="SGLang PR 27617"),
    Design(name="plan", fn=plan, sound=True, needs_plan=True,
           rule="this forward's columns of the iteration's location plan, translated once per iteration",
           reference="SGLang 0.5.23's KVLocPlan (PRs 35245, 37307, 37550, 37926)"),
    Design(name="untranslated", fn=untranslated, sound=False, opt_in=True,
           rule="write at the full-pool out_cache_loc as if its slots were SWA slots",
           reference="the bug SGLang PR 19107 fixed"),
)

DESIGN_REGISTRY: dict[str, Design] = {d.name: d for d in DESIGN_RECORDS}
"""every built-in design by name, in docs/scenarios.md's order"""

DESIGNS: dict[str, SWALocDesign] = {d.name: d.fn for d in DESIGN_RECORDS}
"""name -> function, for what only needs to call one"""

SOUND_DESIGNS: tuple[str, ...] = tuple(d.name for d in DESIGN_RECORDS if d.sound)
"""the built-in designs expected to match the reference in every clean run"""

OPT_IN_DESIGNS = frozenset(d.name for d in DESIGN_RECORDS if d.opt_in)
"""registered designs that are plain bugs, run only by the scenarios that list them"""

DEFAULT_DESIGNS: tuple[str, ...] = tuple(name for name in DESIGNS if name not in OPT_IN_DESIGNS)
"""what a scenario runs when it lists no designs: every registered rule but the opt-in bugs"""


def declared(name: str) -> Design | None:
    """The declaration of a design: a built-in one's record, or the ``Design`` a third-party function by
    ``package.module:function`` carries as its ``design`` attribute (``declare``); None when it declares
    nothing (it runs all the same, and a caller states what it expects of it). A record of the wrong type
    is a DesignImportError (``resolve_design``)."""
    if name in DESIGN_REGISTRY:
        return DESIGN_REGISTRY[name]
    record = getattr(resolve_design(name), "design", None)
    return record if isinstance(record, Design) else None


def declare(**fields: object):
    """Decorator for a third-party design: ``@declare(sound=True, rule=..., reference=...)`` attaches its
    ``Design`` record (named by its import path) to the function, which stays a plain design."""
    def wrap(fn: SWALocDesign) -> SWALocDesign:
        name = f"{fn.__module__}:{fn.__name__}"
        fn.design = Design(name=name, fn=fn, **fields)  # type: ignore[attr-defined, arg-type]
        return fn
    return wrap


class DesignImportError(ImportError):
    """A design named by import path that cannot be imported or is not a function: one line naming the
    design and the file where it failed."""


def resolve_design(name: str) -> SWALocDesign:
    """A registered design by name, or a third-party one by ``package.module:function``."""
    if name in DESIGNS:
        return DESIGNS[name]
    if ":" not in name:
        raise KeyError(
            f"unknown design {name!r}; known: {', '.join(DESIGNS)}, or an import path 'package.module:function'"
        )
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a module that exits or raises at import is the design's fault
        raise DesignImportError(f"design {name!r} cannot be imported: {type(exc).__name__}: "
                                f"{_one_line(exc)}{_where(exc)}") from None
    fn = getattr(module, attr, None)
    where = getattr(module, "__file__", None) or module_name
    if fn is None:
        raise DesignImportError(f"design {name!r}: {where} defines no {attr!r}")
    if not callable(fn):
        raise DesignImportError(f"design {name!r} is not callable: {attr} in {where} is {type(fn).__name__}")
    if (problem := record_problem(name, getattr(fn, "design", None))) is not None:
        raise DesignImportError(problem)
    return fn


_FIELD_TYPES = {"name": (str, "a str"), "sound": (bool, "a bool"), "rule": (str, "a str"),
                "reference": (str, "a str"), "needs_plan": (bool, "a bool"), "opt_in": (bool, "a bool"),
                "memoizes_reads": (bool, "a bool")}


def record_problem(name: str, record: object) -> str | None:
    """Why a third-party design's ``design`` attribute is not a well-typed ``Design`` record (``declare``),
    in one line naming the design and the field; None when it is one, or when there is none."""
    if record is None:
        return None
    if not isinstance(record, Design):
        return str(expected("design", f"{name}.design", "a Design record (serving.designs.declare)", record))
    for field in dataclasses.fields(Design):
        value = getattr(record, field.name)
        if field.name == "fn":
            if not callable(value):
                return str(expected("design", f"{name}.design.fn", "the design function", value))
        elif not isinstance(value, _FIELD_TYPES[field.name][0]):
            return str(expected("design", f"{name}.design.{field.name}", _FIELD_TYPES[field.name][1], value))
    return None


def _one_line(exc: BaseException) -> str:
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def _where(exc: BaseException) -> str:
    """`` (at FILE, line N)`` where the import failed, and the design's own file when that is another."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" (at {exc.filename}, line {exc.lineno})"
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith("<") and f.filename != __file__ and "importlib" not in f.filename]
    if not frames:
        return ""
    last, first = frames[-1], frames[0]
    at = f" (at {last.filename}, line {last.lineno}"
    return at + (f", imported from {first.filename}, line {first.lineno})" if first is not last else ")")

"""The competing rules for where a sliding-window layer writes its K/V (docs/design.md section 3).

A design is a function ``(forward_batch, pool, metadata, layer_id) -> swa write locations`` (the
``SWALocDesign`` protocol of ``batch.py``). The backend calls it from ``_get_layer_cache_loc`` for SWA
layers only; full layers always write at ``out_cache_loc``.
``metadata`` is the backend's per-forward metadata; its ``out_cache_loc_swa`` is filled by the backend
once per forward (the ``metadata`` design reads it).

A third-party design is a function with the same signature named by import path,
``package.module:function``; no harness file needs editing.
"""

from __future__ import annotations

import importlib
import traceback
from typing import TYPE_CHECKING

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
    """The pool caches the translation by (data_ptr, numel), invalidated once per forward (PR 25824)."""
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


DESIGNS: dict[str, SWALocDesign] = {
    "translate": translate,
    "stale_state": stale_state,
    "forward_batch": forward_batch,
    "memoized": memoized,
    "metadata": metadata,
    "plan": plan,
    "untranslated": untranslated,
}

OPT_IN_DESIGNS = frozenset({"untranslated"})
"""registered designs that are plain bugs, run only by the scenarios that list them"""

DEFAULT_DESIGNS: tuple[str, ...] = tuple(name for name in DESIGNS if name not in OPT_IN_DESIGNS)
"""what a scenario runs when it lists no designs: every registered rule but the opt-in bugs"""


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
    return fn


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

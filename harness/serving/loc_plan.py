"""The location plan: one scheduler iteration's write locations per sub-pool, shared by every forward of it.

SGLang 0.5.23 resolves SWA write locations this way (``kv_loc_plan.py``, ``kv_index_translator.py``; PRs
35245, 37307, 37550, 37926): the scheduler's translator owns one plan per iteration; the plan translates each
sub-pool's ids once, at the first ask, keyed by the sub-pool (not by a tensor's address), and every forward of
the iteration (each draft step, the target) reads its own columns of it. Backends slice it into their
metadata, and graph runners copy it into a static buffer outside the graph, padded lanes at the sink (slot 0).

    iteration's full ids   [ d0 r0 | d0 r1 | d1 r0 | d1 r1 ]     (draft steps d, requests r; step-major)
    plan.write_ids("swa")  [ s     | s     | s     | s     ]     translated once
    draft step 1's columns                 ^^^^^^^^^^^^^^^        kv_loc_cols = (2, 4)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

SUB_POOLS = ("full", "swa")


class KVLocPlan:
    """Write ids of one iteration, per sub-pool, translated at most once."""

    def __init__(self, *, iteration: int, full_ids: torch.Tensor,
                 translate: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 given: dict[str, torch.Tensor] | None = None) -> None:
        self.iteration = iteration
        self._translate = translate
        self._ids: dict[str, torch.Tensor] = {"full": full_ids, **(given or {})}

    @classmethod
    def over_static(cls, *, full_ids: torch.Tensor, swa_ids: torch.Tensor) -> KVLocPlan:
        """A graph runner's plan over its static buffers, refilled before every replay."""
        return cls(iteration=-1, full_ids=full_ids, given={"swa": swa_ids})

    def write_ids(self, sub_pool: str) -> torch.Tensor:
        """Every id of the iteration in ``sub_pool`` ("full" or "swa"), in forward order."""
        if sub_pool not in self._ids:
            if sub_pool not in SUB_POOLS or self._translate is None:
                raise KeyError(f"the plan has no ids for sub-pool {sub_pool!r}")
            self._ids[sub_pool] = self._translate(self._ids["full"])
        return self._ids[sub_pool]


class KVIndexTranslator:
    """Owns the iteration's plan, as the scheduler's translator does: a new plan every iteration.

    ``reuse_stale_plan`` re-creates the staleness class of the plan's memo: the previous iteration's
    translated ids served again for the same sub-pool, a longer tensor sliced silently to this batch.
    """

    def __init__(self, translate: Callable[[torch.Tensor], torch.Tensor], *, reuse_stale_plan: bool = False) -> None:
        self._translate = translate
        self._reuse = reuse_stale_plan
        self._last: KVLocPlan | None = None

    def own_plan(self, iteration: int, full_ids: torch.Tensor) -> KVLocPlan:
        plan = KVLocPlan(iteration=iteration, full_ids=full_ids, translate=self._translate)
        if self._reuse and self._last is not None and "swa" in self._last._ids:
            plan._ids["swa"] = self._last._ids["swa"]
        self._last = plan
        return plan

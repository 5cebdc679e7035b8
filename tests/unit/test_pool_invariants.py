"""Pool invariants are checked after every step of every run; a broken one is a verdict of its own kind
that names the invariant, the pool, the slot and the step."""

from __future__ import annotations

import torch

from harness.check.run.drive import execute
from harness.check.matrix.verdict import judge
from harness.runspec import Outcome, RunSpec
from harness.serving import registry
from harness.serving.invariants import pool_violations
from harness.serving.kv_groups import hybrid_swa_groups
from harness.serving.miniature import MiniatureStack
from harness.serving.model import model_spec
from harness.serving.pool import PoolSpec
from harness.serving.timeline import LiveToken, RequestSpec, TimelineSpec


def _violations(live, *, free_full, free_swa, page_size):
    """The invariants over SGLang's two groups (``full``, then ``swa``) of 64 slots each. These cases name a few
    slots only and leave the rest neither free nor owned, so ``leaked`` is left out here
    (``test_target_verify.py`` tests it)."""
    groups = hybrid_swa_groups(layer_is_swa=(True, False), layer_windows=(4, None), full_size=64, swa_size=64,
                               page_size=page_size, kv_dtype="float32", num_kv_heads=1, head_dim=1)
    return [v for v in pool_violations(live, groups=groups, free={"full": free_full, "swa": free_swa})
            if v.invariant != "leaked"]


def _live(rid, pos, full, swa, in_window=True):
    return LiveToken(rid=rid, pos=pos, slots=(full, swa), in_window=in_window)


def test_sound_accounting_breaks_no_invariant():
    live = [_live("a", 0, 1, 0, in_window=False), _live("a", 1, 2, 3), _live("b", 0, 3, 1)]
    assert _violations(live, free_full={4, 5}, free_swa={2, 4}, page_size=1) == []


def test_each_invariant_names_what_broke():
    live = [_live("a", 0, 1, 2), _live("b", 0, 1, 2), _live("c", 0, 5, 0), _live("d", 0, 0, 3)]
    found = {(v.invariant, v.pool, v.slot) for v in _violations(live, free_full={0, 7}, free_swa={3},
                                                                       page_size=1)}
    assert found == {
        ("dummy", "full", 0),            # the dummy slot on the free list ...
        ("dummy", "full", 0),            # ... and owned by d@0
        ("owned_twice", "full", 1), ("owned_twice", "swa", 2),
        ("window", "full", 5),           # c@0 is in its window without an SWA slot
        ("free_but_owned", "swa", 3),    # d@0's SWA slot is free
    }
    owned_twice = next(v for v in _violations(live, free_full=(), free_swa=(), page_size=1)
                       if v.invariant == "owned_twice")
    assert "a@0 and b@0" in owned_twice.detail


def test_the_dummy_page_is_every_slot_of_page_zero():
    found = _violations([_live("a", 0, 3, 5)], free_full={2}, free_swa=(), page_size=4)
    assert {(v.invariant, v.slot) for v in found} == {("dummy", 2), ("dummy", 3)}


class KeepsMappingOnEvictStack(MiniatureStack):
    """Frees evicted SWA slots but leaves the mapping pointing at them: the evicted token still 'holds' a
    slot the free list hands out again."""

    name = "keeps_mapping"

    def free_swa(self, full_slots: torch.Tensor) -> None:
        mapping = self.pool.full_to_swa_index_mapping
        kept = mapping[full_slots.long()].clone()
        super().free_swa(full_slots)
        mapping[full_slots.long()] = kept


def _spec(**kw) -> RunSpec:
    ms = model_spec("gpt-oss-mini")
    return RunSpec(model=ms, pool=PoolSpec(full_size=64, swa_size=32),
                   timeline=TimelineSpec(requests=(RequestSpec(rid="a", prompt_len=ms.window + 2, output_len=3),),
                                         seed=1), **kw)


def test_a_stack_that_breaks_the_accounting_gets_the_invariant_verdict(monkeypatch):
    monkeypatch.setitem(registry.STACKS, "keeps_mapping", f"{__name__}:KeepsMappingOnEvictStack")
    reference = execute(_spec())
    result = execute(_spec(serving="keeps_mapping"))
    assert result.breach is not None and result.breach.step == 0  # the prompt's first tokens leave the window
    verdict = judge(result, reference)
    assert verdict.outcome is Outcome.INVARIANT
    assert verdict.error.type == "InvariantViolation" and verdict.error.step == 0
    assert "free_but_owned: swa slot 1: a@0 owns it" in verdict.error.message


def test_a_sound_run_checks_every_step_and_finishes():
    result = execute(_spec())
    assert result.breach is None and result.error is None
    assert len(result.steps) == 4


def test_a_token_behind_its_frontier_that_still_holds_an_swa_slot_is_retained():
    live = [LiveToken(rid="a", pos=0, slots=(1, 4), in_window=False, past_frontier=True),
            LiveToken(rid="a", pos=1, slots=(2, 0), in_window=False, past_frontier=True)]
    found = _violations(live, free_full=(), free_swa=(), page_size=1)
    assert [(v.invariant, v.pool, v.slot) for v in found] == [("retained", "swa", 4)]
    assert "a@0 is below what its request may retain" in found[0].detail

"""Two eviction-family faults of the scheduler, each acting where its real bug lived and nowhere when off:
the frontier counted in tokens where EAGLE's bigram key is a token shorter (SGLang PRs 34823/34870), and a
request released while its last decode batch is still to run (SGLang PR 18803)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.scenario import ScenarioError, load_scenario
from harness.serving.eviction import EvictionSpec, RequestWindow, SGLangEviction, TightEviction
from harness.serving.miniature import MiniatureStack
from harness.serving.pool import PoolSpec
from harness.serving.scheduler import Scheduler, StepEnd
from harness.serving.stack import StackSpec
from harness.serving.timeline import RequestSpec, TimelineSpec

W = 8  # a query reads 8 keys: a cached branch must end in 7 live SWA tokens


def _scheduler(timeline: TimelineSpec, *, page_size: int = 1, prefix_cache: bool = False,
               faults=()) -> tuple[Scheduler, MiniatureStack]:
    stack = MiniatureStack.build(StackSpec(pool=PoolSpec(full_size=128, swa_size=64, page_size=page_size),
                                           layer_is_swa=(), num_kv_heads=1, head_dim=1, poison_freed=False))
    policy = TightEviction(EvictionSpec(prefix_cache=prefix_cache), window=W, page_size=page_size)
    return Scheduler(timeline, stack=stack, eviction=policy, vocab_size=256, faults=faults), stack


def _ends(sched: Scheduler) -> list[StepEnd]:
    out = []
    while sched.next_step() is not None:
        out.append(sched.finish_step())
    return out


# ---- the frontier counted in tokens, not key entries ----------------------------------------------------------
CHUNKED = TimelineSpec(requests=(RequestSpec(rid="r", prompt_len=20, output_len=4),), seed=3, chunk_size=8,
                       draft_steps=2)


def test_with_prefix_sharing_the_frontier_keeps_the_window_below_where_the_key_ends():
    window = RequestWindow(seq_len=16, swa_evicted=0, prefilling=True, decoded=0)
    bigram = dataclasses.replace(window, key_len=15)  # a bigram key over 16 tokens has 15 entries: it ends at 12
    tight = TightEviction(EvictionSpec(prefix_cache=True), window=W, page_size=4)
    assert tight.frontier(window) == 8 and tight.frontier(bigram) == 4
    sglang = SGLangEviction(EvictionSpec(policy="sglang", interval=1, prefix_cache=True), window=W, page_size=4)
    assert sglang.frontier(dataclasses.replace(window, prefilling=False, decoded=2)) == 8
    assert sglang.frontier(dataclasses.replace(bigram, prefilling=False, decoded=2)) == 4
    # without prefix sharing nothing is inserted: the key's length does not matter
    plain = TightEviction(window=W, page_size=4)
    assert plain.frontier(bigram) == plain.frontier(window)


def test_counting_the_frontier_in_tokens_leaves_the_leaf_inserted_between_chunks_unmatchable():
    sched, stack = _scheduler(CHUNKED, page_size=4, prefix_cache=True, faults={"evict_by_token_count"})
    for _ in range(2):  # two chunks of 8: 16 tokens, a bigram key of 15 entries, inserted up to 12
        sched.next_step()
        end = sched.finish_step()
    assert [k.pos for k in end.evicted] == [4, 5, 6, 7]  # counted back from 16, not 15
    r = sched._running[0]
    found = [(v.invariant, v.slot) for v in stack.invariant_violations(sched.live_tokens())]
    assert found == [("unmatchable", r.slots[5])]  # r@5 is the first of the leaf's trailing 7 entries


def test_counted_from_the_key_every_step_keeps_a_matchable_cache():
    sched, stack = _scheduler(CHUNKED, page_size=4, prefix_cache=True)
    while sched.next_step() is not None:
        sched.finish_step()
        assert stack.invariant_violations(sched.live_tokens()) == []
    assert [t.pos for t in sched.cache.cached_tokens()] == list(range(20))  # a bigram key of 24 tokens: 23 -> 20


def test_the_token_count_fault_changes_nothing_without_bigram_keys():
    plain = dataclasses.replace(CHUNKED, draft_steps=0)
    with_fault = _ends(_scheduler(plain, page_size=4, prefix_cache=True, faults={"evict_by_token_count"})[0])
    assert with_fault == _ends(_scheduler(plain, page_size=4, prefix_cache=True)[0])


def test_the_token_count_fault_in_a_run_that_does_not_speculate_is_a_load_error(tmp_path: Path):
    path = tmp_path / "s.toml"
    path.write_text(
        'description = "d"\n[model]\npreset = "gpt-oss-mini"\n[pool]\nfull_size = 64\nswa_size = 32\n'
        '[eviction]\nprefix_cache = true\n[graphs]\nmodes = ["eager"]\n[timeline]\n[[timeline.requests]]\n'
        'prompt_len = 4\n[run]\ndesigns = ["translate"]\nfaults = ["evict_by_token_count"]\n'
        '[expect.translate]\nverdict = "match"\nwhy = "w"\n'
    )
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert err.value.problems == (
        f"{path}: run.faults[0]: evict_by_token_count acts only in a run that speculates; timeline.draft_steps is 0",
    )


# ---- a release before the last decode batch --------------------------------------------------------------------
DECODE = TimelineSpec(requests=(RequestSpec(rid="a", prompt_len=6, output_len=4),
                                RequestSpec(rid="b", prompt_len=3, output_len=8)), seed=4)


def test_a_request_released_before_its_last_batch_is_still_batched_on_slots_handed_to_another():
    sched, stack = _scheduler(DECODE, faults={"release_before_last_batch"})
    for _ in range(4):  # the prefill and three decode batches: a has one token left
        sched.next_step()
        end = sched.finish_step()
    a = next(r for r in sched._running if r.spec.rid == "a")
    assert end.finished == () and a.seq_len == a.total_len - 1
    free_full = stack.free_slots()["full"]
    assert set(a.slots) <= free_full  # released while it still runs
    assert [(v.invariant, v.slot) for v in stack.invariant_violations(sched.live_tokens())][0] == \
        ("free_but_owned", a.slots[0])
    held = list(a.slots)
    step = sched.next_step()  # the batch that carries a's last token still holds a ...
    assert [owner.rid for owner in step.forwards[0]] == ["a", "b"]
    row = int(step.batch.req_pool_indices[0])
    assert stack.req_to_token_pool.req_to_token[row, : len(held)].tolist() == held
    assert set(step.batch.out_cache_loc.tolist()) <= set(held)  # ... and both new tokens land on a's freed slots
    assert sched.finish_step().finished == ("a",)  # and its finish frees nothing twice


def test_without_the_fault_a_request_is_freed_only_once_its_last_token_is_written():
    sched, stack = _scheduler(DECODE)
    ends = []
    while sched.next_step() is not None:
        ends.append(sched.finish_step())
        assert stack.invariant_violations(sched.live_tokens()) == []
    assert [i for i, e in enumerate(ends) if e.finished == ("a",)] == [4]

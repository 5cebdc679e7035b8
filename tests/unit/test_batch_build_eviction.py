"""Under SGLang's policy the miniature frees out-of-window SWA slots when a batch is built, for the requests in
that batch only (``ScheduleBatch.maybe_evict_swa``); the harness's tight policy frees every running request
after every step."""

from __future__ import annotations

import pytest

from harness.serving.eviction import EvictionSpec
from harness.serving.miniature import MiniatureStack
from harness.serving.pool import PoolSpec
from harness.serving.registry import eviction_policy
from harness.serving.scheduler import Scheduler
from harness.serving.stack import StackSpec
from harness.serving.timeline import RequestSpec, TimelineSpec

# a decodes from step 1; b arrives at step 3 and prefills alone while a sits out
TIMELINE = TimelineSpec(requests=(RequestSpec(rid="a", prompt_len=8, output_len=6),
                                  RequestSpec(rid="b", arrive=3, prompt_len=4, output_len=2)))


def _run(policy: str):
    """Per step: its kind, the requests it freed slots of, and how many of a's positions hold no SWA slot while
    the step runs."""
    stack = MiniatureStack.build(StackSpec(pool=PoolSpec(full_size=33, swa_size=17, free_order="fifo"),
                                           layer_is_swa=(False, True), num_kv_heads=1, head_dim=1))
    sched = Scheduler(TIMELINE, stack=stack, vocab_size=64,
                      eviction=eviction_policy(EvictionSpec(policy=policy, interval=1), window=4))
    out = {}
    while (step := sched.next_step()) is not None:
        a_freed = sum(1 for t in sched.live_tokens() if t.rid == "a" and t.slots[1] == 0)
        end = sched.finish_step()
        out[step.index] = (step.kind, sorted({k.rid for k in end.evicted}), a_freed)
    return out


def test_under_sglangs_policy_a_request_that_sits_out_an_extend_batch_keeps_its_slots():
    steps = _run("sglang")
    # a's decode at step 2 freed below (9 - 3) = 6; b's extend batch at step 3 frees nothing of a
    assert steps[2] == ("decode", ["a"], 6)
    assert steps[3] == ("extend", [], 6)
    assert steps[4] == ("decode", ["a"], 7)  # a is batched again: its out-of-window slot goes


def test_under_the_tight_policy_every_running_request_frees_after_every_step():
    steps = _run("tight")
    # after step 2 a's window starts at 10 - 3 = 7, freed before b's batch, which a sits out
    assert steps[3] == ("extend", ["b"], 7)

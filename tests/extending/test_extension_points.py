"""Each extension point takes a new implementation as one module plus one registry line (or an import path):
a serving stack, an eviction policy, a backend and a runner, each small, registered here and run end to
end. The checks show the new piece was really used, and that a sound design still matches under it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.check.run.drive import execute
from harness.check.matrix.verdict import judge
from harness.backends.registry import BACKENDS, backend_class
from harness.runners.eager import EagerRunner
from harness.runners.registry import RUNNERS
from harness.runspec import GraphSpec, RunSpec
from harness.serving import registry
from harness.serving.allocator import SWATokenToKVPoolAllocator
from harness.serving.designs import SOUND_DESIGNS
from harness.serving.eviction import EvictionPolicy, EvictionSpec, RequestWindow
from harness.serving.miniature import MiniatureStack
from harness.serving.model import model_spec
from harness.serving.pool import FreeList, PoolSpec
from harness.serving.stack import StackSpec
from harness.serving.timeline import RequestSpec, TimelineSpec

SOUND = SOUND_DESIGNS  # every design declared sound


class _HighestFirst(FreeList):
    def take(self, n: int) -> list[int]:
        taken = super().take(len(self))  # everything, lowest first ...
        keep, out = taken[: len(taken) - n], taken[len(taken) - n :][::-1]
        self.give_back(keep)  # ... and the n highest handed out
        return out


class HighestFirstStack(MiniatureStack):
    """The miniature with SWA slots handed out highest first: another slot sequence for the same timeline."""

    name = "highest_first"

    @classmethod
    def build(cls, spec: StackSpec) -> HighestFirstStack:
        stack = super().build(spec)
        allocator: SWATokenToKVPoolAllocator = stack.allocator
        free = _HighestFirst(stack.pool.swa_size, "SWA KV pool", "swa_size")
        allocator._swa = free
        return stack


class EveryOtherStep(EvictionPolicy):
    """Frees what left the window only when the request's length is even: eviction that lags a step."""

    name = "every_other_step"

    def frontier(self, req: RequestWindow) -> int:
        return max(req.swa_evicted, self.window_start(req.seq_len)) if req.seq_len % 2 == 0 else req.swa_evicted


class LoggingEagerRunner(EagerRunner):
    """The eager runner, counting its forwards: a third-party runner keeps the same contract."""

    forwards_run = 0

    def forward(self, batch):
        type(self).forwards_run += 1
        return super().forward(batch)


class CountingAttnBackend(backend_class("torch_native")):
    """The torch-native backend counting its eager metadata builds: a new backend is a declaration over a
    builder and an implementation, and here it changes nothing the verdict sees."""

    name = "counting"
    builds = 0

    def init_forward_metadata(self, forward_batch):
        type(self).builds += 1
        super().init_forward_metadata(forward_batch)


def _spec(**kw) -> RunSpec:
    ms = model_spec("gpt-oss-mini")
    w = ms.window
    timeline = TimelineSpec(requests=(RequestSpec(rid="a", prompt_len=w + 3, output_len=w + 2),
                                      RequestSpec(rid="b", arrive=2, prompt_len=w - 1, output_len=w + 4)), seed=3)
    return RunSpec(model=ms, pool=PoolSpec(full_size=96, swa_size=40), timeline=timeline,
                   graphs=GraphSpec(decode_buckets=(1, 2, 4), prefill_buckets=(8, 16, 32)), **kw)


def _swa_slots(result) -> list[tuple[str, int, int]]:
    swa = 1  # the miniature's groups: full, then swa
    return [(t.rid, t.pos, t.slots[swa]) for snap in result.snapshots for t in snap.live]


def _evictions(result) -> list[tuple[int, tuple]]:
    return [(s.index, s.evicted) for s in result.steps]


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(registry.STACKS, "highest_first", f"{__name__}:HighestFirstStack")
    monkeypatch.setitem(registry.EVICTION_POLICIES, "every_other_step", f"{__name__}:EveryOtherStep")
    monkeypatch.setitem(RUNNERS, "logging_eager", f"{__name__}:LoggingEagerRunner")
    monkeypatch.setitem(BACKENDS, "counting", f"{__name__}:CountingAttnBackend")


# full mode costs over two seconds on one core (tests/README.md): the full suite runs it
@pytest.mark.parametrize("mode", ["eager", pytest.param("full", marks=pytest.mark.slow), "piecewise"])
def test_a_registered_serving_stack_runs_and_sound_designs_match_under_it(registered, mode):
    miniature = execute(_spec())
    reference = execute(_spec(serving="highest_first").reference())
    assert reference.error is None, reference.error
    assert _swa_slots(reference) != _swa_slots(miniature), "the registered stack was not used"
    assert max(s for _, _, s in _swa_slots(reference)) == 39, "SWA slots are not handed out highest first"
    for design in SOUND:
        verdict = judge(execute(_spec(serving="highest_first", design=design, mode=mode)), reference)
        assert verdict.outcome == "match", f"{design}/{mode}: {verdict.summary()}"


def test_a_serving_stack_named_by_import_path_needs_no_registry_line():
    result = execute(_spec(serving=f"{__name__}:HighestFirstStack"))
    assert result.error is None, result.error
    assert max(s for _, _, s in _swa_slots(result)) == 39


def test_a_registered_eviction_policy_decides_when_slots_are_freed(registered):
    tight = execute(_spec())
    lagging = execute(_spec(eviction=EvictionSpec(policy="every_other_step")))
    assert lagging.error is None, lagging.error
    assert _evictions(lagging) != _evictions(tight)
    # no token is evicted that the tight policy keeps: lagging frees the same tokens later, or at finish
    assert {k for _, ev in _evictions(lagging) for k in ev} <= {k for _, ev in _evictions(tight) for k in ev}
    for design in SOUND:
        verdict = judge(execute(_spec(eviction=EvictionSpec(policy="every_other_step"), design=design, mode="full")), lagging)
        assert verdict.outcome == "match", f"{design}: {verdict.summary()}"


def test_a_registered_runner_is_the_one_a_run_uses(registered):
    LoggingEagerRunner.forwards_run = 0
    result = execute(_spec(runner="logging_eager"))
    assert result.error is None, result.error
    assert LoggingEagerRunner.forwards_run == sum(len(s.forwards) for s in result.steps) > 0
    assert judge(result, execute(_spec())).outcome == "match"


@pytest.mark.parametrize("mode", ["eager", "full", "piecewise"])
def test_a_registered_backend_runs_every_mode_and_matches_the_one_it_extends(registered, mode):
    CountingAttnBackend.builds = 0
    result = execute(_spec(backend="counting", mode=mode, design="metadata"))
    assert result.error is None, result.error
    assert CountingAttnBackend.builds > 0, "the registered backend was not used"
    assert judge(result, execute(_spec())).outcome == "match"


@pytest.mark.parametrize("name, kind, error", [("nope", "serving stack", "KeyError"),
                                               ("harness.serving.pool:PoolSpec", "serving stack", "DeclarationError")])
def test_a_bad_serving_stack_name_says_what_was_expected(name, kind, error):
    # an unknown short name is a KeyError; an import path naming the wrong thing is a plug-in's declaration
    result = execute(_spec(serving=name))
    assert result.error is not None and result.error.type == error
    assert kind in result.error.message and name in result.error.message


def test_stack_operations_keep_the_mapping_and_free_lists_consistent():
    stack = MiniatureStack.build(StackSpec(pool=PoolSpec(full_size=16, swa_size=8), layer_is_swa=(True, False),
                                           num_kv_heads=1, head_dim=2))
    a = stack.alloc_extend(prefix_lens=[0], extend_lens=[5], last_locs=[0])
    assert a.tolist() == [1, 2, 3, 4, 5] and stack.translate(a).tolist() == [1, 2, 3, 4, 5]
    stack.free_swa(a[:2])
    assert stack.translate(a).tolist() == [0, 0, 3, 4, 5]
    b = stack.alloc_extend(prefix_lens=[5], extend_lens=[2], last_locs=[5])
    assert b.tolist() == [6, 7] and stack.translate(b).tolist() == [1, 2]  # freed SWA slots reused lowest first
    stack.free(b)
    with pytest.raises(ValueError, match="double free"):
        stack.free(b)
    assert stack.translate(torch.tensor([-1, 0])).tolist() == [-1, 0]

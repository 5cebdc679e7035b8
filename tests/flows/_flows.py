"""Shared builders for runner flow tests."""

from __future__ import annotations

import dataclasses

import torch

from harness.check.run.assemble import assemble
from harness.runspec import GraphSpec, RunSpec
from harness.serving.model import model_spec
from harness.serving.pool import PoolSpec
from workloads import heterogeneous_decode, heterogeneous_prefill  # noqa: F401  (the flows import them from here)


def spec_for(preset: str, timeline_fn, mode: str, design: str = "forward_batch", **kw) -> RunSpec:
    ms = model_spec(preset)
    return RunSpec(
        model=ms, pool=PoolSpec(full_size=128, swa_size=64), timeline=timeline_fn(ms.window), mode=mode,
        design=design, graphs=GraphSpec(decode_buckets=(1, 2, 4), prefill_buckets=(8, 16, 24, 32, 48)), **kw,
    )


def nan_before_replay(runner) -> None:
    """Fill every captured output with NaN right before its graph replays, so replay must write all of it."""
    for bucket, graph in runner.graphs.items():
        out, replay = runner.outputs[bucket], graph.replay

        def poisoned_replay(out=out, replay=replay):
            out.fill_(float("nan"))
            return replay()

        graph.replay = poisoned_replay


def graph_runner(session):
    """The run's own graph runner (the first its dispatcher holds in a full or piecewise run: the decode or the
    piecewise one, before the draft graph runner of a run that speculates); None in an eager run."""
    runners = session.runner.runners
    return runners[0] if runners else None


def drive(spec: RunSpec, *, poison_outputs: bool = False):
    """Run a spec step by step; returns (hidden states per step, pool snapshots per step, the graph runner, or
    the dispatcher of an eager run)."""
    session = assemble(spec)
    if poison_outputs:
        for runner in session.runner.runners:
            # a runner of several graph sets (the draft-extend's, one per length) poisons each set's outputs
            for part in getattr(runner, "by_length", {}).values() or (runner,):
                nan_before_replay(part)
    hidden, pools = [], []
    while (step := session.scheduler.next_step()) is not None:
        hidden.append(torch.cat(session.run_batch(step.batch)))
        pools.append([b.clone() for b in session.pool.buffers()])
        session.scheduler.finish_step()
    return hidden, pools, graph_runner(session) or session.runner


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def graph_equals_eager_bitwise(spec: RunSpec) -> None:
    """``spec`` in full mode leaves the hidden states and the target's KV as its eager twin does, bit for bit, at
    every step. The draft model's pool (last in ``pool.buffers()``) is left out: a draft stepped on the decode
    graphs, which are the target's, does not write it (docs/speculative.md, "Not yet"), while an eager one does."""
    graph_hidden, graph_pools, _ = drive(spec, poison_outputs=True)
    eager_hidden, eager_pools, _ = drive(replace(spec, mode="eager"))
    assert len(graph_hidden) == len(eager_hidden)
    for step, (g, e) in enumerate(zip(graph_hidden, eager_hidden)):
        assert bitwise_equal(g, e), f"hidden states differ at step {step}"
    draft = assemble(spec).pool.draft  # None in a run that does not speculate
    target = len(graph_pools[0]) - (len(draft.buffers()) if draft is not None else 0)
    for step, (gp, ep) in enumerate(zip(graph_pools, eager_pools)):
        for i, (gb, eb) in enumerate(zip(gp[:target], ep[:target])):
            assert bitwise_equal(gb[1:], eb[1:]), f"pool buffer {i} differs at step {step}"


def replace(spec: RunSpec, **kw) -> RunSpec:
    return dataclasses.replace(spec, **kw)

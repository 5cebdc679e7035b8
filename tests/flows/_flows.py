"""Shared builders for runner flow tests."""

from __future__ import annotations

import dataclasses

import torch

from harness.model import model_spec
from harness.pool import PoolSpec
from harness.run import GraphSpec, RunSpec, build_session
from harness.runners import run_batch
from harness.scheduler import RequestSpec, TimelineSpec


def heterogeneous_decode(window: int) -> TimelineSpec:
    """Decode batches of 4, 3, 2 and 1 requests of different lengths: padded buckets, at least 3 replays."""
    return TimelineSpec(
        requests=(
            RequestSpec(rid="a", prompt_len=window + 3, output_len=12),
            RequestSpec(rid="b", prompt_len=2, output_len=3),
            RequestSpec(rid="c", prompt_len=window - 1, output_len=6),
            RequestSpec(rid="d", prompt_len=2 * window + 1, output_len=9),
            RequestSpec(rid="e", arrive=8, prompt_len=3, output_len=4),
        ),
        seed=21,
    )


def heterogeneous_prefill(window: int) -> TimelineSpec:
    """Several extend batches of different token counts and request mixes, chunked across the window."""
    return TimelineSpec(
        requests=(
            RequestSpec(rid="a", prompt_len=2 * window + 5, output_len=2),
            RequestSpec(rid="b", arrive=1, prompt_len=window - 1, output_len=2),
            RequestSpec(rid="c", arrive=1, prompt_len=3, output_len=1),
            RequestSpec(rid="d", arrive=4, prompt_len=window + 1, output_len=2),
        ),
        chunk_size=window + 2,
        seed=22,
    )


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


def drive(spec: RunSpec, *, poison_outputs: bool = False):
    """Run a spec step by step; returns (hidden states per step, pool snapshots per step, runner)."""
    session = build_session(spec)
    if poison_outputs and hasattr(session.runner, "graphs"):
        nan_before_replay(session.runner)
    hidden, pools = [], []
    while (step := session.scheduler.next_step()) is not None:
        hidden.append(torch.cat(run_batch(session.runner, step.batch)))
        pools.append([b.clone() for b in session.pool.buffers()])
        session.scheduler.finish_step()
    return hidden, pools, session.runner


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def replace(spec: RunSpec, **kw) -> RunSpec:
    return dataclasses.replace(spec, **kw)

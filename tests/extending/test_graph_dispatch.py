"""The graph dispatcher picks a runner per forward by (forward mode, tokens per request, bucket): a runner
registered for another batch shape (two tokens per request, a verify step's) takes exactly those batches,
and the built-in decode and piecewise graphs take theirs as before."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.backends.base import GraphSupport
from harness.backends.registry import BACKENDS, backend_class
from harness.check.run.assemble import assemble
from harness.check.run.drive import execute
from harness.runners.decode_graph import DecodeGraphRunner
from harness.runners.dispatch import BatchDescriptor, GraphCover, GraphKey
from harness.runners.eager import EagerRunner
from harness.runners.observations import ForwardPath, ForwardRecord
from harness.runners.piecewise import PiecewisePrefillRunner
from harness.runners.registry import GRAPH_RUNNERS
from harness.runspec import GraphSpec, Mode, RunSpec
from harness.serving.batch import ForwardMode, make_forward_batch
from harness.serving.model import model_spec
from harness.serving.pool import PoolSpec
from harness.serving.timeline import RequestSpec, TimelineSpec


class TwoTokenDecodeRunner:
    """Decode batches of two tokens per request, bucketed by requests like the decode graphs. It captures
    nothing: it runs each batch it takes as the extend it is, on the eager runner, and keeps their sizes."""

    captures_attention = False

    @classmethod
    def for_run(cls, ctx, spec, *, eager):
        return cls(eager, spec.graphs.decode_buckets)

    def __init__(self, eager, buckets):
        self.eager = eager
        self.covers = (GraphCover(forward_mode=ForwardMode.DECODE, tokens_per_request=2, buckets=buckets,
                                  captures_attention=self.captures_attention),)
        self.taken: list[int] = []
        self._log: list[ForwardRecord] = []

    def forward(self, batch):
        key = self.covers[0].key_for(BatchDescriptor.of(batch))
        assert key is not None, "handed a batch it does not cover"
        self.taken.append(batch.batch_size)
        hidden = self.eager.forward(dataclasses.replace(batch, forward_mode=ForwardMode.EXTEND))
        self._log.append(ForwardRecord(path=ForwardPath.EAGER, rows=batch.batch_size, bucket=key.bucket))
        return hidden

    def forward_log(self):
        return self._log

    def observations(self):
        return None


class FullTwoTokenDecodeRunner(TwoTokenDecodeRunner):
    """The same runner declaring full graphs (attention captured): only a backend whose graph support covers
    two tokens per request (``UNIFORM_BATCH``) may be handed to it."""

    captures_attention = True


class UniformBatchBackend(backend_class("torch_gather")):
    """The torch-gather backend under another name, declaring full graphs for uniform batches."""

    name = "uniform_batch"
    graph_support = GraphSupport.UNIFORM_BATCH


def _spec(mode: str, *, requests: int = 2, decode_buckets=(1, 2), prefill_buckets=(8, 16), **kw) -> RunSpec:
    timeline = TimelineSpec(requests=tuple(RequestSpec(rid=f"r{i}", prompt_len=5 + i, output_len=4)
                                           for i in range(requests)), seed=5)
    return RunSpec(model=model_spec("gpt-oss-mini"), pool=PoolSpec(full_size=96, swa_size=64), timeline=timeline,
                   mode=mode, graphs=GraphSpec(decode_buckets=decode_buckets, prefill_buckets=prefill_buckets), **kw)


def _two_token_decode(parts, seq_lens: dict[int, int]):
    """A decode batch of two new tokens per running request (rows -> lengths so far), slots from the stack."""
    rows = sorted(seq_lens)
    prefix = [seq_lens[r] for r in rows]
    locs = parts.stack.alloc_extend(prefix_lens=prefix, extend_lens=[2] * len(rows), last_locs=[0] * len(rows))
    for i, row in enumerate(rows):
        parts.stack.write_req_to_token(row, prefix[i], locs[2 * i : 2 * i + 2])
    positions = torch.tensor([p + j for p in prefix for j in (0, 1)], dtype=torch.int64)
    return make_forward_batch(
        forward_mode=ForwardMode.DECODE, input_ids=torch.ones(2 * len(rows), dtype=torch.int64), positions=positions,
        req_pool_indices=torch.tensor(rows, dtype=torch.int64), prefix_lens=prefix, extend_lens=[2] * len(rows),
        out_cache_loc=locs, req_to_token_pool=parts.stack.req_to_token_pool, pool=parts.stack.pool,
        translate=parts.stack.translate,
    )


def _through_one_decode(parts) -> dict[int, int]:
    """Run the timeline up to and including its first decode step; the running requests' rows and lengths."""
    while (step := parts.scheduler.next_step()) is not None:
        parts.run_batch(step.batch)
        parts.scheduler.finish_step()
        if step.kind == "decode":
            return {int(r): int(n) for r, n in zip(step.batch.req_pool_indices, step.batch.seq_lens)}
    raise AssertionError("the timeline has no decode step")


@pytest.fixture
def two_token_runner(monkeypatch):
    monkeypatch.setitem(GRAPH_RUNNERS, Mode.FULL, (*GRAPH_RUNNERS[Mode.FULL], f"{__name__}:TwoTokenDecodeRunner"))


def test_a_runner_registered_for_two_tokens_per_request_takes_those_batches_and_no_other(two_token_runner):
    parts = assemble(_spec("full"))
    decode, two_token = parts.runner.runners
    assert isinstance(decode, DecodeGraphRunner) and isinstance(two_token, TwoTokenDecodeRunner)
    seq_lens = _through_one_decode(parts)
    assert two_token.taken == [], "the scheduler's batches are one token per request: not the registered runner's"
    batch = _two_token_decode(parts, seq_lens)
    chosen = parts.runner.dispatch(batch)
    assert chosen.runner is two_token
    assert chosen.key == GraphKey(forward_mode=ForwardMode.DECODE, tokens_per_request=2, bucket=2)
    hidden = parts.run_batch(batch)
    assert two_token.taken == [2] and hidden[0].shape[0] == 4
    names = [f.graph for f in parts.runner.forward_log()]
    assert names == ["eager", "decode/bs2", "decode/bs2x2"]
    assert parts.runner.observations().forwards == (("eager", 1), ("decode/bs2", 1), ("decode/bs2x2", 1))


def test_without_the_registration_a_two_token_decode_runs_eagerly():
    parts = assemble(_spec("full"))
    batch = _two_token_decode(parts, _through_one_decode(parts))
    chosen = parts.runner.dispatch(batch)
    assert isinstance(chosen.runner, EagerRunner) and chosen.key is None and not chosen.fallback


@pytest.mark.parametrize("backend, taken", [("torch_gather", False), ("uniform_batch", True)])
def test_a_full_two_token_graph_is_picked_only_over_a_backend_whose_graph_support_covers_it(monkeypatch, backend,
                                                                                              taken):
    monkeypatch.setitem(GRAPH_RUNNERS, Mode.FULL,
                        (*GRAPH_RUNNERS[Mode.FULL], f"{__name__}:FullTwoTokenDecodeRunner"))
    monkeypatch.setitem(BACKENDS, "uniform_batch", f"{__name__}:UniformBatchBackend")
    if not taken:
        # a backend whose graphs take decode batches only (flashinfer's and trtllm_mha's declaration; torch_gather
        # declares uniform batches since its graph lists are per token)
        from harness.backends.base import GraphSupport
        from harness.backends.torch_gather import TorchGatherBackend

        monkeypatch.setattr(TorchGatherBackend, "graph_support", GraphSupport.DECODE_ONLY)
    parts = assemble(_spec("full", backend=backend))
    full = parts.runner.runners[1]
    batch = _two_token_decode(parts, _through_one_decode(parts))
    assert (parts.runner.dispatch(batch).runner is full) is taken
    # one token per request: the decode graphs, over either backend
    assert isinstance(parts.runner.runners[0], DecodeGraphRunner)
    assert [f.graph for f in parts.runner.forward_log()] == ["eager", "decode/bs2"]


def test_a_two_token_decode_larger_than_every_bucket_falls_back_to_eager(two_token_runner):
    parts = assemble(_spec("full", requests=3))
    batch = _two_token_decode(parts, _through_one_decode(parts))
    chosen = parts.runner.dispatch(batch)
    assert isinstance(chosen.runner, EagerRunner) and chosen.fallback and chosen.rows == 3


def _expected(mode: str, kind: str, size: int) -> str:
    """The graph a forward of ``size`` rows (decode) or tokens (extend) used before there was a dispatcher."""
    if (mode, kind) not in (("full", "decode"), ("piecewise", "extend")):
        return "eager"  # the mode's graphs are for the other kind of batch
    buckets = (1, 2) if kind == "decode" else (8, 16)
    fits = [b for b in buckets if b >= size]
    if not fits:
        return "fallback"
    return f"decode/bs{fits[0]}" if kind == "decode" else f"extend/tokens{fits[0]}"


@pytest.mark.parametrize("mode", ["eager", "full", "piecewise"])
def test_the_built_in_graph_runners_take_the_batches_they_took_before(mode):
    # decode batches of 3, 2 and 1 requests as requests finish (3 fit no decode bucket); a prefill of all
    # three (18 tokens, no prefill bucket holds it), then a late request's 5 (the 8-token graph)
    timeline = TimelineSpec(requests=(RequestSpec(rid="a", prompt_len=6, output_len=2),
                                      RequestSpec(rid="b", prompt_len=7, output_len=4),
                                      RequestSpec(rid="c", prompt_len=5, output_len=6),
                                      RequestSpec(rid="d", arrive=9, prompt_len=5, output_len=1)), seed=5)
    spec = dataclasses.replace(_spec(mode), timeline=timeline)
    parts = assemble(spec)
    if mode != "eager":
        (graphs,) = parts.runner.runners
        assert isinstance(graphs, DecodeGraphRunner if mode == "full" else PiecewisePrefillRunner)
    else:
        assert parts.runner.runners == ()
    result = execute(spec)
    assert result.error is None, result.error
    forwards = [(s, f) for s in result.steps for f in s.forwards]
    named = [("fallback" if f.path == "fallback" else f.graph) for _, f in forwards]
    expected = [_expected(mode, s.kind, s.batch_size if s.kind == "decode" else sum(n for _, n in s.tokens))
                for s, _ in forwards]
    assert named == expected
    assert set(expected) >= ({"eager"} if mode == "eager" else {"eager", "fallback"})
    if mode == "eager":
        assert result.observations is None
        return
    assert len(set(expected)) >= 3, "the timeline must reach two graphs of the mode's runner"
    assert result.observations.eager_fallbacks == named.count("fallback")
    assert sum(n for _, n in result.observations.forwards) == len(named)

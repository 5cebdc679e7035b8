"""The graph dispatcher: which registered runner's graph takes each forward, as vLLM's ``CudagraphDispatcher``
picks a captured graph per batch descriptor.

A graph runner declares the batches its graphs cover (``covers``: ``GraphCover``s, each a forward mode, the
tokens every request adds and the buckets). The dispatcher describes every forward the same way
(``BatchDescriptor``) and hands it to the first of the run's graph runners that covers it, at the smallest
bucket that holds it (``GraphKey``). A forward no graph covers runs on the eager runner: ``fallback`` when a
runner takes its kind but no bucket holds it (the graph statistics' eager fallbacks), ``eager`` when none
takes its kind. Each forward's record names the graph it used (``GraphKey.name``, ``decode/bs4``) or
``eager``, and so do the graph statistics.

Which runners a mode registers is ``registry.GRAPH_RUNNERS``; ``RunSpec.runner`` replaces them. A runner that
declares no ``covers`` takes every forward itself, as a runner did before there was a dispatcher.

A full graph (``GraphCover.captures_attention``) is picked only for shapes the backend's ``GraphSupport``
covers (``covers_shape``): a two-token decode graph needs ``UNIFORM_BATCH``.

A draft batch is first described whole (``DRAFT``, its steps as the tokens each request adds): a draft graph
runner (``draft_graph.py``) takes the whole multi-step loop as one graph, as SGLang's EAGLE draft graph runner
does. When none takes it, the speculative worker (``speculative.py``) steps the loop and dispatches each step
as a decode forward. The verify after it (``TARGET_VERIFY``, ``1 + steps`` tokens per request) and the
draft-extend after the verify (``DRAFT_EXTEND``, ``1 + accepted``) are uniform extend-shaped forwards: their
graph runners (``verify_graph.py``, ``draft_extend_graph.py``) declare covers only over a backend of
``UNIFORM_BATCH`` graph support.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..backends.base import GraphSupport
from ..declarations import expected, owner
from ..runspec import Mode, RunSpec
from ..serving.batch import ForwardBatch, ForwardMode
from .base import Runner, RunnerContext
from .observations import ForwardPath, ForwardRecord, GraphObservations
from .registry import GRAPH_RUNNERS, runner_class

EAGER = "eager"
"""the graph name of a forward no graph took"""


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchDescriptor:
    """One forward as the dispatcher keys it."""

    forward_mode: ForwardMode
    """``EXTEND``, ``DECODE`` (a draft step is a decode forward), ``DRAFT`` (a whole multi-step draft, before
    the speculative worker steps into it), ``TARGET_VERIFY`` (1 + draft tokens per request) or
    ``DRAFT_EXTEND`` (the tokens a target forward kept), whose graphs (``verify_graph.py``,
    ``draft_extend_graph.py``) need a backend that captures uniform batches"""
    tokens_per_request: int | None
    """tokens every request adds when they all add the same number (a whole draft: its steps); None for a mixed
    extend batch"""
    num_reqs: int
    num_tokens: int
    tree_mask: bool = False
    """the forward attends under a tree mask (a top-k > 1 verify): no graph is captured with one, so none takes
    it, even where its token count equals a chain verify's"""

    @classmethod
    def of(cls, batch: ForwardBatch) -> BatchDescriptor:
        if batch.forward_mode is ForwardMode.DRAFT and batch.draft_step is None:
            # a tree draft's rows are topk per request; its graphs are bucketed by requests, as SGLang's are
            return cls(forward_mode=ForwardMode.DRAFT, tokens_per_request=batch.draft_steps,
                       num_reqs=batch.num_requests, num_tokens=batch.batch_size * batch.draft_steps)
        mode = (batch.forward_mode if batch.forward_mode.is_extend_like else ForwardMode.DECODE)
        lengths = set(batch.extend_seq_lens_cpu)
        if not lengths and batch.batch_size and batch.num_tokens % batch.batch_size == 0:
            lengths = {batch.num_tokens // batch.batch_size}  # a batch built without host-side lengths
        return cls(forward_mode=mode, tokens_per_request=lengths.pop() if len(lengths) == 1 else None,
                   num_reqs=batch.batch_size, num_tokens=batch.num_tokens,
                   tree_mask=batch.forward_mode is ForwardMode.TARGET_VERIFY and batch.draft_tree is not None)


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphKey:
    """One captured graph as the dispatcher picks it: (forward mode, tokens per request, bucket)."""

    forward_mode: ForwardMode
    tokens_per_request: int | None
    """None: a graph over any mix of extend lengths, its bucket counting tokens"""
    bucket: int
    """rows (requests) when ``tokens_per_request`` is set, tokens otherwise"""

    @property
    def name(self) -> str:
        """``decode/bs4``, ``decode/bs4x2`` (two tokens per request), ``extend/tokens16``: the graph's label
        in records, findings and the report."""
        if self.tokens_per_request is None:
            return f"{self.forward_mode.value}/tokens{self.bucket}"
        per = f"x{self.tokens_per_request}" if self.tokens_per_request != 1 else ""
        return f"{self.forward_mode.value}/bs{self.bucket}{per}"


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphCover:
    """The batches one runner's graphs cover: a forward mode, tokens per request, and its buckets."""

    forward_mode: ForwardMode
    tokens_per_request: int | None
    """tokens every request adds; None: any mix (the buckets count tokens then, rows otherwise)"""
    buckets: tuple[int, ...]
    captures_attention: bool = True
    """the graphs capture attention whole (full graphs), so the backend's ``GraphSupport`` must cover the
    shape; False where attention stays an eager island between the captured pieces (piecewise graphs)"""

    @property
    def attention_tokens(self) -> int | None:
        """Tokens per request of each attention call its graphs capture: one per draft step in a draft graph."""
        return 1 if self.forward_mode is ForwardMode.DRAFT else self.tokens_per_request

    def takes(self, batch: BatchDescriptor) -> bool:
        """Whether the forward is of the kind these graphs are for, whatever its size."""
        return batch.forward_mode is self.forward_mode and not batch.tree_mask and (
            self.tokens_per_request is None or batch.tokens_per_request == self.tokens_per_request)

    def size(self, batch: BatchDescriptor) -> int:
        """The forward's size in the unit of these buckets."""
        return batch.num_tokens if self.tokens_per_request is None else batch.num_reqs

    def key_for(self, batch: BatchDescriptor) -> GraphKey | None:
        """The graph that takes the forward: the smallest bucket that holds it; None when none does."""
        if not self.takes(batch):
            return None
        buckets = sorted(set(self.buckets))
        index = bisect.bisect_left(buckets, self.size(batch))
        return self.key(buckets[index]) if index < len(buckets) else None

    def key(self, bucket: int) -> GraphKey:
        """The key of this cover's graph of ``bucket``: what its runner labels the graph it captures."""
        return GraphKey(forward_mode=self.forward_mode, tokens_per_request=self.tokens_per_request, bucket=bucket)


@dataclass(frozen=True, slots=True, kw_only=True)
class Dispatch:
    """The dispatcher's choice for one forward."""

    runner: Runner
    key: GraphKey | None
    """the graph; None: the forward runs on the eager runner"""
    fallback: bool = False
    """no graph took it although a runner takes its kind: no bucket holds it"""
    rows: int = 0
    """the forward's size as the record counts it (the bucket unit of a fallback, tokens otherwise)"""


def covers_of(runner: object) -> tuple[GraphCover, ...] | None:
    """What a runner declares it covers; None for a runner that declares nothing (it takes every forward).
    Anything but None or a tuple of ``GraphCover`` is a DeclarationError naming the runner."""
    covers = getattr(runner, "covers", None)
    if covers is not None and not (isinstance(covers, tuple) and all(isinstance(c, GraphCover) for c in covers)):
        raise expected("runner", f"{owner(type(runner))}.covers", "None or a tuple of GraphCover", covers)
    return covers


class GraphDispatcher:
    """Picks the runner of each forward over the run's graph runners and its eager runner; to a run it is the
    runner (``forward``, ``forward_log``, ``observations``)."""

    @classmethod
    def for_run(cls, ctx: RunnerContext, spec: RunSpec) -> GraphDispatcher:
        """The run's eager runner, and the graph runners its spec names: ``spec.runner``, or its mode's
        registered ones (``registry.GRAPH_RUNNERS``)."""
        eager = runner_class(Mode.EAGER).for_run(ctx, spec)
        names = (spec.runner,) if spec.runner is not None else GRAPH_RUNNERS[Mode(spec.mode)]
        runners = [runner_class(name).for_run(ctx, spec, eager=eager) for name in names]
        takes_all = [r for r in runners if covers_of(r) is None]
        # a runner that covers nothing in this run (the draft graph runner of a run that does not speculate)
        # has no graphs to hand forwards to
        return cls(eager=eager, runners=[r for r in runners if covers_of(r)],
                   takes_all=takes_all[0] if takes_all else None, graph_support=ctx.backend.graph_support)

    def __init__(self, *, eager: Runner, runners: Sequence[Runner] = (), takes_all: Runner | None = None,
                 graph_support: GraphSupport = GraphSupport.FULL) -> None:
        self.eager = eager
        self.runners = tuple(runners)
        self.takes_all = takes_all
        """a runner that declares no covers: every forward is its own, graphs or not"""
        # a full graph of a shape the backend cannot capture whole (two tokens per request over a decode-only
        # backend) is never picked: vLLM's dispatcher asks the backend's AttentionCGSupport the same
        self._covers = tuple((runner, cover) for runner in self.runners for cover in covers_of(runner) or ()
                             if not cover.captures_attention or graph_support.covers_shape(cover.attention_tokens))
        self._log: list[ForwardRecord] = []
        self._fallbacks = 0

    def dispatch(self, batch: ForwardBatch) -> Dispatch:
        """Which runner and graph take a forward of ``batch``."""
        if self.takes_all is not None:
            return Dispatch(runner=self.takes_all, key=None, rows=batch.num_tokens)
        described = BatchDescriptor.of(batch)
        kind = None
        for runner, cover in self._covers:
            if (key := cover.key_for(described)) is not None:
                return Dispatch(runner=runner, key=key, rows=cover.size(described))
            if kind is None and cover.takes(described):
                kind = cover
        if kind is not None:
            return Dispatch(runner=self.eager, key=None, fallback=True, rows=kind.size(described))
        return Dispatch(runner=self.eager, key=None, rows=described.num_tokens)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Hidden states of one forward, on the runner ``dispatch`` picks."""
        chosen = self.dispatch(batch)
        if chosen.key is None and chosen.runner is self.eager and self.runners:
            # recorded before it runs, as a graph runner recorded the eager forwards it handed on: a forward
            # that raises still shows in its step
            self._fallbacks += chosen.fallback
            self._log.append(ForwardRecord(path=ForwardPath.FALLBACK if chosen.fallback else ForwardPath.EAGER,
                                           rows=chosen.rows, graph=EAGER))
            return chosen.runner.forward(batch)
        mark = len(chosen.runner.forward_log())
        done = False
        try:
            hidden = chosen.runner.forward(batch)
            done = True
            return hidden
        finally:
            # what the runner logged of this forward, even of one that raised; a runner that logs nothing of a
            # forward that returned gets the record the dispatcher's choice gives
            ran = list(chosen.runner.forward_log()[mark:])
            if not ran and done:
                ran = [ForwardRecord(path=ForwardPath.EAGER, rows=chosen.rows)]
            name = chosen.key.name if chosen.key is not None else EAGER
            self._log.extend(r if r.graph is not None else dataclasses.replace(r, graph=name) for r in ran)

    def forward_log(self) -> Sequence[ForwardRecord]:
        return self._log

    def observations(self) -> GraphObservations | None:
        """Every runner's graph statistics and findings in one, with the forwards each graph took; None for
        a run without graphs."""
        every = (*self.runners, self.takes_all or self.eager)
        seen = [o for r in every if (o := r.observations()) is not None]
        if not seen and not self.runners:
            return None
        forwards = Counter(f.graph or EAGER for f in self._log)
        return GraphObservations(
            captures=sum(o.captures for o in seen), replays=sum(o.replays for o in seen),
            padded_replays=sum(o.padded_replays for o in seen),
            eager_fallbacks=self._fallbacks + sum(o.eager_fallbacks for o in seen),
            findings=tuple(f for o in seen for f in o.findings),
            rerun_ops=tuple(dict.fromkeys(op for o in seen for op in o.rerun_ops)),
            notes=tuple(dict.fromkeys(n for o in seen for n in o.notes)),
            forwards=tuple(forwards.items()),
        )

"""The composition root of one run: the serving stack, model, backend, scheduler and runners a ``RunSpec``
names, each found through its registry, wired together once: the graph dispatcher over the mode's runners
(``runners/dispatch.py``), and the speculative worker over the dispatcher.

Nothing else in the harness constructs these pieces for a run, so a new serving stack, eviction policy,
backend or runner reaches every run (the CLI, pytest, the benchmark) through its registry name alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...backends.base import AttentionBackend
from ...backends.registry import backend_class
from ...runners.base import RunnerContext
from ...runners.dispatch import GraphDispatcher
from ...runners.speculative import SpeculativeWorker, attach_draft_pool
from ...runspec import RunSpec
from ...serving.designs import declared, resolve_design
from ...serving.model import SyntheticModel
from ...serving.pool import HybridSWAKVPool, ReqToTokenPool
from ...serving.registry import build_stack, eviction_policy, own_scheduler, stack_class
from ...serving.scheduler import Scheduler
from ...serving.stack import ServingStack, stack_spec


@dataclass(slots=True)
class RunParts:
    """Everything one run is built from; tests use it to drive steps by hand."""

    spec: RunSpec
    model: SyntheticModel
    stack: ServingStack
    scheduler: Scheduler
    backend: AttentionBackend
    runner: GraphDispatcher
    """what the run calls: it picks the graph runner (or the eager one) of each forward"""
    worker: SpeculativeWorker

    @property
    def pool(self):
        """the stack's ``pool`` (``stack.KVPool``)"""
        return self.stack.pool

    @property
    def req_to_token_pool(self) -> ReqToTokenPool:
        return self.stack.req_to_token_pool

    def run_batch(self, batch) -> list[torch.Tensor]:
        """Hidden states of every forward the batch takes (one per draft step for a draft batch)."""
        return self.worker.run(batch)


def assemble(spec: RunSpec) -> RunParts:
    """Build every part of the run ``spec`` describes (graphs captured at startup are captured), then poison
    the pools: nothing has run yet."""
    device = torch.device(spec.device)
    model = SyntheticModel(spec.model, device)
    stack = build_stack(stack_class(spec.serving),
                        stack_spec(spec.model, spec.pool, kv_scales=tuple(model.kv_scales()), device=str(device)))
    eviction = eviction_policy(spec.eviction, window=spec.model.window, page_size=spec.pool.page_size)
    # a stack may bring its own scheduler (SGLang's ScheduleBatch path); else the harness's drives it
    scheduler = own_scheduler(spec.serving, stack, spec.timeline, eviction=eviction, vocab_size=spec.model.vocab_size,
                              faults=frozenset(spec.faults)) or Scheduler(
        spec.timeline, stack=stack, eviction=eviction, vocab_size=spec.model.vocab_size, faults=spec.faults)
    if spec.timeline.draft_steps > 0 and isinstance(stack.pool, HybridSWAKVPool):
        # before any graph is captured: the draft graphs write it (SGLang's draft worker owns it)
        attach_draft_pool(stack.pool, spec.model, spec.faults)
    record = declared(spec.design)
    if record is not None and record.memoizes_reads and hasattr(stack.pool, "memoize_reads"):
        stack.pool.memoize_reads = True  # PR 25824's pool: reads and writes share the memo
    backend = backend_class(spec.backend)(
        model_spec=spec.model,
        stack=stack,
        design=resolve_design(spec.design),
        kv_write=spec.kv_write,
        faults=spec.faults,
    )
    ctx = RunnerContext(model=model, backend=backend, pool=stack.pool, req_to_token_pool=stack.req_to_token_pool)
    runner = GraphDispatcher.for_run(ctx, spec)
    stack.poison()
    return RunParts(spec, model, stack, scheduler, backend, runner, SpeculativeWorker(runner, spec.faults))

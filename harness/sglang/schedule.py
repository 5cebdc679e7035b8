"""SGLang 0.5.23's own scheduling path, driven by a scenario's timeline: real ``Req`` objects, real
``ScheduleBatch``es (``init_new``, ``prepare_for_extend``, ``prepare_for_decode``, ``filter_batch``,
``merge_batch``) with their SWA eviction (``maybe_evict_swa``) and allocation, the real tree cache (the
unified cache with full and SWA components: disabled, SGLang's chunk cache, without prefix sharing; enabled,
SGLang's SWA radix tree, with it, its holdings read by the pool invariants through ``radix_holdings.py``) and
its ``release_kv_cache`` / ``checkpoint_kv_cache``, and each forward's ``ForwardBatch`` built by SGLang's
``ForwardBatch.init_new``.

What the timeline decides instead of SGLang's ``Scheduler`` (whose event loop needs a tokenizer, ZMQ sockets
and a model worker) is *who is in each batch*: the harness's policy (``serving/batch_builder.py``), which is
SGLang's default without mixed chunked prefill: an extend batch while a request is mid-prefill or waiting (the
chunked request first, then waiting requests while the chunk budget lasts, at most one left mid-prefill),
otherwise the running batch decodes. ``PrefillAdder``'s memory budgeting is not run: a timeline that does not
fit fails in the real allocator. The rest of ``Scheduler.get_next_batch_to_run`` and its result processing is
done here the way SGLang does it, with SGLang's calls: the finished extend batch is filtered (the chunked
request left out) and merged into the running batch; the chunked request is stashed with
``checkpoint_kv_cache``; each request's sampled token is the timeline's next token (teacher-forced), after
which ``update_finish_state`` decides whether it finished (``max_new_tokens`` = the timeline's output length +
1: SGLang samples the token after the last one written) and ``release_kv_cache`` frees it; an abort marks the
request ``FINISH_ABORT`` and releases it unchecked, as ``process_pending_chunked_abort`` does.

SGLang evicts when a batch is built (``alloc_for_extend`` / ``alloc_for_decode`` call ``maybe_evict_swa``
before they allocate), for the requests in that batch only. A step's ``StepEnd.evicted`` therefore names the
tokens freed while the step's batch was built, and ``finished`` the requests its results finished.

The eviction interval is ``SGLANG_SWA_EVICTION_INTERVAL``, set from the scenario's (``sglang`` policy; 1 under
any other) around every call that reads it. Stand-ins, each at the narrowest point: the model runner
``ForwardBatch.init_new`` reads (``_RUNNER_READS``), and the published CPU server args with a tiny local model
config (``model_runner.publish_cpu_server_args``).
"""

from __future__ import annotations

import contextlib
import os
from array import array
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from ..serving.batch import ForwardMode, make_forward_batch
from ..serving.batch_builder import ScheduledStep
from ..serving.eviction import EvictionPolicy, RequestWindow, retention_bound
from ..serving.eviction_driver import StepEnd
from ..serving.faults import Component, faults_acting_on
from ..serving.loc_plan import KVIndexTranslator
from ..serving.model import ModelSpec
from ..serving.pool import PoolExhausted
from ..serving.scheduler import TimelineTooLong
from ..serving.timeline import LiveToken, RequestSpec, TimelineSpec, TokenKey, request_tokens
from .radix_holdings import Reader, RadixHoldings
from .stack import SGLangStack

INTERVAL_ENV = "SGLANG_SWA_EVICTION_INTERVAL"

_RUNNER_READS = ("device", "model_config", "kv_index_translator", "is_draft_worker = False",
                 "lora_manager = None", "prefill_attention_backend_str = 'torch_native'",
                 "ngram_embedding_manager.enabled = False", "attn_backend = None",
                 "attn_tp_sequence_sharded = False")
"""what ``ForwardBatch.init_new`` reads of its model runner, as the stand-in carries it"""


def tiny_model_spec(layer_is_swa: tuple[bool, ...], window: int, vocab_size: int) -> ModelSpec:
    """The model config the schedule's server args are published with: what ``ModelConfig`` reads (the vocab
    for sampling info, the layer count); slots and schedules do not depend on the rest."""
    pattern = tuple("swa" if swa else "full" for swa in layer_is_swa)
    return ModelSpec(name="sglang-schedule", layer_pattern=pattern, window=window, vocab_size=vocab_size)


@dataclass(slots=True)
class _Request:
    spec: RequestSpec
    tokens: torch.Tensor
    req: Any = None
    """SGLang's ``Req``, made when the request arrives"""
    aborted: bool = False
    finished: bool = False
    due: int = 0
    """what SGLang may retain at most (``retention_bound``, from the window, page and declared interval), as of
    the request's latest batch build: its SWA slots below this must be free"""
    admission_lock: Any = None
    """the tree lock ``PrefillAdder`` took on the request's matched prefix (None without a match): while it is
    the request's lock with its SWA part held, the request reads the prefix's window from the tree"""
    matched_node: int | None = None
    """the id of the tree node its match ended on (``req.last_node`` at admission)"""


@dataclass(slots=True)
class _Book:
    pending: list[_Request] = field(default_factory=list)
    waiting: list[_Request] = field(default_factory=list)
    step: int = 0


class SGLangScheduler:
    """The harness's scheduler interface (``next_step`` / ``finish_step`` / ``live_tokens``) over SGLang's
    ``ScheduleBatch``; drive it as ``serving.scheduler.Scheduler``."""

    def __init__(self, timeline: TimelineSpec, *, stack: SGLangStack, eviction: EvictionPolicy,
                 vocab_size: int, faults: Collection[str] = ()) -> None:
        """With prefix sharing the tree cache is SGLang's radix cache (enabled ``UnifiedRadixCache`` with full
        and SWA components, SGLang's Python tree core), whose holdings the stack's pool invariants read
        (``radix_holdings.py``)."""
        if (why := schedule_unsupported(timeline, eviction=eviction, faults=faults)) is not None:
            raise ValueError(f"SGLang's schedule cannot run this timeline: {why}")
        from sglang.srt.configs.model_config import ModelConfig  # noqa: PLC0415 - SGLang loads lazily
        from sglang.srt.managers import schedule_batch  # noqa: PLC0415
        from sglang.srt.mem_cache import common  # noqa: PLC0415
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: PLC0415
        from sglang.srt.mem_cache.unified_cache.components import ComponentType  # noqa: PLC0415
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: PLC0415
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch  # noqa: PLC0415
        from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: PLC0415
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: PLC0415

        from .model_runner import publish_cpu_server_args  # noqa: PLC0415

        self._sb, self._common, self._ForwardBatch, self._SamplingParams = (
            schedule_batch, common, ForwardBatch, SamplingParams)
        self._swa = ComponentType.SWA
        self._spec_none = SpeculativeAlgorithm.NONE
        self.timeline = timeline
        self.stack = stack
        self.eviction = eviction
        self.device = stack.device
        self.interval = eviction.declared_interval
        self.faults = frozenset(faults)
        server_args = publish_cpu_server_args(
            tiny_model_spec(tuple(stack.spec.layer_is_swa), eviction.window, vocab_size))
        self.model_config = ModelConfig.from_server_args(server_args)
        self.rows = stack.req_to_token_pool.real
        self.sharing = eviction.prefix_sharing
        # the Python tree core: the Rust one (0.5.23's default where its extension is bundled) offers no node
        # walk for the invariants (radix_holdings.py) and matches in compiled code the faults cannot patch
        self.tree_cache = UnifiedRadixCache(CacheInitParams(
            disable=not self.sharing, req_to_token_pool=self.rows, token_to_kv_pool_allocator=stack.allocator,
            page_size=stack.page_size, sliding_window_size=eviction.window - 1,
            tree_components=(ComponentType.FULL, ComponentType.SWA), tree_core_backend="python"))
        if self.sharing:
            stack.hold_prefix_cache(RadixHoldings(tree_cache=self.tree_cache, translate=stack.translate,
                                                  readers=self._readers))
        self.model_runner = SimpleNamespace(
            device=str(stack.device), model_config=self.model_config, is_draft_worker=False, lora_manager=None,
            prefill_attention_backend_str="torch_native", ngram_embedding_manager=SimpleNamespace(enabled=False),
            attn_backend=None, attn_tp_sequence_sharded=False,
            kv_index_translator=stack.api.KVIndexTranslator(
                req_to_token=self.rows.req_to_token, token_to_kv_pool_allocator=stack.allocator,
                token_to_kv_pool=stack.kv_pool, page_size=stack.page_size, device=str(stack.device)))
        # the harness's plan of the step's SWA ids, for the designs that read one (``plan``); SGLang's own plan is
        # the one ForwardBatch.init_new binds (``forward_batch.kv_loc_plan``)
        self.translator = KVIndexTranslator(stack.translate)
        tokens = request_tokens(timeline, vocab_size)
        self.book = _Book(pending=[_Request(spec=r, tokens=tokens[r.rid])
                                   for r in sorted(timeline.requests, key=lambda r: r.arrive)])
        self.running_batch: Any = None
        self.last_batch: Any = None
        self.chunked: _Request | None = None
        self._in_batch: list[_Request] = []
        self._held: list[_Request] = []
        """every request holding KV, in admission order"""
        self._evicted_at_build: tuple[TokenKey, ...] = ()
        self._reading: dict[int, int] = {}
        """per request of the batch built and not yet finished: its first position the batch writes"""
        self.forward_batch: Any = None
        """SGLang's ``ForwardBatch`` of the latest step (``ForwardBatch.init_new``)"""

    @property
    def step_index(self) -> int:
        return self.book.step

    evicts_at_batch_build = True
    """SGLang frees out-of-window slots building a batch (``maybe_evict_swa``), before the forward"""

    # ---- the loop ---------------------------------------------------------------------------------------
    def next_step(self) -> ScheduledStep | None:
        book = self.book
        while book.step < self.timeline.max_steps:
            aborted = self._apply_aborts()
            self._take_arrivals()
            self._merge_last_batch()
            step = self._build()
            if step is not None:
                step.aborted = tuple(aborted)
                return step
            if not book.pending and not book.waiting:
                return None
            book.step += 1
        raise TimelineTooLong(self.timeline.max_steps)

    def finish_step(self) -> StepEnd:
        """The step's results as SGLang processes them: every request of the batch but the chunked one takes
        its next (teacher-forced) token; a finished one is released; the chunked one is stashed."""
        finished: list[str] = []
        freed: list[TokenKey] = []
        batch = self.last_batch
        for r in self._in_batch:
            req = r.req
            if r is self.chunked:
                # with the radix tree, checkpoint_into_tree frees the request's out-of-window SWA slots before it
                # inserts (SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS): reported with the step's evictions
                was = max(req.kv.get_evicted_seqlen(self._swa), req.kv.cache_protected_len)
                self._common.checkpoint_kv_cache(req, self.tree_cache)
                freed.extend(TokenKey(r.spec.rid, p) for p in range(was, req.kv.get_evicted_seqlen(self._swa)))
                continue
            req.output_ids.append(int(r.tokens[req.seqlen]) if req.seqlen < len(r.tokens) else 0)
            req.update_finish_state()
            if req.finished():
                self._common.release_kv_cache(req, self.tree_cache, checkpoint=True)
                r.finished = True
                self._held.remove(r)
                finished.append(r.spec.rid)
        if batch is not None and batch.forward_mode.is_decode():
            # the next decode's inputs: what each request sampled (process_batch_result_decode)
            batch.output_ids = torch.tensor([r.req.output_ids[-1] for r in self._in_batch], dtype=torch.int64)
        evicted, self._evicted_at_build = self._evicted_at_build + tuple(freed), ()
        self._reading = {}
        self.book.step += 1
        return StepEnd(finished=tuple(finished), evicted=evicted)

    def live_tokens(self) -> list[LiveToken]:
        out: list[LiveToken] = []
        for r in self._held:
            kv = r.req.kv
            n = kv.kv_allocated_len
            if n == 0:
                continue
            slots = self.rows.req_to_token[kv.req_pool_idx, :n].to(torch.int64)
            groups = list(zip(*self.stack.group_slots(slots).tolist()))
            # between a batch's build and its results, the batch's first query is at its first new position;
            # otherwise the request's next query is at its length
            first_in_window = self.eviction.window_start(self._reading.get(id(r), n))
            # below cache_protected_len the slots are the radix tree's (a match, or the request's own insert)
            protected = kv.cache_protected_len if self.sharing else 0
            for pos, held in enumerate(groups):
                out.append(LiveToken(rid=r.spec.rid, pos=pos, slots=held, in_window=pos >= first_in_window,
                                     past_frontier=protected <= pos < r.due, shared=pos < protected))
        return out

    def _readers(self) -> list[Reader]:
        """The requests whose admission lock still holds its matched prefix's SWA window (an insert of their own
        moves the lock, ``checkpoint_into_tree``; ``release_swa_prefix_lock`` gives the SWA part up early)."""
        out = []
        for r in self._held:
            lock = r.admission_lock
            if lock is not None and r.req.lock is lock and not lock.swa_released:
                assert r.matched_node is not None  # taken with the admission lock
                out.append(Reader(rid=r.spec.rid, node_id=r.matched_node))
        return out

    # ---- the queues ---------------------------------------------------------------------------------------
    def _take_arrivals(self) -> None:
        book = self.book
        while book.pending and book.pending[0].spec.arrive <= book.step:
            r = book.pending.pop(0)
            params = self._SamplingParams(max_new_tokens=r.spec.output_len + 1, temperature=0.0)
            params.normalize(None)
            prompt = array("q", r.tokens[: r.spec.prompt_len].tolist())
            r.req = self._sb.Req(r.spec.rid, "", prompt, params, vocab_size=self.model_config.vocab_size)
            book.waiting.append(r)

    def _apply_aborts(self) -> list[str]:
        step, aborted = self.book.step, []
        due = [r for r in self._held if r.spec.abort is not None and r.spec.abort <= step]
        for r in due:
            r.req.finished_reason = self._sb.FINISH_ABORT("aborted by the timeline")
            self._common.release_kv_cache(r.req, self.tree_cache, checkpoint=False)
            r.aborted = True
            self._held.remove(r)
            aborted.append(r.spec.rid)
            if r is self.chunked:
                self.chunked = None
        self.book.waiting = [r for r in self.book.waiting if r.spec.abort is None or r.spec.abort > step]
        if due and self.running_batch is not None:
            self.running_batch.filter_batch()
        return aborted

    def _merge_last_batch(self) -> None:
        """As ``get_next_batch_to_run`` opens: the last extend batch, without its chunked request, joins the
        running batch; finished requests leave it."""
        last = self.last_batch
        if last is not None and last.forward_mode.is_extend():
            exclude = [self.chunked.req] if self.chunked is not None else []
            exclude += [r.req for r in self._in_batch if r.aborted]
            last.filter_batch(reqs_to_exclude=exclude)
            if not last.is_empty():
                if self.running_batch is None or self.running_batch.is_empty():
                    self.running_batch = last
                else:
                    self.running_batch.merge_batch(last)
            self.last_batch = None
        if self.running_batch is not None:
            self.running_batch.filter_batch()

    # ---- batches ---------------------------------------------------------------------------------------
    def _build(self) -> ScheduledStep | None:
        if self.chunked is not None or self.book.waiting:
            return self._build_extend()
        if self.running_batch is not None and not self.running_batch.is_empty():
            return self._build_decode()
        return None

    def _build_extend(self) -> ScheduledStep:
        budget = self.timeline.chunk_size or 1 << 30
        chosen: list[_Request] = []
        new_chunked: _Request | None = None
        if self.chunked is not None:
            req = self.chunked.req
            req.init_next_round_input()
            n = min(len(req.full_untruncated_fill_ids) - req.prefix_len, budget)
            req.extend_end = req.prefix_len + n
            budget -= n
            chosen.append(self.chunked)
            if req.extend_end < len(req.full_untruncated_fill_ids):
                new_chunked = self.chunked
        for r in list(self.book.waiting):
            if budget <= 0:
                break
            req = r.req
            req.init_next_round_input(self.tree_cache)
            n = min(len(req.full_untruncated_fill_ids) - req.prefix_len, budget)
            req.extend_end = req.prefix_len + n
            if self.sharing:  # PrefillAdder._commit_prefill_admission locks the matched prefix
                req.lock = self.tree_cache.lock(req.last_node)
                if req.prefix_len > 0:
                    r.admission_lock, r.matched_node = req.lock, req.last_node
            budget -= n
            self.book.waiting.remove(r)
            chosen.append(r)
            self._held.append(r)
            if req.extend_end < len(req.full_untruncated_fill_ids):
                new_chunked = r
        self.chunked = new_chunked
        batch = self._sb.ScheduleBatch.init_new(
            [r.req for r in chosen], self.rows, self.stack.allocator, self.tree_cache, self.model_config, False,
            self._spec_none, chunked_req=self.chunked.req if self.chunked is not None else None)
        self._prepare(batch, batch.prepare_for_extend, chosen)
        self.last_batch = batch
        return self._scheduled(batch, chosen)

    def _build_decode(self) -> ScheduledStep:
        batch = self.running_batch
        by_req = {id(r.req): r for r in self._held}
        chosen = [by_req[id(req)] for req in batch.reqs]
        batch.input_ids = torch.tensor([r.req.output_ids[-1] for r in chosen], dtype=torch.int64,
                                       device=self.device)
        self._prepare(batch, batch.prepare_for_decode, chosen)
        self.last_batch = batch
        return self._scheduled(batch, chosen)

    def _prepare(self, batch: Any, prepare: Any, chosen: list[_Request]) -> None:
        """Run ``prepare`` (which evicts, then allocates) under the scenario's interval, noting what it evicted;
        the allocator running out is the harness's ``PoolExhausted``."""
        before = {id(r): r.req.kv.get_evicted_seqlen(self._swa) for r in self._held}
        for r in chosen:
            if r.req.kv.holds_kv:  # batched before: what its eviction must free building this batch
                r.due = max(r.due, self._due(r))
        alloc = self.stack.allocator
        free_before = alloc.full_available_size(), alloc.swa_available_size()
        try:
            with _interval(self.interval):
                prepare()
        except RuntimeError as exc:
            if "out of memory" not in str(exc).lower():
                raise
            message = f"SGLang's {prepare.__name__}: {exc}".splitlines()[0]
            # a failed allocation must leave the pools as they were (evictions only add free SWA slots)
            if (kept := free_before[0] - alloc.full_available_size()) > 0:
                message += (f"; the failed allocation kept {kept} full slots (full free {free_before[0]} -> "
                            f"{alloc.full_available_size()}, SWA free {alloc.swa_available_size()})")
            raise PoolExhausted(self._short_field(kept=max(kept, 0)), message) from exc
        evicted = []
        for r in self._held:
            # below cache_protected_len the slots are the radix cache's (a matched prefix), not the request's
            was = max(before.get(id(r), 0), r.req.kv.cache_protected_len)
            now = r.req.kv.get_evicted_seqlen(self._swa)
            evicted.extend(TokenKey(r.spec.rid, p) for p in range(was, now))
        self._evicted_at_build = tuple(evicted)
        self._in_batch = chosen
        self._reading = {id(r): r.req.kv.kv_allocated_len - n
                         for r, n in zip(chosen, batch.extend_lens if batch.forward_mode.is_extend() else
                                         [1] * len(chosen))}

    def _due(self, r: _Request) -> int:
        kv, req = r.req.kv, r.req
        window = RequestWindow(seq_len=kv.kv_committed_len, swa_evicted=kv.get_evicted_seqlen(self._swa),
                               prefilling=kv.kv_committed_len < len(req.origin_input_ids),
                               decoded=req.decode_batch_idx)
        return retention_bound(window, window=self.eviction.window, page_size=self.stack.page_size,
                               interval=self.interval, prefix_sharing=self.sharing)

    def _short_field(self, *, kept: int = 0) -> str:
        """The pool that was short, judged from the free counts the allocation met: the full slots a failed
        paged alloc_decode kept (docs/findings.md) count as free, or the full pool would be named for the SWA
        pool's shortage."""
        alloc = self.stack.allocator
        full_free = alloc.full_available_size() + kept
        return "swa_size" if alloc.swa_available_size() <= full_free else "full_size"

    def _scheduled(self, batch: Any, chosen: list[_Request]) -> ScheduledStep:
        """The step as the harness runs it, from SGLang's ``ForwardBatch.init_new`` of the schedule batch."""
        if batch.prefill_input_ids_cpu is not None:  # resolve_forward_inputs: the prefill's ids go to the device
            batch.input_ids = batch.prefill_input_ids_cpu.to(self.device)
            batch.prefill_input_ids_cpu = None
        fb = self._ForwardBatch.init_new(batch, self.model_runner, return_hidden_states_before_norm=False)
        self.forward_batch = fb
        extend = fb.forward_mode.is_extend()
        if extend:
            prefix_lens, extend_lens = list(fb.extend_prefix_lens_cpu), list(fb.extend_seq_lens_cpu)
        else:
            prefix_lens, extend_lens = (fb.seq_lens_cpu - 1).tolist(), [1] * len(chosen)
        owners = tuple(TokenKey(r.spec.rid, p) for r, pre, n in zip(chosen, prefix_lens, extend_lens)
                       for p in range(pre, pre + n))
        out_cache_loc = fb.out_cache_loc.to(torch.int64)
        harness_batch = make_forward_batch(
            forward_mode=ForwardMode.EXTEND if extend else ForwardMode.DECODE,
            input_ids=fb.input_ids.to(torch.int64), positions=fb.positions.to(torch.int64),
            req_pool_indices=fb.req_pool_indices.to(torch.int64), prefix_lens=prefix_lens, extend_lens=extend_lens,
            out_cache_loc=out_cache_loc, req_to_token_pool=self.stack.req_to_token_pool, pool=self.stack.pool,
            translate=self.stack.translate, kv_loc_plan=self.translator.own_plan(self.book.step, out_cache_loc),
        )
        return ScheduledStep(index=self.book.step, batch=harness_batch, forwards=(owners,))


def schedule_unsupported(timeline: TimelineSpec, *, eviction: EvictionPolicy,
                         faults: Collection[str] = ()) -> str | None:
    """Why SGLang's own schedule does not run ``timeline`` here, or None."""
    if timeline.draft_steps:
        return "speculative decoding: spec_prepare_for_decode needs a draft worker"
    if acting := sorted(set(faults) & faults_acting_on(Component.SCHEDULER)):
        return f"faults on the harness's scheduler ({', '.join(acting)}) act on its own code"
    if eviction.prefix_sharing and (acting := sorted(set(faults) & faults_acting_on(Component.PREFIX_CACHE))):
        return f"faults on the harness's prefix cache ({', '.join(acting)}) act on its own code, not on " \
               "SGLang's radix tree"
    return None


def own_scheduler(stack: SGLangStack, timeline: TimelineSpec, *, eviction: EvictionPolicy, vocab_size: int,
                  faults: frozenset[str]) -> SGLangScheduler | None:
    """The SGLang stack's own scheduler for a run (registered with the stack, ``target.py``): SGLang's schedule,
    or None where it cannot express the run (``schedule_unsupported``) and the harness's scheduler drives the
    installed stack."""
    if schedule_unsupported(timeline, eviction=eviction, faults=faults) is not None:
        return None
    return SGLangScheduler(timeline, stack=stack, eviction=eviction, vocab_size=vocab_size, faults=faults)


@contextlib.contextmanager
def _interval(interval: int) -> Iterator[None]:
    """``SGLANG_SWA_EVICTION_INTERVAL`` for the duration (SGLang's ``envs`` reads the environment at each get)."""
    old = os.environ.get(INTERVAL_ENV)
    os.environ[INTERVAL_ENV] = str(interval)
    try:
        yield
    finally:
        if old is None:
            del os.environ[INTERVAL_ENV]
        else:
            os.environ[INTERVAL_ENV] = old

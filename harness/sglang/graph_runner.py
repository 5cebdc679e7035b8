"""SGLang's own decode graph runner (``DecodeCudaGraphRunner``, 0.5.23), captured and replayed on the tape.

The runner is SGLang's, constructed over the stand-in model runner (``model_runner.py``) inside a tape
run (``engine.run()`` of the engine the caller passes: the SGLang target sits below the graph machinery and
never imports it): its bucket list, static buffers (``DecodeInputBuffers`` and the buffer registry), capture
loop, ``FullCudaGraphBackend`` (picked the way SGLang picks it, ``resolve_decode_backend``, from the
published ``cuda_graph_config``), ``can_run_graph``, ``load_batch`` (the padding of every static buffer) and
``execute`` all run unchanged. ``FullCudaGraphBackend`` opens ``torch.cuda.CUDAGraph`` / ``torch.cuda.graph``
itself; during the run those names, the streams, the pool handle and ``synchronize`` are the tape's stand-ins
(``harness/graphs/_tape_device.py``), so each bucket's capture is one region of the run and each replay plays
the tape.

What is not SGLang's, each the narrowest change found (``docs/sglang-graphs.md`` says why):

* ``TapeDecodeRunner.device_module`` is ``torch.cuda`` although the runner's device is the CPU. SGLang's
  ``BaseRunner`` takes the device module from the device (``torch.cpu`` here), which has no graph API; the
  tensors stay on the CPU, the graph calls go to the names the tape serves.
* ``GraphTorchNativeAttnBackend``: the installed ``TorchNativeAttnBackend`` with the graph hooks it lacks
  (``init_cuda_graph_state`` and ``get_cuda_graph_seq_len_fill_value`` raise ``NotImplementedError`` in its
  base class) and with a decode read of static shape: its own ``_run_sdpa_forward_decode`` slices
  ``req_to_token`` with a device length (``.item()``, a host sync the tape refuses during capture, as CUDA
  does). Its writes are SGLang's (``forward_decode`` -> ``SWAKVPool.set_kv_buffer(KVWriteLoc(out_cache_loc,
  swa_out_cache_loc))``); in a graph the SWA locations come from the in-graph metadata hook, which translates
  the runner's static ``out_cache_loc`` (padded by the runner) into a static buffer.

``run_timeline`` drives a scenario's timeline through the real pool and allocator (the harness scheduler over
``SGLangStack``, SGLang's eviction function) twice from the same seed: eagerly (``init_forward_metadata`` and
``model.forward`` per batch), and with every decode batch the runner can take replayed (``can_run_graph`` then
``execute``); prefill batches are eager in both. ``kv_differences`` compares the two runs' pools slot by slot.
A speculative timeline (top-k 1 chains with ``accept_lens``, no draft-extend or the V2 one; over ``trtllm_mha``)
runs each draft's steps as eager decode forwards and its target verify through SGLang's verify path
(``target_verify.py``): the model runner is SGLang's EAGLE target, so the runner captures ``TARGET_VERIFY`` of
``1 + steps`` tokens per request and replays every verify of that width; plain decodes run eagerly. With
``draft_extend = "v2"`` each verify is followed, before its rejected slots are freed, by an eager
``DRAFT_EXTEND_V2`` forward over its window through the same backend (and each prefill by an eager draft-extend
over its chunk).
With ``overlap`` the next iteration's scheduler work runs where SGLang's WAR fence releases it (inside a replay, at
the runner's in-graph read-done marker), and ``audit_writes`` checks every write's location (``overlap.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from ..backends.dense_attention import grouped_decode_attention
from ..runspec import RunSpec
from ..serving.batch import ForwardMode
from ..serving.model import SyntheticModel
from ..serving.scheduler import Scheduler
from ..serving.timeline import LiveToken
from ..serving.stack import stack_spec
from .differential import comparable_spec
from .eviction import InstalledSGLangEviction
from .installed import load
from .model_runner import harness_model_runner
from .overlap import MisplacedWrite, WriteLocationLog, arm_at_read_end, check_fence, external_read_done_event
from .stack import SGLangStack
from .target_verify import (DraftExtendReplay, VerifyReplay, draft_extend_v2_forward_batch, eagle_chain,
                            enter_draft_step, make_target_model_runner, verify_forward_batch)
from .trtllm_cpu import trtllm_on_cpu

_CLASSES: dict[str, type] = {}


def _graph_torch_native_class() -> type:
    if "backend" in _CLASSES:
        return _CLASSES["backend"]
    api = load()

    class GraphTorchNativeAttnBackend(api.TorchNativeAttnBackend):
        """The installed torch-native backend with the graph hooks SGLang's graph runner calls."""

        def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
            # the SWA write ids a captured forward reads: one static buffer, refilled inside the graph
            self.graph_swa_out_cache_loc = torch.zeros(max_num_tokens, dtype=torch.int64, device=self.device)

        def get_cuda_graph_seq_len_fill_value(self) -> int:
            return 1  # what SGLang's paged backends (flashinfer, trtllm_mha) pad seq_lens with

        def init_forward_metadata_in_graph(self, forward_batch: Any) -> None:
            """Translate the runner's static ``out_cache_loc`` into the static SWA ids inside the graph, so a
            replay writes where this batch's (padded) locations map."""
            if not self.use_sliding_window_kv_pool:
                self.swa_out_cache_loc = None
                return
            loc = forward_batch.out_cache_loc
            out = self.graph_swa_out_cache_loc[: loc.shape[0]]
            torch.index_select(self.token_to_kv_pool.full_to_swa_index_mapping, 0, loc, out=out)
            self.swa_out_cache_loc = out

        def _run_sdpa_forward_decode(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                                     seq_lens, encoder_lens=None, scaling=None, enable_gqa=False, causal=False,
                                     is_cross_attn=False, sliding_window_size=None):  # noqa: ANN001, ANN202
            """Decode attention over every column of the request's row, masked to its keys (static shapes).
            An SWA layer reads at the translated SWA slots, where its writes land."""
            if encoder_lens is not None or is_cross_attn:
                raise NotImplementedError("encoder-decoder models: not adapted")
            width = req_to_token.shape[1]
            slots = req_to_token[req_pool_indices].to(torch.int64)  # [bs, width]
            pos = torch.arange(width, device=slots.device)[None, :]
            last = (seq_lens - 1)[:, None]
            visible = pos <= last
            if sliding_window_size is not None:
                visible = visible & (pos >= last - sliding_window_size)
            # columns past a request's keys hold whatever the row last held (SGLang does not zero freed rows)
            slots = torch.where(visible, slots, torch.zeros_like(slots))
            if sliding_window_size is not None and self.use_sliding_window_kv_pool:
                slots = self.token_to_kv_pool.translate_loc_from_full_to_swa(slots)
            keys, values = k_cache[slots], v_cache[slots]  # [bs, width, Hkv, D]
            out = grouped_decode_attention(query, keys, values, visible, scale=scaling)
            output.copy_(out.to(output.dtype))
            return output

    _CLASSES["backend"] = GraphTorchNativeAttnBackend
    return GraphTorchNativeAttnBackend


def _tape_runner_class() -> type:
    if "runner" in _CLASSES:
        return _CLASSES["runner"]
    load()
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    class TapeDecodeRunner(DecodeCudaGraphRunner):
        """``DecodeCudaGraphRunner`` whose device module is ``torch.cuda`` (the tape's, during a run) on a CPU."""

        # BaseRunner.__init__ assigns torch.get_device_module(device): torch.cpu, which has no graph API
        device_module = property(lambda self: torch.cuda, lambda self, value: None)

    _CLASSES["runner"] = TapeDecodeRunner
    return TapeDecodeRunner


def _tape_prefill_runner_class() -> type:
    if "prefill" in _CLASSES:
        return _CLASSES["prefill"]
    load()
    from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import PrefillCudaGraphRunner

    class TapePrefillRunner(PrefillCudaGraphRunner):
        """``PrefillCudaGraphRunner`` whose device module is ``torch.cuda`` (the tape's, during a run) on a CPU."""

        device_module = property(lambda self: torch.cuda, lambda self, value: None)

    _CLASSES["prefill"] = TapePrefillRunner
    return TapePrefillRunner


@contextmanager
def _breakable_on_the_tape() -> Iterator[None]:
    """The breakable graph's module resolves its device module from the platform (``sglang.srt.utils.
    get_device_module``: ``torch.cpu`` on a CPU) where the runner uses its own: bound to ``torch.cuda`` (the tape's
    during a run) in that module only, so its capture stream context is the tape's."""
    load()
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import breakable_cuda_graph

    original = breakable_cuda_graph.get_device_module
    breakable_cuda_graph.get_device_module = lambda: torch.cuda
    try:
        yield
    finally:
        breakable_cuda_graph.get_device_module = original


def graph_config(buckets: Sequence[int], prefill_tokens: Sequence[int] = ()) -> Any:
    """SGLang's ``CudaGraphConfig``: the full decode backend over ``buckets``; the breakable prefill backend over
    ``prefill_tokens`` (token counts), or prefill graphs off."""
    load()
    from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig, PhaseConfig

    prefill = (PhaseConfig(backend=Backend.BREAKABLE, bs=sorted(prefill_tokens), max_bs=max(prefill_tokens))
               if prefill_tokens else PhaseConfig(backend=Backend.DISABLED))
    return CudaGraphConfig(decode=PhaseConfig(backend=Backend.FULL, bs=list(buckets), max_bs=max(buckets)),
                           prefill=prefill)


@dataclass(slots=True, kw_only=True)
class DecodeReplay:
    """What the runner did with one decode batch."""

    step: int
    raw_bs: int
    bucket: int | None
    """the captured batch size it replayed (None: it ran eagerly, ``can_run_graph`` said no)"""
    padded_out_cache_loc: tuple[int, ...] = ()
    """the runner's static ``out_cache_loc`` after ``load_batch``, every row of the bucket"""
    padded_seq_lens: tuple[int, ...] = ()
    padded_req_pool_indices: tuple[int, ...] = ()
    padded_swa_out_cache_loc: tuple[int, ...] = ()
    """the backend's static SWA write ids after the replay, every row of the bucket (what the graph wrote at)"""
    fenced_in_replay: bool = False
    """overlap mode: the next iteration's scheduler work ran inside the replay, at the runner's read-done marker
    (else after the forward)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefillReplay:
    """What the prefill runner did with one extend batch."""

    step: int
    num_tokens: int
    replayed: bool
    """False: it ran eagerly (``can_run_graph`` said no)"""


@dataclass(slots=True, kw_only=True)
class TimelineRun:
    stack: SGLangStack
    captured: tuple[int, ...] = ()
    """the buckets the runner captured, one region each"""
    regions: int = 0
    """capture regions the runners opened at start (a breakable prefill graph opens one per segment)"""
    backend: str = ""
    """the class of the runner's graph backend (SGLang's ``resolve_decode_backend`` picks it)"""
    decodes: list[DecodeReplay] = field(default_factory=list)
    attention: str = ""
    """the class of the attention backend under the runner"""
    prefill_captured: tuple[int, ...] = ()
    """the token counts the prefill runner captured (none: prefill graphs off)"""
    prefills: list[PrefillReplay] = field(default_factory=list)
    rerun_ops: tuple[str, ...] = ()
    """custom ops the captured graphs call again at every replay (SGLang's Triton kernels, run by the interpreter)"""
    overlap: bool = False
    """the next iteration's scheduler work ran where the forward's shared reads end (``overlap.py``)"""
    audited: bool = False
    """every forward's write locations were checked against its batch's allocation (``misplaced_writes``)"""
    misplaced_writes: list[MisplacedWrite] = field(default_factory=list)
    certification: Any = None
    """the dense oracle's certification of this run, where the caller made one from its ``observe``d steps (the
    checking does: this package sits below it)"""
    capture_mode: str = ""
    """the forward mode the decode runner captured (``decode``; ``target_verify`` for a speculative timeline)"""
    verifies: list[VerifyReplay] = field(default_factory=list)
    """every target-verify forward of a speculative timeline (``target_verify.py``), eager or replayed"""
    draft_extends: list[DraftExtendReplay] = field(default_factory=list)
    """every ``DRAFT_EXTEND_V2`` forward after a verify (``timeline.draft_extend = "v2"``), eager"""


def _stack(spec: RunSpec) -> SGLangStack:
    # unpoisoned: both runs start from zeroed pools, so the only differences are what the runs wrote
    return SGLangStack.build(dataclasses.replace(stack_spec(spec.model, spec.pool), poison_freed=False))


def _sglang_batch(api: Any, batch: Any, positions: torch.Tensor) -> Any:
    """The installed ``ForwardBatch`` for one of the harness scheduler's batches."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    extend = batch.forward_mode.is_extend_like  # a target verify is extend-shaped
    seq_lens_cpu = batch.seq_lens.cpu()
    fb = api.ForwardBatch(
        forward_mode=api.ForwardMode.EXTEND if extend else api.ForwardMode.DECODE, batch_size=batch.batch_size,
        input_ids=batch.input_ids.to(torch.int64), req_pool_indices=batch.req_pool_indices.to(torch.int64),
        seq_lens=batch.seq_lens.to(torch.int64), out_cache_loc=batch.out_cache_loc.to(torch.int64),
        seq_lens_sum=int(seq_lens_cpu.sum()), positions=positions.to(torch.int64), seq_lens_cpu=seq_lens_cpu,
        # what ForwardBatch.init_new sets for a batch that asks for no hidden states
        capture_hidden_mode=CaptureHiddenMode.NULL,
    )
    if extend:
        fb.extend_seq_lens = batch.extend_seq_lens
        fb.extend_prefix_lens = batch.extend_prefix_lens
        fb.extend_seq_lens_cpu = list(batch.extend_seq_lens_cpu)
        fb.extend_prefix_lens_cpu = batch.extend_prefix_lens.tolist()
        fb.extend_num_tokens = int(batch.input_ids.shape[0])
        lens = fb.extend_seq_lens.to(torch.int64)
        fb.extend_start_loc = torch.cumsum(lens, 0) - lens  # as ForwardBatch.init_new sets it
        fb.global_num_token_non_padded_cpu = fb.extend_num_tokens  # the prefill runner's eager attention reads it
    return fb


ATTENTION_BACKENDS = ("torch_native", "trtllm_mha")
"""the attention backends the runner drives: the graph-capable torch-native subclass, SGLang's TRT-LLM MHA"""

_TRTLLM_WORKSPACE_BYTES = 1 << 20
"""the TRT-LLM backend's workspace (512 MB by default): only the device kernels use it"""


StepObserver = Callable[[Any, list[LiveToken], list[torch.Tensor], SGLangStack], None]
"""``observe(step, live, hidden, stack)``: called after each step's forwards, before its frees, with the harness
scheduler's step, its live tokens, the forwards' hidden states and the stack (whose ``kv_buffers()`` hold what
the step wrote): what the checking needs to snapshot the run and certify it against the dense oracle"""


def run_timeline(spec: RunSpec, *, engine: Any = None, attention: str = "torch_native",
                 prefill_tokens: Sequence[int] = (), overlap: bool = False, audit_writes: bool = False,
                 observe: StepObserver | None = None) -> TimelineRun:
    """``spec``'s timeline on the installed SGLang: every forward eager, or, given a graph engine (the caller's:
    the SGLang target sits below the graph machinery and never picks one), decode batches through the runner
    inside ``engine.run()``. ``attention`` names the backend (``ATTENTION_BACKENDS``); ``trtllm_mha`` is
    SGLang's ``TRTLLMHAAttnBackend`` unchanged, on the CPU bindings of ``trtllm_cpu``. ``prefill_tokens`` (with an
    engine): SGLang's ``PrefillCudaGraphRunner`` over its breakable backend, capturing those token counts, runs
    every extend batch it can take (``can_run_graph``, ``execute``).

    ``overlap``: the ordering SGLang's overlap scheduler allows (``overlap.py``): the next iteration's scheduler
    work (the step's frees and evictions, then the next batch's build and allocation) runs where SGLang's WAR
    fence releases it, the point the runner publishes for the backend's ``shared_read_ends``: inside a replay at
    the in-graph read-done marker (``IN_REPLAY``), else after the forward. ``audit_writes``: every forward's
    write locations, per layer and row, are checked against what its batch was built with
    (``TimelineRun.misplaced_writes``). ``observe``: a ``StepObserver`` called after every step's forwards (not
    with ``overlap``, whose frees may run inside a forward; after a verify, once its rejected drafts are freed).

    A timeline with ``draft_steps`` runs its verifies through SGLang's target-verify path (``target_verify.py``;
    ``TimelineRun.verifies``) under SGLang's speculative configuration (EAGLE, top-k 1, ``1 + steps`` draft
    tokens), and with ``draft_extend = "v2"`` a ``DRAFT_EXTEND_V2`` forward after each verify
    (``TimelineRun.draft_extends``); what it cannot drive (trees, v1 draft-extends, unverified drafts, another
    backend) is refused with a ``ValueError`` naming it."""
    if observe is not None and overlap:
        raise ValueError("observe: a step's state after its forwards and before its frees does not exist under "
                         "overlap, whose frees run where the forward's shared reads end")
    if overlap and attention != "trtllm_mha":
        raise ValueError("overlap: adapted over the trtllm_mha backend only (the torch-native subclass translates "
                         "the live mapping in its decode read, past where shared reads end)")
    if attention not in ATTENTION_BACKENDS:
        raise ValueError(f"attention={attention!r}: expected one of {', '.join(ATTENTION_BACKENDS)}")
    if prefill_tokens and attention != "trtllm_mha":
        raise ValueError("prefill_tokens: the prefill graph runner is adapted over the trtllm_mha backend only")
    if spec.timeline.draft_steps and (problem := _speculative_problem(spec, attention, overlap, audit_writes,
                                                                      prefill_tokens)):
        raise ValueError(f"speculative timeline: {problem}")
    api = load()
    spec = comparable_spec(spec)  # SGLang's free order and eviction policy (the differential test's knobs)
    trtllm = attention == "trtllm_mha"
    steps = spec.timeline.draft_steps
    with trtllm_on_cpu() if trtllm else nullcontext(), _workspace(trtllm), \
            eagle_chain(spec.model, steps) if steps else nullcontext():
        return _run(api, spec, engine=engine, backend_cls=api.TRTLLMHAAttnBackend if trtllm else
                    _graph_torch_native_class(), bind_plan=trtllm, prefill_tokens=tuple(prefill_tokens),
                    overlap=overlap, audit_writes=audit_writes, observe=observe)


def _speculative_problem(spec: RunSpec, attention: str, overlap: bool, audit_writes: bool,
                         prefill_tokens: Sequence[int]) -> str | None:
    """Why ``run_timeline`` cannot drive ``spec``'s speculative timeline through SGLang's verify path, or None."""
    timeline = spec.timeline
    if attention != "trtllm_mha":
        return "the target verify is adapted over the trtllm_mha backend only"
    if not timeline.verifies:
        return "drafts without a verify (accept_lens) are not adapted: SGLang verifies every draft"
    if timeline.draft_topk != 1:
        return "top-k 1 chains only (a tree's verify reads its custom mask)"
    if timeline.draft_extend and not timeline.draft_extend_v2:
        return ("draft-extend: 0.5.23's is DRAFT_EXTEND_V2 over the whole verify window (timeline.draft_extend = "
                "\"v2\"), not the v1 form over the kept tokens")
    if overlap or audit_writes or prefill_tokens:
        return "overlap, audit_writes and prefill graphs are not adapted to speculative timelines"
    return None


@contextmanager
def _workspace(trtllm: bool) -> Iterator[None]:
    if not trtllm:
        yield
        return
    from sglang.srt.environ import envs

    with envs.SGLANG_FLASHINFER_WORKSPACE_SIZE.override(_TRTLLM_WORKSPACE_BYTES):
        yield


def _run(api: Any, spec: RunSpec, *, engine: Any, backend_cls: type, bind_plan: bool,
         prefill_tokens: tuple[int, ...], overlap: bool, audit_writes: bool,
         observe: StepObserver | None) -> TimelineRun:
    stack = _stack(spec)
    model = SyntheticModel(spec.model)
    model_runner = harness_model_runner(stack=stack, model=model, attn_backend_cls=backend_cls)
    if spec.timeline.draft_steps:  # SGLang's EAGLE target: its graph runner captures TARGET_VERIFY
        make_target_model_runner(model_runner)
    backend = model_runner.attn_backend
    result = TimelineRun(stack=stack, attention=type(backend).__name__.removeprefix("Graph"), overlap=overlap,
                         audited=audit_writes)
    from sglang.srt.runtime_context import get_exec

    buckets = tuple(spec.graphs.decode_buckets)
    prefill_tokens = prefill_tokens if engine is not None else ()
    log = (WriteLocationLog(stack.kv_pool, num_layers=spec.model.num_layers, max_tokens=spec.pool.full_size)
           if audit_writes else None)
    with get_exec().graph.override(cuda_graph_config=graph_config(buckets, prefill_tokens)), \
            _breakable_on_the_tape() if prefill_tokens else nullcontext(), \
            external_read_done_event() if overlap else nullcontext(), log if log is not None else nullcontext():
        model_runner.share_logits_buffer()
        with engine.run() if engine is not None else nullcontext() as run:
            runner = _tape_runner_class()(model_runner) if engine is not None else None
            if runner is not None:
                result.captured, result.regions = tuple(runner.capture_bs), len(run.regions)
                result.backend = type(runner.backend).__name__
                result.capture_mode = runner.capture_forward_mode.name.lower()
            prefill = _tape_prefill_runner_class()(model_runner) if prefill_tokens else None
            if prefill is not None:
                result.prefill_captured = tuple(sorted(prefill.capture_num_tokens))
                result.regions = len(run.regions)
            policy = InstalledSGLangEviction(spec.eviction, window=spec.model.window, page_size=stack.page_size)
            sched = Scheduler(spec.timeline, stack=stack, eviction=policy, vocab_size=spec.model.vocab_size)
            with torch.no_grad():
                step = sched.next_step()
                while step is not None:
                    step = _iteration(api, step, sched=sched, model_runner=model_runner, runner=runner,
                                      prefill=prefill, log=log, overlap=overlap, bind_plan=bind_plan, result=result,
                                      observe=observe)
            if run is not None:
                result.rerun_ops = tuple(dict.fromkeys(op for region in run.regions for op in region.audit.rerun_ops))
    return result


def _iteration(api: Any, step: Any, *, sched: Scheduler, model_runner: Any, runner: Any, prefill: Any,
               log: WriteLocationLog | None, overlap: bool, bind_plan: bool, result: TimelineRun,
               observe: StepObserver | None = None) -> Any:
    """One scheduler iteration: ``step``'s forward, then (or, under ``overlap``, where the forward's shared reads
    end) the step's frees and the next batch's build; returns the next step."""
    backend = model_runner.attn_backend
    batch = step.batch
    if batch.forward_mode is ForwardMode.DRAFT:
        hidden = _draft_and_verify(api, step, model_runner=model_runner, runner=runner, result=result)
        if observe is not None:
            observe(step, sched.live_tokens(), hidden, sched.stack)
        sched.finish_step()
        return sched.next_step()
    fb = _sglang_batch(api, batch, batch.positions)
    if bind_plan:  # what ForwardBatch.init_new does: the iteration's location plan
        model_runner.kv_index_translator.bind_own_plan(fb)
    stack = sched.stack
    if log is not None:  # what the batch was built with, read before anything can change the mapping
        log.clear()
        planned = batch.out_cache_loc.to(torch.int64), stack.translate(batch.out_cache_loc).to(torch.int64)
    upcoming: list[Any] = []

    def scheduler_work() -> None:
        sched.finish_step()
        upcoming.append(sched.next_step())

    decode = batch.forward_mode is ForwardMode.DECODE
    if decode and runner is not None and runner.capture_forward_mode == api.ForwardMode.DECODE:
        replay = DecodeReplay(step=step.index, raw_bs=batch.batch_size, bucket=None)
        if runner.can_run_graph(fb):
            marker = arm_at_read_end(runner, backend, fb.forward_mode, scheduler_work) if overlap else None
            output = runner.execute(fb)
            if marker is not None:
                check_fence(marker, model_runner, step.index)
                replay.fenced_in_replay = True
            # what Scheduler._apply_war_barrier does with the published event: take it and clear it
            model_runner.shared_read_done_event = None
            replay.bucket = runner.bs
            static = runner.buffers
            replay.padded_out_cache_loc = tuple(static.out_cache_loc[: runner.bs].tolist())
            replay.padded_seq_lens = tuple(static.seq_lens[: runner.bs].tolist())
            replay.padded_req_pool_indices = tuple(static.req_pool_indices[: runner.bs].tolist())
            swa = _static_swa_ids(backend)
            if swa is not None:
                replay.padded_swa_out_cache_loc = tuple(swa[: runner.bs].tolist())
        else:
            output = _eager(api, model_runner, backend, fb)
        result.decodes.append(replay)
    elif prefill is not None and batch.forward_mode is ForwardMode.EXTEND:
        replayed = bool(prefill.can_run_graph(fb))
        if replayed:
            output = prefill.execute(fb)
        else:
            output = _eager(api, model_runner, backend, fb)
        result.prefills.append(PrefillReplay(step=step.index, num_tokens=fb.extend_num_tokens, replayed=replayed))
    elif decode or batch.forward_mode is ForwardMode.EXTEND:
        output = _eager(api, model_runner, backend, fb)
    else:
        raise ValueError(f"step {step.index}: {batch.forward_mode.value} batches are not adapted "
                         "to SGLang's graph runner")
    hidden = [_hidden_states(output, batch)]
    if batch.draft_extend is not None:
        hidden.append(_prefill_draft_extend(api, batch, fb, model_runner=model_runner, bind_plan=bind_plan))
    if observe is not None:
        observe(step, sched.live_tokens(), hidden, stack)
    if not upcoming:
        # the coarse fence (the whole forward): eager forwards publish no read-done event here, as the
        # harness calls the backend and the model itself, not SGLang's eager runner
        scheduler_work()
    if log is not None:
        holders = {(group, slot): f"{t.rid}@{t.pos}" for t in sched.live_tokens()
                   for group, slot in zip(("full", "swa"), t.slots) if slot != 0}
        rows = [(key.rid, key.pos) for key in step.forwards[0]]
        result.misplaced_writes.extend(log.misplaced_writes(step=step.index, rows=rows, planned_full=planned[0],
                                                            planned_swa=planned[1], holders=holders))
    return upcoming[0]


def _draft_and_verify(api: Any, step: Any, *, model_runner: Any, runner: Any, result: TimelineRun) -> list[torch.Tensor]:
    """A speculative step: the harness's draft steps, each an eager SGLang decode forward of the target, then the
    draft's target verify through SGLang's verify path (``target_verify.py``), replayed where the runner captured
    its width, eagerly otherwise; the accepted tokens kept and the rest freed by the harness's plan. Returns every
    forward's hidden states."""
    backend = model_runner.attn_backend
    batch = step.batch
    hidden = []
    for i in range(batch.draft_forwards):
        enter_draft_step(batch, i)
        fb = _sglang_batch(api, batch, batch.positions)
        model_runner.kv_index_translator.bind_own_plan(fb)
        hidden.append(_hidden_states(_eager(api, model_runner, backend, fb), batch))
    plan = batch.verify
    assert plan is not None  # run_timeline refuses unverified drafts
    verify = plan.build()
    fb = verify_forward_batch(api, verify, steps=batch.draft_steps)
    model_runner.kv_index_translator.bind_own_plan(fb)
    planned_swa = tuple(model_runner.token_to_kv_pool.translate_loc_from_full_to_swa(verify.out_cache_loc).tolist())
    bucket = None
    if runner is not None and runner.can_run_graph(fb):
        output = runner.execute(fb)
        model_runner.shared_read_done_event = None
        bucket = runner.bs
    else:
        output = _eager(api, model_runner, backend, fb)
    metadata, n = backend.forward_metadata, verify.num_tokens
    swa = metadata.swa_out_cache_loc
    result.verifies.append(VerifyReplay(
        step=step.index, raw_bs=verify.batch_size, tokens_per_req=1 + batch.draft_steps, bucket=bucket,
        seq_lens=tuple(metadata.cache_seqlens_int32[: verify.batch_size].tolist()),
        swa_out_cache_loc=() if swa is None else tuple(swa[:n].tolist()), planned_swa_out_cache_loc=planned_swa))
    hidden.append(_hidden_states(output, verify))
    plan.accept()
    if verify.draft_extend is not None:  # run_timeline refuses all but the V2 form: before the frees
        hidden.append(_draft_extend_v2(api, step, verify, fb, model_runner=model_runner, accepted=plan.accepted,
                                       result=result))
    plan.release_rejected()
    return hidden


def _draft_extend_v2(api: Any, step: Any, verify: Any, verify_fb: Any, *, model_runner: Any, accepted: int,
                     result: TimelineRun) -> torch.Tensor:
    """SGLang's ``DRAFT_EXTEND_V2`` after a verify, eagerly: the draft over the verify's whole window (the
    miniature's draft model is the target, so the target model runner's backend runs it), before the verify's
    rejected slots are freed, as ``eagle_worker_v2`` runs it. Returns its hidden states."""
    backend, pool = model_runner.attn_backend, model_runner.token_to_kv_pool
    batch = verify.draft_extend.build()
    steps = batch.extend_seq_lens_cpu[0] - 1
    fb = draft_extend_v2_forward_batch(api, batch, verify_fb, steps=steps, accepted=accepted,
                                       translator=model_runner.kv_index_translator)
    planned_swa = tuple(pool.translate_loc_from_full_to_swa(batch.out_cache_loc).tolist())
    stack = verify.draft_extend.builder.stack
    free_full, free_swa = stack.hybrid_free_slots()
    held = not (set(batch.out_cache_loc.tolist()) & free_full or set(planned_swa) & free_swa)
    output = _eager(api, model_runner, backend, fb)
    metadata, n = backend.forward_metadata, batch.num_tokens
    swa = metadata.swa_out_cache_loc
    result.draft_extends.append(DraftExtendReplay(
        step=step.index, raw_bs=batch.batch_size, tokens_per_req=1 + steps, accepted=accepted,
        seq_lens=tuple(metadata.cache_seqlens_int32[: batch.batch_size].tolist()),
        swa_out_cache_loc=() if swa is None else tuple(swa[:n].tolist()), planned_swa_out_cache_loc=planned_swa,
        rejected_held=held))
    return _hidden_states(output, batch)


def _prefill_draft_extend(api: Any, batch: Any, target_fb: Any, *, model_runner: Any, bind_plan: bool) -> torch.Tensor:
    """The draft-extend after a prefill chunk, eagerly: an ``EXTEND`` over the chunk's tokens at its slots with an
    ``EagleDraftExtendInput`` (``eagle_worker_v2._draft_extend_for_prefill``), writing the target prefill's plan."""
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput

    extend = batch.draft_extend.build()
    fb = _sglang_batch(api, extend, extend.positions)
    fb.spec_info = EagleDraftExtendInput(hidden_states=None, num_tokens_per_req=1, num_tokens_for_logprob_per_req=1)
    if bind_plan:
        target_fb.kv_loc_plan.bind(fb, model_runner.kv_index_translator)
    return _hidden_states(_eager(api, model_runner, model_runner.attn_backend, fb), extend)


def _static_swa_ids(backend: Any) -> torch.Tensor | None:
    """The static SWA write-id buffer a captured forward writes at (TRT-LLM's, or the torch-native subclass's)."""
    for name in ("cuda_graph_swa_out_cache_loc", "graph_swa_out_cache_loc"):
        if getattr(backend, name, None) is not None:
            return getattr(backend, name)
    return None


def _eager(api: Any, model_runner: Any, backend: Any, fb: Any) -> Any:
    backend.init_forward_metadata(fb)
    with api.forward_context(api.ForwardContext(attn_backend=backend), forward_batch=fb):
        return model_runner.model.forward(fb.input_ids, fb.positions, fb)


def _hidden_states(output: Any, batch: Any) -> torch.Tensor:
    """The batch's own tokens' hidden states out of a forward's ``LogitsProcessorOutput`` (a replay's may carry
    its bucket's padded rows)."""
    hidden = getattr(output, "hidden_states", None)
    if hidden is None:
        raise ValueError("observe: the forward returned no hidden states")
    return hidden[: batch.input_ids.shape[0]]


@dataclass(frozen=True, slots=True)
class SlotDifference:
    pool: str
    """the KV group (``full`` or ``swa``)"""
    layer: int
    slot: int
    max_abs: float


def kv_differences(eager: TimelineRun, graph: TimelineRun, *, atol: float = 0.0) -> list[SlotDifference]:
    """Every slot (but the dummy page, where padded rows write) whose K or V differs between the two runs, in
    every KV group and layer."""
    out = []
    a, b = eager.stack.kv_buffers(), graph.stack.kv_buffers()
    for group, mine, theirs in zip(a.groups.groups, a.buffers, b.buffers):
        for n, layer in enumerate(group.layer_ids):
            diff = torch.maximum((mine.k[n] - theirs.k[n]).abs().flatten(1).amax(1),
                                 (mine.v[n] - theirs.v[n]).abs().flatten(1).amax(1))
            for slot in (diff > atol).nonzero().flatten().tolist():
                if slot >= group.page_size:
                    out.append(SlotDifference(group.name, layer, slot, float(diff[slot])))
    return out


@contextmanager
def swa_ids_filled_at_capture_only() -> Iterator[None]:
    """A fault of the graph metadata hook (the family of SGLang PRs 23552 / 24743: static SWA write ids that a
    replay does not refresh): the SWA ids are translated out of the graph, once, when each bucket is captured,
    and nothing inside the graph refills them, so every replay writes the SWA layers at the capture batch's
    ids (the runner's dummy rows: slot 0) instead of this batch's. Eager forwards are untouched."""
    cls = _graph_torch_native_class()
    original_in, original_out = cls.init_forward_metadata_in_graph, cls.init_forward_metadata_out_graph

    def out_graph(self, forward_batch, in_capture=False):  # noqa: ANN001, ANN202
        if in_capture:
            original_in(self, forward_batch)

    def in_graph(self, forward_batch):  # noqa: ANN001, ANN202
        pass

    cls.init_forward_metadata_in_graph, cls.init_forward_metadata_out_graph = in_graph, out_graph
    try:
        yield
    finally:
        cls.init_forward_metadata_in_graph, cls.init_forward_metadata_out_graph = original_in, original_out


@contextmanager
def padded_out_cache_loc_left_stale() -> Iterator[None]:
    """A fault of the runner's own padding: the registry slot of the static ``out_cache_loc`` copies the
    batch's rows and leaves the padded tail as the previous replay wrote it (``PaddingPolicy.FOREACH_COPY``
    instead of SGLang's ``ZERO``), so a padded row writes its K/V at a slot of an earlier batch's token, still
    live, instead of the dummy slot (the runner-side shape of SGLang PR 24743). Patched where the decode
    runner looks ``build_decode_registry`` up."""
    load()
    import sglang.srt.model_executor.runner.decode_cuda_graph_runner as decode_runner
    from sglang.srt.model_executor.cuda_graph_buffer_registry import PaddingPolicy

    original = decode_runner.build_decode_registry

    def build(**kwargs):  # noqa: ANN003, ANN202
        registry = original(**kwargs)
        registry.get_slot("out_cache_loc").padding_policy = PaddingPolicy.FOREACH_COPY
        return registry

    decode_runner.build_decode_registry = build
    try:
        yield
    finally:
        decode_runner.build_decode_registry = original

"""Hypothesis strategies over the scenario spec: every case they make is a run the loader would accept.

``run_specs(target)`` draws a model preset and its overrides (window, per-layer windows, KV heads, weight
seed), a KV setup, a pool sized near what its timeline needs, page
sizes the backend reads, decode and prefill buckets, a capture policy, a free order and a timeline
(arrivals, prompt lengths around the window and its multiples, prefixes shared with earlier requests, chunking,
decode lengths, aborts, drafts, what each verify accepts, trees of drafts and draft-extends), an eviction policy and interval, a prefix cache,
and keeps only what passes the scenario's own checks, the dry run of its timeline included
(``scenario.check_scenario``), so the property never judges an input the harness would refuse.

Every choice is ordered so that Hypothesis shrinks toward what a person reads fastest: the first preset as it is,
float32 with the plain write, pages of one token, one request, short prompts, no shared prefix, no chunking, no
drafts, no verify, a chain of drafts without a draft-extend, no abort, no prefix cache, the tight eviction policy, one decode bucket, startup capture, the
default free order.
"""

from __future__ import annotations

import dataclasses

from hypothesis import assume
from hypothesis import strategies as st

from ..runspec import CapturePolicy, GraphSpec, KVWrite, Outcome, RunSpec
from ..scenario.generated import scenario_of
from ..scenario.loader import check_scenario
from ..scenario.spec import Expectation
from ..serving.eviction import SGLANG_EVICTION_INTERVAL, EvictionSpec
from ..serving.model_spec import PRESETS, ModelSpec
from ..serving.pool_spec import FREE_ORDERS, SUPPORTED_PAGE_SIZES, PoolSpec
from ..serving.timeline import DRAFT_EXTEND_V2, RequestSpec, TimelineSpec
from .target import MINIATURE, FuzzTarget

CPU_PRESETS = ("gpt-oss-mini", "all-swa", "gemma-mini")
"""the presets the CPU backends run (the others are FlashInfer's, with head_dim 64 and half-precision models)"""

KV_SETUPS = (("float32", "float32", KVWrite.PLAIN), ("bfloat16", "bfloat16", KVWrite.PLAIN),
             ("float32", "fp8_e4m3", KVWrite.FUSED_FP8), ("float32", "fp8_e4m3", KVWrite.PLAIN))
"""(model dtype, KV dtype, KV write): the float32 one first, the one a shrunk case keeps"""

PAGE_SIZES = (1, 4, 16)
"""page sizes drawn: 16 is the smallest TRT-LLM MHA runs; 32 and 64 only make the pools larger"""

MAX_REQUESTS = 4
MAX_ARRIVE = 6
MAX_OUTPUT = 12
MAX_DRAFT_STEPS = 3
DECODE_BUCKETS = (1, 2, 3, 4, 8)
PREFILL_BUCKETS = (4, 8, 12, 16, 24, 32, 64)
POOL_SLACK_PAGES = 3
"""pages beyond what the timeline's tokens need: few, so that pools run near exhaustion and freed slots are
reused at once"""


def _prompt_len(window: int) -> st.SearchStrategy[int]:
    # plain small lengths shrink first; the window's edges and multiples are where chunking and eviction turn
    edges = sorted({n for k in (1, 2, 3) for n in (k * window - 1, k * window, k * window + 1) if n >= 1})
    return st.one_of(st.integers(1, 3 * window + 1), st.sampled_from(edges))


@st.composite
def _request(draw: st.DrawFn, rid: str, window: int) -> RequestSpec:
    arrive = draw(st.integers(0, MAX_ARRIVE))
    prompt_len = draw(_prompt_len(window))
    output_len = draw(st.integers(0, MAX_OUTPUT))
    abort = draw(st.none() | st.integers(1, MAX_OUTPUT + 4).map(lambda d: arrive + d))
    return RequestSpec(rid=rid, arrive=arrive, prompt_len=prompt_len, output_len=output_len, abort=abort)


@st.composite
def _requests(draw: st.DrawFn, window: int) -> tuple[RequestSpec, ...]:
    """One to four requests; a later one may start with an earlier one's tokens (a shared system prompt, the
    next turn of a conversation), which a prefix cache matches and which without one are plain tokens."""
    requests: list[RequestSpec] = []
    for i in range(draw(st.integers(1, MAX_REQUESTS))):
        req = draw(_request(f"r{i}", window))
        sources = [r for r in requests if r.arrive < req.arrive]
        source = draw(st.none() | st.sampled_from(sources)) if sources else None
        if source is not None:
            most = min(req.prompt_len, source.prompt_len + source.output_len)
            req = dataclasses.replace(req, prefix_of=source.rid, shared_len=draw(st.integers(1, most)))
        requests.append(req)
    return tuple(requests)


WINDOWS = (2, 3, 5, 12)
"""sliding windows drawn over a preset's own (which comes first): narrower ones evict sooner, a wider one spans
more than one page of 4 and a prompt of a few chunks"""


@st.composite
def _model(draw: st.DrawFn) -> ModelSpec:
    """A preset with the overrides a scenario's ``[model]`` table may give: its window, per-layer windows
    (sliding layers narrower than the widest, as Gemma's differ), fewer KV heads, another weight seed."""
    preset = PRESETS[draw(st.sampled_from(CPU_PRESETS))]
    window = draw(st.sampled_from((preset.window, *(w for w in WINDOWS if w != preset.window))))
    layer_windows: tuple[int | None, ...] = ()
    if draw(st.booleans()):
        layer_windows = tuple(draw(st.integers(1, window)) if kind == "swa" else None
                              for kind in preset.layer_pattern)
    return dataclasses.replace(preset, window=window, layer_windows=layer_windows,
                               num_kv_heads=draw(st.sampled_from((preset.num_kv_heads, 1))),
                               seed=draw(st.integers(0, 3)))


def _accept_lens(steps: int, *, at_least_one: bool) -> st.SearchStrategy[tuple[int, ...]]:
    """Draft tokens each verify accepts, cycling over the iterations; none drafted first (no verify at all)."""
    entries = st.lists(st.integers(0, steps), min_size=1, max_size=3).map(tuple)
    return entries if at_least_one else st.just(()) | entries


MAX_DRAFT_TOPK = 3


@st.composite
def _speculation(draw: st.DrawFn, target: FuzzTarget, backend: type, draft_steps: int, *,
                 verifies: bool) -> tuple[int, bool | str]:
    """(draft_topk, draft_extend) of a timeline with ``draft_steps`` drafts: a chain without a draft-extend
    first; a tree of drafts where a verify frees its rejected branches and the backend reads per-branch keys,
    a draft-extend (SGLang's v1 form first, then its ``DRAFT_EXTEND_V2`` over the verify window) where a verify
    keeps tokens for it and a chain drafts two steps or more (the timeline's own rules: a tree has no
    draft-extend)."""
    if not verifies:
        return 1, False
    tree_ok = backend.draft_trees and not target.needs_draft_extend
    topk_from = 2 if target.needs_tree else 1
    draft_topk = draw(st.integers(topk_from, MAX_DRAFT_TOPK)) if tree_ok else 1
    if draft_topk > 1 or draft_steps < 2:
        return draft_topk, False
    forms = (True, DRAFT_EXTEND_V2) if target.needs_draft_extend else (False, True, DRAFT_EXTEND_V2)
    return draft_topk, draw(st.sampled_from(forms))


_INTERVALS = (1, 2, 4, 8, SGLANG_EVICTION_INTERVAL)
"""the ``sglang`` policy's eviction intervals drawn: every step first, SGLang's default last"""


def _eviction(prefix_cache: bool) -> st.SearchStrategy[EvictionSpec]:
    tight = st.just(EvictionSpec(policy="tight", prefix_cache=prefix_cache))
    batched = st.sampled_from(_INTERVALS).map(
        lambda n: EvictionSpec(policy="sglang", interval=n, prefix_cache=prefix_cache))
    return tight | batched


def _slack() -> st.SearchStrategy[int]:
    # no slack at all more often than not: only an exhausted pool has its last slot live at the peak
    return st.one_of(st.just(0), st.integers(0, POOL_SLACK_PAGES))


def _buckets(sizes: tuple[int, ...]) -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(st.sampled_from(sizes), min_size=1, max_size=3, unique=True).map(lambda b: tuple(sorted(b)))


def _pages(tokens: int, page: int) -> int:
    return -(-tokens // page)


def run_specs(target: FuzzTarget) -> st.SearchStrategy[RunSpec]:
    """Valid ``RunSpec``s of ``target``'s design, mode, backend, faults and serving stack."""
    if target.serving != MINIATURE:
        _load_stack(target)
    return _run_specs(target)


def _load_stack(target: FuzzTarget) -> None:
    # a stack's modules are imported here, before the first draw: an import that touches the random module
    # inside a strategy is what Hypothesis warns of (it cannot replay it), and it would be timed in the first case
    from ..serving.registry import eviction_policy

    probe = RunSpec(model=PRESETS[CPU_PRESETS[0]], pool=PoolSpec(full_size=64, swa_size=64),
                    timeline=TimelineSpec(requests=(RequestSpec(rid="r0", prompt_len=1),)),
                    design=target.design, mode=target.mode, backend=target.backend)
    moved = _mover(target.serving)(probe)
    if not isinstance(moved, str):
        eviction_policy(moved.eviction, window=moved.model.window, page_size=moved.pool.page_size)


@st.composite
def _run_specs(draw: st.DrawFn, target: FuzzTarget) -> RunSpec:
    from ..backends.registry import backend_class

    backend = backend_class(target.backend)
    model = draw(_model())
    setups = [k for k in KV_SETUPS if k[2] is KVWrite.FUSED_FP8] if target.needs_fused_write else KV_SETUPS
    dtype, kv_dtype, kv_write = draw(st.sampled_from(setups))
    model = model if dtype == model.dtype else dataclasses.replace(model, dtype=dtype)
    # a target verify runs at pages of one token without a prefix cache (runspec.serving_problems)
    page_sizes = [p for p in PAGE_SIZES if p in SUPPORTED_PAGE_SIZES and (p == 1 or not target.needs_verify)
                  and (backend.page_sizes is None or p in backend.page_sizes)]
    page = draw(st.sampled_from(page_sizes))
    window = model.window

    requests = draw(_requests(window))
    chunk_size = draw(st.none() | st.integers(1, 2 * window + 1))
    needs_verify = target.needs_verify or target.needs_tree or target.needs_draft_extend
    min_drafts = 2 if target.needs_draft_extend else 1 if target.needs_drafts or needs_verify else 0
    draft_steps = draw(st.sampled_from(range(min_drafts, MAX_DRAFT_STEPS + 1)))
    accept_lens: tuple[int, ...] = ()
    if draft_steps and page == 1 and not target.needs_prefix_cache:
        accept_lens = draw(_accept_lens(draft_steps, at_least_one=needs_verify))
    draft_topk, draft_extend = draw(_speculation(target, backend, draft_steps, verifies=bool(accept_lens)))
    prefix_cache = target.needs_prefix_cache or (not accept_lens and draw(st.booleans()))
    timeline = TimelineSpec(requests=requests, chunk_size=chunk_size, draft_steps=draft_steps,
                            draft_topk=draft_topk, accept_lens=accept_lens, draft_extend=draft_extend,
                            seed=draw(st.integers(0, 255)))
    eviction = draw(_eviction(prefix_cache))

    graphs = GraphSpec(decode_buckets=draw(_buckets(DECODE_BUCKETS)),
                       prefill_buckets=draw(_buckets(PREFILL_BUCKETS)),
                       capture=draw(st.sampled_from(tuple(CapturePolicy))))
    roomy = PoolSpec(full_size=_ROOMY * page, swa_size=_ROOMY * page, kv_dtype=kv_dtype, page_size=page,
                     free_order=draw(st.sampled_from(FREE_ORDERS)))
    spec = RunSpec(model=model, pool=roomy, timeline=timeline, design=target.design, mode=target.mode,
                   backend=target.backend, faults=target.faults, kv_write=kv_write, graphs=graphs,
                   eviction=eviction)
    assume(not backend.unsupported(mode=spec.mode, device="cpu", kv_write=kv_write, page_size=page,
                                   faults=spec.faults, model=model, kv_dtype=kv_dtype))
    if target.serving != MINIATURE:  # the stack's free order and eviction decide what the timeline holds at once
        spec = _moved_onto(target.serving, spec)

    # pools near exhaustion: each is the timeline's peak use plus a few pages (a slack that shrinks to none),
    # so freed slots are reused at once and the last slot of each pool holds a live token at the peak
    peak = _peak_pages(model, spec.pool, timeline, spec.eviction)
    assume(peak is not None)
    full_pages, swa_pages = peak
    spec = dataclasses.replace(spec, pool=dataclasses.replace(
        spec.pool, full_size=(full_pages + draw(_slack())) * page, swa_size=(swa_pages + draw(_slack())) * page))
    assume(not problems(spec))
    return spec


def _moved_onto(serving: str, spec: RunSpec) -> RunSpec:
    """``spec`` on the stack ``serving`` (its registered move: that stack's free order, eviction), or nothing
    drawn when the stack cannot run it."""
    moved = _mover(serving)(spec)
    assume(not isinstance(moved, str))
    return moved


def _mover(serving: str):
    from ..imports import load_named
    from .properties import FUZZ_STACKS

    return load_named(serving, dict(FUZZ_STACKS), kind="fuzz serving stack",
                      check=lambda o: None if callable(o) else "not a function")


_ROOMY = 512
"""pages of the pool a timeline's peak use is measured in: more than any drawn timeline needs"""


def _peak_pages(model: ModelSpec, pool: PoolSpec, timeline: TimelineSpec,
                eviction: EvictionSpec) -> tuple[int, int] | None:
    """The most pages of each pool (the dummy page included) the timeline holds at once, scheduled by the real
    scheduler in a pool too large to run dry; None when it cannot be scheduled at all."""
    from ..serving.registry import eviction_policy, stack_class
    from ..serving.scheduler import Scheduler
    from ..serving.stack import StackSpec

    stack = stack_class("miniature").build(StackSpec(pool=pool, layer_is_swa=(), num_kv_heads=1, head_dim=1,
                                                     poison_freed=False))
    sched = Scheduler(timeline, stack=stack, vocab_size=model.vocab_size,
                      eviction=eviction_policy(eviction, window=model.window, page_size=pool.page_size))
    least = {"full": pool.full_size, "swa": pool.swa_size}

    def observe() -> None:
        for group, free in stack.free_slots().items():
            least[group] = min(least[group], len(free))

    try:
        while (step := sched.next_step()) is not None:
            observe()
            if step.batch.verify is not None:  # the verify allocates mid-step, after the draft gave its slots back
                step.batch.verify.build()
                observe()
                step.batch.verify.release_rejected()
            sched.finish_step()
    except Exception:  # noqa: BLE001 - a timeline the scheduler refuses is not a case; the dry run says why
        return None
    return tuple(1 + _pages(size - least[group] - pool.page_size, pool.page_size)
                 for group, size in (("full", pool.full_size), ("swa", pool.swa_size)))


def problems(spec: RunSpec) -> list[str]:
    """What the loader would refuse in ``spec`` as a scenario file, the dry run of its timeline included."""
    if found := spec.problems():
        return [str(p) for p in found]
    scenario = scenario_of(spec, name="fuzzed", description="a generated case",
                           expectations=[Expectation(design=spec.design, verdict=Outcome.MATCH, why="generated")])
    return [str(p) for p in check_scenario(scenario)]


__all__ = ["CPU_PRESETS", "KV_SETUPS", "problems", "run_specs"]

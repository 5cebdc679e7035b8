"""The run vocabulary: what one run is, as enums and frozen specs that can check themselves.

A run is a (model, pool, timeline) from the serving miniature, driven through one runner mode, one SWA
location design, one attention backend and one graph engine, with some faults switched on. Every spec here
has a ``problems()`` method that returns every rule it breaks as ``Problem(key, message)``, the key in the
scenario file's vocabulary (``pool.swa_size``, ``timeline.requests[2].abort``), so a spec read from TOML
and a spec built in Python (a fuzzer, a test) are held to the same rules by the same code.

The enums are ``StrEnum``: a member equals its string, so TOML values, JSON records and pytest ids need no
conversion, and ``Mode("full")`` rejects a typo with the list of valid values.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .serving.eviction import EvictionSpec
from .serving.faults import FAULTS

if TYPE_CHECKING:  # the vocabulary (modes, outcomes, limits) is what --help and option errors need, not torch
    from .serving.model_spec import ModelSpec
    from .serving.pool_spec import PoolSpec
    from .serving.timeline import TimelineSpec

REFERENCE_DESIGN = "forward_batch"
"""the design of the reference run every subject is compared against (SGLang PR 24138 as merged)"""


class Mode(enum.StrEnum):
    """How batches reach the model."""

    EAGER = "eager"
    FULL = "full"
    """decode batches replay full decode graphs, bucketed by batch size"""
    PIECEWISE = "piecewise"
    """extend batches replay piecewise prefill graphs, attention an eager island between the pieces"""


class Outcome(enum.StrEnum):
    """A run's verdict against its reference (docs/design.md section 8)."""

    MATCH = "match"
    DIVERGE = "diverge"
    ERROR = "error"
    INVARIANT = "invariant"
    """the pool's accounting broke (a slot owned twice, the dummy page freed, ...): the run stops there"""


class CapturePolicy(enum.StrEnum):
    STARTUP = "startup"
    """capture every bucket before the first batch, largest first"""
    ON_DEMAND = "on_demand"
    """capture a bucket the first time a batch needs it, with the pool state of that moment"""


class KVWrite(enum.StrEnum):
    """How the attention backend stores a layer's K/V."""

    PLAIN = "plain"
    """through the pool's set_kv_buffer"""
    FUSED_FP8 = "fused_fp8"
    """quantize and store in one step, as TRT-LLM's fused FP8 write (the path SGLang PR 24138 fixed)"""


class Engine(enum.StrEnum):
    TAPE = "tape"
    CUDA = "cuda"


class Device(enum.StrEnum):
    CPU = "cpu"
    CUDA = "cuda"


@dataclass(frozen=True, slots=True)
class Problem:
    """One broken rule: the key path it concerns and what was expected."""

    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}" if self.key else self.message


def nested(prefix: str, problems: list[str]) -> list[Problem]:
    """``field: message`` lines of a sub-spec as Problems under ``prefix`` (``model`` -> ``model.window``)."""
    out = []
    for line in problems:
        field, _, message = line.partition(": ")
        out.append(Problem(f"{prefix}.{field}" if prefix else field, message))
    return out


def choice_problem(key: str, value: object, enum_type: type[enum.StrEnum]) -> Problem | None:
    if value in tuple(enum_type):
        return None
    options = ", ".join(repr(m.value) for m in enum_type)
    return Problem(key, f"expected one of {options}, got {value!r}")


_BUCKET_LIMIT = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphSpec:
    decode_buckets: tuple[int, ...] = (1, 2, 4, 8, 16)
    """batch sizes the decode runner captures"""
    capture: CapturePolicy = CapturePolicy.STARTUP
    """when decode graphs are captured"""
    prefill_buckets: tuple[int, ...] = (8, 16, 32, 64)
    """token counts the piecewise prefill runner captures"""

    def problems(self) -> list[Problem]:
        out = []
        for name in ("decode_buckets", "prefill_buckets"):
            buckets = getattr(self, name)
            if not buckets:
                out.append(Problem(name, "expected at least one bucket"))
            first: dict[int, int] = {}
            for i, size in enumerate(buckets):
                if not 1 <= size <= _BUCKET_LIMIT:
                    out.append(Problem(f"{name}[{i}]", f"expected an integer from 1 to {_BUCKET_LIMIT}, got {size}"))
                elif size in first:
                    # a repeated bucket would only capture the same graph twice: a typo
                    out.append(Problem(f"{name}[{i}]", f"duplicate of {name}[{first[size]}] ({size})"))
                else:
                    first[size] = i
        if (p := choice_problem("capture", self.capture, CapturePolicy)) is not None:
            out.append(p)
        return out


def serving_problems(
    *, model: ModelSpec, pool: PoolSpec, timeline: TimelineSpec, graphs: GraphSpec, kv_write: str, kv_write_key: str,
    eviction: EvictionSpec = EvictionSpec(),
) -> list[Problem]:
    """The rules a run and a scenario share: each sub-spec's own, then those that relate them."""
    from .serving.model_spec import MAX_POSITIONS

    out = [
        *nested("model", model.problems()),
        *nested("pool", pool.problems()),
        *nested("timeline", timeline.problems()),
        *[Problem(f"graphs.{p.key}", p.message) for p in graphs.problems()],
        *nested("eviction", eviction.problems()),
    ]
    if pool.max_context_len > MAX_POSITIONS:
        # positions index the model's RoPE cos/sin cache, which has MAX_POSITIONS rows
        out.append(Problem("pool.max_context_len", f"expected at most {MAX_POSITIONS} (the RoPE cache), "
                                                   f"got {pool.max_context_len}"))
    for i, req in enumerate(timeline.requests):
        needed = req.prompt_len + req.output_len
        if needed > pool.max_context_len:
            out.append(Problem(f"timeline.requests[{i}]",
                               f"needs {needed} positions, pool.max_context_len is {pool.max_context_len}"))
    if timeline.draft_topk > 1:
        # a tree draft writes every branch's run after the request's tokens in req_to_token (SGLang's
        # assign_draft_cache_locs), and its verify the root and every branch: (topk - 1) * steps columns past
        # the request's own
        extra = (timeline.draft_topk - 1) * timeline.draft_steps
        for i, req in enumerate(timeline.requests):
            needed = req.prompt_len + req.output_len + extra
            if needed > pool.max_context_len:
                out.append(Problem(f"timeline.requests[{i}]",
                                   f"a tree draft needs {needed} req_to_token columns (its tokens and {extra} for "
                                   f"the other branches), pool.max_context_len is {pool.max_context_len}"))
    if timeline.verifies and pool.page_size != 1:
        # the verify gives the draft's slots back and frees rejected ones token by token: a page the draft
        # continued would go back with them
        out.append(Problem("timeline.accept_lens", f"a target verify runs with pages of one token only; "
                                                   f"pool.page_size is {pool.page_size}"))
    if timeline.verifies and eviction.prefix_cache:
        out.append(Problem("timeline.accept_lens", "a target verify runs without a prefix cache only; "
                                                   "eviction.prefix_cache is on"))
    out.extend(_memory_problems(model, pool))
    if (p := choice_problem(kv_write_key, kv_write, KVWrite)) is not None:
        out.append(p)
    elif kv_write == KVWrite.FUSED_FP8 and pool.kv_dtype != "fp8_e4m3":
        out.append(Problem(kv_write_key, f"'fused_fp8' needs pool.kv_dtype = 'fp8_e4m3', got {pool.kv_dtype!r}"))
    return out


# Every run, the reference and the load-time dry run included, allocates the model and both pools whole;
# past this a combination of fields that are each within bounds is a typo that would exhaust the machine.
RUN_MEMORY_LIMIT = 1 << 30
_ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8_e4m3": 1}


def _memory_problems(model: ModelSpec, pool: PoolSpec) -> list[Problem]:
    if model.problems() or pool.problems():
        return []  # sizes out of their own bounds are reported as such
    h, q, kv = model.hidden_size, model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    per_layer = h * q * 2 + h * kv * 2 + h * model.intermediate_size * 2 + h * 2
    weights = (model.vocab_size * h + model.num_layers * per_layer + h) * _ELEMENT_BYTES.get(model.dtype, 4)
    n_swa = sum(model.layer_is_swa)
    slots = pool.full_size * (model.num_layers - n_swa) + pool.swa_size * n_swa
    kv_bytes = slots * kv * 2 * _ELEMENT_BYTES.get(pool.kv_dtype, 4)
    out = []
    limit = f"more than the {RUN_MEMORY_LIMIT >> 20} MiB a run may use"
    if weights > RUN_MEMORY_LIMIT:
        out.append(Problem("model", f"the weights need {weights >> 20} MiB, {limit}; shrink hidden_size, "
                                    "intermediate_size, vocab_size or the layers"))
    if kv_bytes > RUN_MEMORY_LIMIT:
        out.append(Problem("pool", f"the KV buffers need {kv_bytes >> 20} MiB, {limit}; shrink full_size or swa_size"))
    return out


TIMEOUT_DEFAULT_S = 60.0
"""a run's time limit when the scenario does not set ``run.timeout_s``"""
TIMEOUT_MAX_S = 3600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSpec:
    model: ModelSpec
    pool: PoolSpec
    timeline: TimelineSpec
    design: str = REFERENCE_DESIGN
    """a registered design name or ``package.module:function``"""
    mode: Mode = Mode.EAGER
    backend: str = "torch_native"
    """a registered backend name or ``package.module:Class``"""
    engine: Engine = Engine.TAPE
    faults: frozenset[str] = frozenset()
    kv_write: KVWrite = KVWrite.PLAIN
    graphs: GraphSpec = GraphSpec()
    device: Device = Device.CPU
    serving: str = "miniature"
    """the serving stack under test: a registered name or ``package.module:Class``"""
    eviction: EvictionSpec = EvictionSpec()
    """the SWA eviction policy (a registered name or ``package.module:Class``) and its knobs"""
    runner: str | None = None
    """a runner by registered name or ``package.module:Class``; None: the mode's built-in runner"""

    def reference(self) -> RunSpec:
        """The run every subject is compared against: eager (the built-in runner), the forward_batch design, no
        faults, and a serving stack and eviction policy named by import path replaced by the built-in of their
        kind (``serving.registry.reference_stack``, ``reference_policy``): a plug-in is never its own reference."""
        return dataclasses.replace(
            self, design=REFERENCE_DESIGN, mode=Mode.EAGER, engine=Engine.TAPE, faults=frozenset(), runner=None,
            serving=self.reference_stack(), eviction=dataclasses.replace(self.eviction, policy=self.reference_policy()),
        )

    def reference_stack(self) -> str:
        """The serving stack of the reference run (``serving.registry.reference_stack``)."""
        from .serving.registry import STACKS, reference_stack

        if self.serving in STACKS:
            return self.serving
        from .serving.stack import stack_spec

        return reference_stack(self.serving, stack_spec(self.model, self.pool))

    def reference_policy(self) -> str:
        """The eviction policy of the reference run (``serving.registry.reference_policy``)."""
        from .serving.registry import reference_policy

        return reference_policy(self.eviction.policy)

    def problems(self) -> list[Problem]:
        out = serving_problems(model=self.model, pool=self.pool, timeline=self.timeline, graphs=self.graphs,
                               kv_write=self.kv_write, kv_write_key="kv_write", eviction=self.eviction)
        for key, enum_type in (("mode", Mode), ("engine", Engine), ("device", Device)):
            if (p := choice_problem(key, getattr(self, key), enum_type)) is not None:
                out.append(p)
        for name in sorted(set(self.faults) - set(FAULTS)):
            out.append(Problem("faults", f"unknown fault {name!r}; known: {', '.join(FAULTS)}"))
        return out

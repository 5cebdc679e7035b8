"""The attention-backend contract, split the way vLLM splits it (``vllm/v1/attention/backend.py``).

A backend is three parts:

* the **declaration** (``AttentionBackend``'s class attributes): its name, how far CUDA graphs can cover
  it (``GraphSupport``, ranked like vLLM's ``AttentionCGSupport``), the devices it runs on, its KV write
  paths, the page sizes and KV layouts it reads, and the catalog faults whose switches sit in it. Collection
  reads these to mark items ``gpu`` and to skip, with every reason, the cases the backend cannot run. There
  are no defaults that could claim what a backend does not do: a class that supplies its own builder or
  implementation declares ``known_faults`` beside them, or fails at definition;
* the **metadata builder**: eager build (fresh tensors per forward), capture build (views of static
  buffers it owns, registered for the graph input audit), and the replay refresh that copies a new batch
  into those buffers *outside* the graph. It is exactly the part that differs between eager, capture and
  replay, which is where most graph bugs live. All three take one ``AttentionBatch``: modelled on vLLM's
  ``CommonAttentionMetadata``, it describes the forward once (host-side lengths and their sum, the token
  count, the page size, speculative information), so a backend that needs more adds a field, not a
  positional argument to every builder, wrapper and call site. Its host-side lengths are read from the
  device tensors where it is built, so they always describe the rows the tensors hold, padding included;
* the **implementation**: it owns the SWA write seam, ``_get_layer_cache_loc(layer_id, forward_batch)``,
  which calls the design under test for SWA layers (SGLang PR 24138's function), and the KV write,
  including the fused FP8 path; a subclass supplies only ``attend``.

``AttentionBackend`` also presents SGLang's entry points (``init_forward_metadata``,
``init_forward_metadata_capture_cuda_graph``, ...), which is all a runner calls. A new backend is one
module with three subclasses plus one line in ``registry.py``.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..runspec import Device, KVWrite, Mode
from ..serving.batch import BackendMetadata, ForwardBatch, ForwardMode, SWALocDesign
from ..serving.draft_tree import DraftTree
from ..serving.faults import FAULTS, Component, faults_acting_on
from ..serving.model import DTYPES, ModelSpec
from ..serving.pool import quantize_fp8_fused
from ..serving.stack import ServingStack


@dataclass(frozen=True, slots=True, kw_only=True)
class SpecInfo:
    """What speculative decoding adds to a forward."""

    draft_steps: int = 0
    """decode-shaped forwards the draft batch takes in all (``ForwardMode.DRAFT``)"""
    tokens_per_request: int = 1
    """tokens every request adds in this forward: 1 in a draft step, the draft tokens plus one when verifying"""


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionBatch:
    """One forward as the metadata builders see it; graph batches include their padding rows."""

    forward_mode: ForwardMode
    bs: int
    """rows the metadata covers: the batch's requests, or a graph bucket (padding rows included)"""
    num_real: int
    """rows that are real requests (the head of the batch); equal to ``bs`` outside graph replay"""
    req_pool_indices: torch.Tensor
    """[bs] int64 rows of req_to_token"""
    seq_lens: torch.Tensor
    """[bs] int64 tokens of each request once this forward has run"""
    seq_lens_cpu: tuple[int, ...]
    """the same lengths on the host, as planners that size work on the CPU need them"""
    seq_lens_sum: int
    """``sum(seq_lens_cpu)``"""
    out_cache_loc: torch.Tensor
    """[num_tokens] int64 full-pool slot each new token writes"""
    num_tokens: int
    """new tokens in this forward (``out_cache_loc``'s length)"""
    page_size: int
    """tokens per KV page of the pool the batch writes to"""
    extend_seq_lens: torch.Tensor | None = None
    """EXTEND only: [bs] int64 tokens each request adds"""
    extend_seq_lens_cpu: tuple[int, ...] = ()
    """EXTEND only: the same on the host"""
    spec_info: SpecInfo | None = None
    """speculative decoding's part; None outside it"""
    tree: DraftTree | None = None
    """a tree draft's step or its verify (top-k > 1): per query row, which ``req_to_token`` columns its keys
    are (``serving/draft_tree.py``); None for a chain of drafts and every other forward"""

    @property
    def tokens_per_request(self) -> int | None:
        """Tokens every request adds when they all add the same number; None for a mixed extend batch."""
        if self.spec_info is not None:
            return self.spec_info.tokens_per_request
        if self.forward_mode.is_decode_like:
            return 1
        lengths = set(self.extend_seq_lens_cpu)
        return lengths.pop() if len(lengths) == 1 else None

    def graph_tokens_per_request(self, backend: str) -> int:
        """Tokens every request of a graph batch adds (1 for a decode, ``1 + steps`` for a verify); ValueError
        naming ``backend`` for a batch a uniform-batch graph cannot take."""
        per = self.tokens_per_request if self.forward_mode.is_extend_like else 1
        if per is None:
            raise ValueError(f"{backend} graphs capture batches whose requests all add the same number of tokens; "
                             f"got a {self.forward_mode.value} batch of lengths {self.extend_seq_lens_cpu}")
        return per


def attention_batch(
    *,
    forward_mode: ForwardMode,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    page_size: int,
    num_real: int | None = None,
    extend_seq_lens: torch.Tensor | None = None,
    extend_seq_lens_cpu: tuple[int, ...] = (),
    spec_info: SpecInfo | None = None,
    tree: DraftTree | None = None,
) -> AttentionBatch:
    """The batch over these tensors; its host-side lengths and counts are read from them here, once."""
    # The miniature's ForwardBatch carries no host copy of seq_lens (SGLang's scheduler hands one over), so
    # the lengths come back from the device here: one read per forward, outside any graph.
    seq_lens_cpu = tuple(int(n) for n in seq_lens.tolist())
    bs = len(seq_lens_cpu)
    return AttentionBatch(
        forward_mode=forward_mode,
        bs=bs,
        num_real=bs if num_real is None else num_real,
        req_pool_indices=req_pool_indices,
        seq_lens=seq_lens,
        seq_lens_cpu=seq_lens_cpu,
        seq_lens_sum=sum(seq_lens_cpu),
        out_cache_loc=out_cache_loc,
        num_tokens=int(out_cache_loc.shape[0]),
        page_size=page_size,
        extend_seq_lens=extend_seq_lens,
        extend_seq_lens_cpu=extend_seq_lens_cpu,
        spec_info=spec_info,
        tree=tree,
    )


def spec_info_of(forward_batch: ForwardBatch) -> SpecInfo | None:
    """The speculative part of a forward of ``forward_batch``: a draft batch's steps, a verify's tokens per
    request; None outside speculative decoding."""
    if forward_batch.forward_mode is ForwardMode.TARGET_VERIFY:
        per_request = forward_batch.num_tokens // forward_batch.batch_size
        return SpecInfo(draft_steps=per_request - 1, tokens_per_request=per_request)
    if forward_batch.forward_mode is not ForwardMode.DRAFT:
        return None
    return SpecInfo(draft_steps=forward_batch.draft_steps)


_WINDOW_LEFT_OUT = {ForwardMode.TARGET_VERIFY: "verify_without_swa_window",
                    ForwardMode.DRAFT_EXTEND: "draft_extend_without_swa_window"}
"""the speculative forward kinds whose metadata a fault builds without the SWA window's page table"""


def swa_window_left_out(forward_mode: ForwardMode, faults: Collection[str]) -> bool:
    """Whether a forward of this kind is built without the SWA window's page table, so its SWA layers read the
    SWA pool at full slot ids: SGLang PR 29858's family (the window indices hard-coded to none on one
    speculative path only), ``verify_without_swa_window`` on the verify, ``draft_extend_without_swa_window``
    on the draft-extend."""
    return _WINDOW_LEFT_OUT.get(forward_mode) in faults


def from_forward_batch(forward_batch: ForwardBatch, *, page_size: int) -> AttentionBatch:
    """The batch an eager forward of ``forward_batch`` builds its metadata from."""
    fb = forward_batch
    extend = fb.forward_mode.is_extend_like
    return attention_batch(
        forward_mode=fb.forward_mode,
        req_pool_indices=fb.req_pool_indices,
        seq_lens=fb.seq_lens,
        out_cache_loc=fb.out_cache_loc,
        page_size=page_size,
        extend_seq_lens=fb.extend_seq_lens if extend else None,
        extend_seq_lens_cpu=fb.extend_seq_lens_cpu if extend else (),
        spec_info=spec_info_of(fb),
        tree=fb.draft_tree,
    )


class GraphSupport(enum.IntEnum):
    """How much of a forward CUDA graphs may capture with this backend, ranked."""

    NONE = 0
    """eager only: the backend cannot run between or inside captured pieces"""
    PIECEWISE_ONLY = 1
    """attention must stay an eager island: piecewise prefill graphs"""
    DECODE_ONLY = 2
    """full graphs for batches of one new token per request (and piecewise graphs for prefill)"""
    UNIFORM_BATCH = 3
    """full graphs for batches whose requests all add the same number of tokens (a verify step too)"""
    FULL = 4
    """full graphs for any batch"""

    def covers(self, batch: AttentionBatch) -> bool:
        """Whether a full graph of a backend with this support may capture a forward of ``batch`` whole."""
        return self.covers_shape(batch.tokens_per_request)

    def covers_shape(self, per_request: int | None) -> bool:
        """The same for a forward whose requests each add ``per_request`` tokens (None: a mix), as the graph
        dispatcher (``runners/dispatch.py``) asks it before it hands a forward to a full graph."""
        if self >= GraphSupport.FULL:
            return True
        if self >= GraphSupport.UNIFORM_BATCH:
            return per_request is not None
        return self >= GraphSupport.DECODE_ONLY and per_request == 1


class KVLayout(enum.StrEnum):
    """How a pool orders one page of K (or V): what a kernel's indexing must agree with."""

    NHD = "NHD"
    """[token, kv head, head dim]: the miniature pool's rows"""
    HND = "HND"
    """[kv head, token, head dim]"""


_NEEDS = {Mode.EAGER: GraphSupport.NONE, Mode.PIECEWISE: GraphSupport.PIECEWISE_ONLY, Mode.FULL: GraphSupport.DECODE_ONLY}


class AttentionMetadataBuilder(ABC):
    """Builds the per-forward metadata an implementation reads."""

    def __init__(self, *, model_spec: ModelSpec, stack: ServingStack, faults: frozenset[str]) -> None:
        self.model_spec = model_spec
        self.stack = stack
        self.pool = stack.pool
        self.req_to_token = stack.req_to_token_pool.req_to_token
        self.faults = faults
        self.device = self.pool.device

    @abstractmethod
    def build(self, batch: AttentionBatch) -> BackendMetadata:
        """Fresh metadata for one eager forward."""

    @abstractmethod
    def init_graph_state(self, max_bs: int) -> None:
        """Allocate the static buffers every captured batch size shares."""

    @abstractmethod
    def build_for_graph_capture(self, batch: AttentionBatch) -> BackendMetadata:
        """Metadata over views of the static buffers, filled for the capture batch of ``batch.bs`` rows."""

    @abstractmethod
    def refresh_for_graph_replay(self, batch: AttentionBatch) -> BackendMetadata:
        """Copy the batch about to replay the ``batch.bs`` graph into the static buffers (runs outside the
        graph) and return the metadata object that graph captured."""

    @abstractmethod
    def static_tensors(self) -> list[torch.Tensor]:
        """Every static buffer the builder owns, registered with the graph input audit."""

    def translate_for_read(self, full_slots: torch.Tensor) -> torch.Tensor:
        """The read path's SWA translation of full slots (an SWA page table): through the pool's memo where the
        pool memoizes reads (``HybridSWAKVPool.translate_for_read``, SGLang PR 25824's pool), else afresh, as a
        pool of another stack without that method does."""
        translate = getattr(self.pool, "translate_for_read", self.pool.translate_loc_from_full_to_swa)
        return translate(full_slots)

    def _refill_swa_loc(self, swa_loc: torch.Tensor, out_cache_loc: torch.Tensor, num_real: int) -> None:
        """Refill the ``metadata`` design's persistent SWA-location buffer outside the graph, its padded tail
        zeroed so padded rows write to the dummy slot (PR 27617's answer to PR 24743)."""
        swa_loc[:num_real].copy_(self.pool.translate_loc_from_full_to_swa(out_cache_loc[:num_real]))
        swa_loc[num_real:].zero_()


class AttentionImpl(ABC):
    """Writes a layer's new K/V where the design says, then attends."""

    def __init__(
        self, *, model_spec: ModelSpec, stack: ServingStack, design: SWALocDesign, kv_write: KVWrite,
        faults: frozenset[str],
    ) -> None:
        self.model_spec = model_spec
        self.stack, self.pool = stack, stack.pool
        self.design = design
        self.kv_write = kv_write
        self.faults = faults
        self.dtype = DTYPES[model_spec.dtype]
        self.num_kv_heads = model_spec.num_kv_heads
        self.head_dim = model_spec.head_dim

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, forward_batch: ForwardBatch,
        metadata: BackendMetadata,
    ) -> torch.Tensor:
        self.write_kv(layer_id, forward_batch, metadata, k, v)
        return self.attend(layer_id, q, forward_batch, metadata)

    @abstractmethod
    def attend(
        self, layer_id: int, q: torch.Tensor, forward_batch: ForwardBatch, metadata: BackendMetadata
    ) -> torch.Tensor:
        """Attention output [num_tokens, Hq*D] over what the pool holds after this layer's write."""

    def _get_layer_cache_loc(
        self, layer_id: int, forward_batch: ForwardBatch, metadata: BackendMetadata
    ) -> torch.Tensor:
        """Where this layer writes: the stack's slots of its group, the design's rule for SGLang's SWA layers."""
        if not (self.stack.asks_swa_design and self.pool.is_swa_layer(layer_id)):
            return self.stack.layer_cache_loc(layer_id, forward_batch.out_cache_loc)
        return self.design(forward_batch, self.pool, metadata, layer_id)

    def write_kv(
        self, layer_id: int, forward_batch: ForwardBatch, metadata: BackendMetadata, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        t = k.shape[0]
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        loc = self._get_layer_cache_loc(layer_id, forward_batch, metadata)
        if self.kv_write == KVWrite.FUSED_FP8:
            self._fused_fp8_set_kv_buffer(layer_id, loc, k, v)
        else:
            self.pool.set_kv_buffer(layer_id, loc, k, v)
        draft = getattr(self.pool, "draft", None)
        if draft is not None and forward_batch.forward_mode is ForwardMode.DRAFT:
            # the draft model's own pool, at the target's full-pool slot ids (SGLang's draft worker shares the
            # target's allocator): a pool smaller than the full pool is written past its end (PR 17630)
            draft.set_kv_buffer(layer_id, forward_batch.out_cache_loc, k, v)

    def _fused_fp8_set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Quantize and store in one step, as TRT-LLM's fused write does: times the layer's reciprocal scales,
        each token's row addressed through its page (page, offset in page), not the pool's own write path. So
        its bytes may differ from the plain path's by one e4m3 step; each run is judged against a reference
        written the same way (``RunSpec.reference`` keeps ``kv_write``)."""
        k_scale, v_scale = self.pool.kv_scales[layer_id]
        if "fused_fp8_scale_dropped" in self.faults:
            k_scale = v_scale = 1.0  # the layer's scales never reach the kernel
        k_buf, v_buf = self.pool.get_kv_buffer(layer_id)
        page = self.pool.page_size
        # a negative slot (a -1 pad, vLLM issue 43810) wraps to the last row either way, as the plain path's does
        pages, offsets = torch.div(loc, page, rounding_mode="floor"), torch.remainder(loc, page)
        for buf, x, scale in ((k_buf, k, k_scale), (v_buf, v, v_scale)):
            rows = quantize_fp8_fused(x, 1.0 / scale)
            if buf.shape[0] % page == 0:
                buf.view(buf.shape[0] // page, page, *buf.shape[1:])[pages, offsets] = rows
            else:  # a stack whose pool is not whole pages: the same rows, addressed from the same pair
                buf[pages * page + offsets] = rows
        self.pool.log_write(layer_id, loc)


DECLARATIONS = ("name", "graph_support", "devices", "page_sizes", "kv_layouts", "known_faults", "builder_cls",
                "impl_cls")
"""the class attributes every backend declares; only ``kv_write_paths`` has a default, since the base
implementation owns both write paths"""


class AttentionBackend(ABC):
    """A backend's declaration, and SGLang's backend entry points over its builder and implementation."""

    name: ClassVar[str]
    graph_support: ClassVar[GraphSupport]
    devices: ClassVar[frozenset[Device]]
    kv_write_paths: ClassVar[frozenset[KVWrite]] = frozenset({KVWrite.PLAIN, KVWrite.FUSED_FP8})
    page_sizes: ClassVar[frozenset[int] | None]
    """tokens per page its builders and kernel handle; None for any"""
    kv_layouts: ClassVar[frozenset[KVLayout]]
    """the pool layouts its kernel reads"""
    known_faults: ClassVar[frozenset[str]]
    """catalog faults whose switches this backend implements; no default, so none is claimed by accident"""
    draft_trees: ClassVar[bool] = False
    """its builders read a tree draft's per-branch keys (``AttentionBatch.tree``, top-k > 1); a backend without
    it refuses such a forward by name rather than attend over another branch's slots"""
    pad_seq_len: ClassVar[int] = 1
    """seq_len of a graph batch's padding rows: one token (the dummy slot) reads no garbage and plans as a
    one-token request where a planner needs a last page of at least one token, as FlashInfer's does"""
    component: ClassVar[Component] = Component.ATTENTION_BACKEND
    builder_cls: ClassVar[type[AttentionMetadataBuilder]]
    impl_cls: ClassVar[type[AttentionImpl]]

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        # The fault switches live in the builder and the implementation: a class that brings its own must
        # say which it has, or an inherited list would claim switches its code lacks and every scenario
        # injecting one would report an UNEXPECTED PASS instead of a skip.
        brings = [attr for attr in ("builder_cls", "impl_cls") if attr in own]
        if brings and "known_faults" not in own:
            raise TypeError(
                f"attention backend {cls.__module__}.{cls.__qualname__} sets {' and '.join(brings)} but does "
                f"not declare known_faults: list the catalog faults whose switches its code implements "
                f"(known_faults = frozenset() for none)")
        if "known_faults" in own:
            unknown = set(own["known_faults"]) - faults_acting_on(Component.ATTENTION_BACKEND)
            if unknown:
                raise TypeError(f"attention backend {cls.__module__}.{cls.__qualname__} declares known_faults "
                                f"that are not attention-backend faults of the catalog: {', '.join(sorted(unknown))}")

    @classmethod
    def missing_declarations(cls) -> tuple[str, ...]:
        """The declarations (``DECLARATIONS``) this class neither sets nor inherits."""
        return tuple(attr for attr in DECLARATIONS if not hasattr(cls, attr))

    @classmethod
    def unsupported(
        cls, *, mode: str, device: str, kv_write: str = KVWrite.PLAIN, page_size: int = 1,
        kv_layout: str = KVLayout.NHD, faults: Collection[str] = (), model: ModelSpec | None = None,
        kv_dtype: str = "float32",
    ) -> tuple[str, ...]:
        """Every reason this backend cannot run a case: its mode, device, KV write path, the pool's page size
        and layout (the miniature's is NHD), and the backend faults of the scenario that act in this mode
        but have no switch in it; empty when it can. ``model`` and the pool's ``kv_dtype`` are for a backend
        whose kernels take only some dtypes and head sizes (the CPU backends take any)."""
        out = []
        if device not in cls.devices:
            out.append(f"backend {cls.name} runs on {', '.join(sorted(cls.devices))}, not {device}")
        needed = _NEEDS[Mode(mode)]
        if cls.graph_support < needed:
            out.append(f"backend {cls.name} declares graph support {cls.graph_support.name}; "
                       f"{mode} mode needs {needed.name} or more")
        if kv_write not in cls.kv_write_paths:
            out.append(f"backend {cls.name} has no {kv_write} KV write path")
        if cls.page_sizes is not None and page_size not in cls.page_sizes:
            out.append(f"backend {cls.name} supports page sizes {', '.join(map(str, sorted(cls.page_sizes)))}, "
                       f"not {page_size}")
        if kv_layout not in cls.kv_layouts:
            out.append(f"backend {cls.name} reads KV layout {', '.join(sorted(cls.kv_layouts))}, not {kv_layout}")
        # a fault that cannot act in this mode changes nothing, so a backend without its switch still runs
        lacking = sorted(f for f in set(faults) - cls.known_faults if f in FAULTS
                         and FAULTS[f].acts_on is Component.ATTENTION_BACKEND and mode in FAULTS[f].modes)
        if lacking:
            out.append(f"backend {cls.name} has no switch for fault {', '.join(lacking)}")
        return tuple(out)

    def __init__(
        self,
        *,
        model_spec: ModelSpec,
        stack: ServingStack,
        design: SWALocDesign,
        kv_write: str = KVWrite.PLAIN,
        faults: Collection[str] = (),
    ) -> None:
        pool = stack.pool
        if kv_write not in self.kv_write_paths:
            raise ValueError(f"kv_write must be one of {sorted(self.kv_write_paths)}, got {kv_write!r}")
        if kv_write == KVWrite.FUSED_FP8 and pool.kv_dtype != "fp8_e4m3":
            raise ValueError(f"the fused FP8 KV write needs an fp8_e4m3 pool, not {pool.kv_dtype}")
        if self.page_sizes is not None and pool.page_size not in self.page_sizes:
            raise ValueError(f"backend {self.name} supports page sizes {sorted(self.page_sizes)}, "
                             f"not the pool's {pool.page_size}")
        self.stack, self.pool = stack, pool
        self._made_with = dict(model_spec=model_spec, stack=stack, design=design, kv_write=kv_write, faults=faults)
        self.faults = frozenset(faults) & self.known_faults
        self.builder = self.builder_cls(model_spec=model_spec, stack=stack, faults=self.faults)
        self.impl = self.impl_cls(model_spec=model_spec, stack=stack, design=design, kv_write=KVWrite(kv_write),
                                  faults=self.faults)
        self.forward_metadata: BackendMetadata | None = None

    def for_draft_step(self) -> AttentionBackend:
        """A backend like this one (same stack, design, write path and faults) with its own metadata and graph
        state: SGLang's multi-step draft backend holds one backend per draft step, so each step of a draft
        graph reads metadata of its own length."""
        return type(self)(**self._made_with)

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        """Metadata for one eager forward (or a piecewise replay's attention island) of ``forward_batch``."""
        batch = from_forward_batch(forward_batch, page_size=self.pool.page_size)
        self._check_tree(batch)
        self.forward_metadata = self.builder.build(batch)

    def _check_tree(self, batch: AttentionBatch) -> None:
        if batch.tree is not None and not self.draft_trees:
            raise NotImplementedError(f"backend {self.name} does not read a tree of drafts (timeline.draft_topk "
                                      f"{batch.tree.topk}): its metadata has no per-branch keys; torch_native "
                                      f"and torch_gather do")

    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.builder.init_graph_state(max_bs)

    def init_draft_cuda_graph_state(self, step_backends: Sequence[AttentionBackend], max_bs: int) -> None:
        """The graph state of a multi-step draft backend's per-step backends (``for_draft_step``); by default
        each allocates its own."""
        for backend in step_backends:
            backend.init_cuda_graph_state(max_bs)

    def init_forward_metadata_capture_cuda_graph(self, batch: AttentionBatch) -> None:
        self.forward_metadata = self.builder.build_for_graph_capture(batch)

    def init_forward_metadata_replay_cuda_graph(self, batch: AttentionBatch) -> None:
        self._check_tree(batch)
        # eager steps in between rebound forward_metadata; the graph's own object comes back
        self.forward_metadata = self.builder.refresh_for_graph_replay(batch)

    def graph_static_tensors(self) -> list[torch.Tensor]:
        return self.builder.static_tensors()

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        if self.forward_metadata is None:
            raise RuntimeError(f"backend {self.name}: forward before init_forward_metadata")
        return self.impl.forward(q, k, v, layer_id, forward_batch, self.forward_metadata)

    reference_backend: ClassVar[str | None] = None
    """the backend whose eager run judges this one's runs, for a backend that cannot be its own reference
    (the installed SGLang's torch-native backend, whose read path is under test); None: its own"""

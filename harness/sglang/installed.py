"""Importing the installed SGLang: the one supported version, the signatures the adapter relies on, and
the import work-around a CPU build of torch needs.

``load()`` is the only place the adapter imports ``sglang``. It checks the installed version and every
signature the adapter calls before handing the classes out, so a different SGLang fails with one line that
names the supported version instead of a TypeError deep inside a run.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import inspect
import os
import sys
import types
from dataclasses import dataclass
from typing import Any

SUPPORTED_VERSION = "0.5.23"
MAKE_TARGET = "make sglang-venv"
"""what builds an environment with the supported SGLang (``make test-sglang`` runs its tests)"""


class UnsupportedSGLang(RuntimeError):
    """SGLang is missing, of another version, or lacks a signature the adapter calls."""


def installed_version() -> str | None:
    """The installed SGLang's version from its metadata, without importing it; None when not installed."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def unavailable_reason() -> str | None:
    """Why the SGLang target cannot run here (a skip reason naming the make target), or None when it can.
    Cheap: reads package metadata, imports nothing."""
    version = installed_version()
    if version is None:
        return f"sglang is not installed: the SGLang target needs sglang=={SUPPORTED_VERSION} ({MAKE_TARGET}, " \
               f"then make test-sglang)"
    if version != SUPPORTED_VERSION:
        return f"sglang {version} is installed; the SGLang target supports sglang=={SUPPORTED_VERSION} only " \
               f"({MAKE_TARGET})"
    return None


# ---- torchvision ---------------------------------------------------------------------------------------
# SGLang 0.5.23 imports torchvision at module level on the way to its memory pool (srt/configs/__init__.py
# pulls in the DeepSeek-OCR config and InternVL utilities), although nothing on the pool, allocator,
# eviction or torch-native paths calls it. PyPI's torchvision wheel is linked against CUDA torch and fails
# to load on the CPU build ("operator torchvision::nms does not exist"), so the adapter serves stand-in
# modules for it. Attribute reads give placeholders (transformers reads InterpolationMode members when it
# sees torchvision); calling one raises, naming the stand-in, so a path that really needs torchvision fails
# loudly instead of computing with a fake.
_TORCHVISION = "torchvision"


class _Placeholder:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Placeholder:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args: object, **kwargs: object) -> Any:
        raise RuntimeError(f"{self._name}: torchvision is a stand-in under the harness's SGLang adapter "
                           "(its PyPI wheel needs CUDA torch); this path needs a real torchvision")

    def __repr__(self) -> str:
        return f"<torchvision stand-in {self._name}>"


class _TorchvisionStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):  # noqa: ANN001 - the finder protocol
        if fullname == _TORCHVISION or fullname.startswith(_TORCHVISION + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):  # noqa: ANN001
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"  # transformers parses it when probing torchvision's version

        def attribute(name: str) -> _Placeholder:
            if name.startswith("__"):
                raise AttributeError(name)
            return _Placeholder(f"{spec.name}.{name}")

        module.__getattr__ = attribute  # type: ignore[method-assign]
        return module

    def exec_module(self, module) -> None:  # noqa: ANN001
        pass


def _stand_in_torchvision() -> None:
    """Serve torchvision's stand-in unless a real one imports (a CUDA machine's install keeps its own)."""
    if any(isinstance(f, _TorchvisionStandIn) for f in sys.meta_path):
        return
    if importlib.util.find_spec(_TORCHVISION) is not None:
        try:
            importlib.import_module(_TORCHVISION)
            return
        except Exception:  # noqa: BLE001 - the CUDA wheel on CPU torch raises RuntimeError or ImportError
            for name in [n for n in sys.modules if n == _TORCHVISION or n.startswith(_TORCHVISION + ".")]:
                del sys.modules[name]
    sys.meta_path.insert(0, _TorchvisionStandIn())


# ---- the API the adapter uses ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class SGLangAPI:
    """The classes and functions of the installed SGLang the adapter calls."""

    version: str
    SWAKVPool: type
    MHATokenToKVPool: type
    SWATokenToKVPoolAllocator: type
    ReqToTokenPool: type
    ReqKvInfo: type
    KVWriteLoc: type
    free_swa_out_of_window_slots: Any
    free_kv_row_segments: Any
    TorchNativeAttnBackend: type
    TRTLLMHAAttnBackend: type
    """built without its constructor (it needs CUDA): only ``_get_layer_cache_loc`` is called"""
    TRTLLMMHAMetadata: type
    RadixAttention: type
    ForwardBatch: type
    ForwardMode: type
    forward_context: Any
    ForwardContext: type
    KVIndexTranslator: type
    """the translator whose per-iteration ``KVLocPlan`` resolves write ids per sub-pool"""
    IdSpaceKind: type
    TokenSpan: type
    module: types.ModuleType
    """``sglang`` itself, for the paths of modules a fault patches"""


# (what, parameters it must accept): checked before anything is built, so another version fails in one line
_SIGNATURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("SWAKVPool", ("size", "size_swa", "page_size", "dtype", "head_num", "head_dim", "swa_attention_layer_ids",
                   "full_attention_layer_ids", "device")),
    ("SWATokenToKVPoolAllocator", ("size", "size_swa", "page_size", "dtype", "device", "kvcache", "need_sort")),
    ("ReqToTokenPool", ("size", "max_context_len", "device", "enable_memory_saver")),
    ("free_swa_out_of_window_slots", ("req", "pre_len", "sliding_window_size", "page_size", "req_to_token_pool",
                                      "token_to_kv_pool_allocator", "supports_prefix_sharing", "eviction_interval")),
    ("free_kv_row_segments", ("allocator", "segments", "swa_evicted_seqlen")),
    ("TorchNativeAttnBackend", ("model_runner",)),
    ("RadixAttention", ("num_heads", "head_dim", "scaling", "num_kv_heads", "layer_id", "sliding_window_size")),
    ("KVWriteLoc", ("loc", "swa_loc")),
    ("KVIndexTranslator", ("req_to_token", "token_to_kv_pool_allocator", "token_to_kv_pool", "page_size", "device")),
)
_METHODS: tuple[tuple[str, str], ...] = (
    ("SWATokenToKVPoolAllocator", "alloc"), ("SWATokenToKVPoolAllocator", "alloc_extend"),
    ("SWATokenToKVPoolAllocator", "alloc_decode"), ("SWATokenToKVPoolAllocator", "free"),
    ("SWATokenToKVPoolAllocator", "free_swa"), ("SWATokenToKVPoolAllocator", "free_swa_segment"),
    ("SWAKVPool", "translate_loc_from_full_to_swa"), ("SWAKVPool", "set_kv_buffer"),
    ("ReqToTokenPool", "alloc_rows"), ("ReqToTokenPool", "free_rows"),
    ("TorchNativeAttnBackend", "init_forward_metadata"),
    ("TorchNativeAttnBackend", "_run_sdpa_forward_decode"), ("TorchNativeAttnBackend", "_run_sdpa_forward_extend"),
    ("TRTLLMHAAttnBackend", "_get_layer_cache_loc"),
    ("KVIndexTranslator", "plan"), ("KVIndexTranslator", "write_ids"),
)

_loaded: SGLangAPI | None = None


def load() -> SGLangAPI:
    """Import the installed SGLang once and check it is the supported one; ``UnsupportedSGLang`` (one line
    naming the supported version) otherwise."""
    global _loaded
    if _loaded is not None:
        return _loaded
    reason = unavailable_reason()
    if reason is not None:
        raise UnsupportedSGLang(reason)
    # SGLang's invariant checks at their strict level: a double free or a free of an unmapped SWA peer
    # raises there instead of handing slot 0 out (their default is off)
    os.environ.setdefault("SGLANG_INVARIANT_CHECK", "2")
    _stand_in_torchvision()
    import sglang
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.layers.attention.trtllm_mha_backend import TRTLLMHAAttnBackend, TRTLLMMHAMetadata
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.managers.schedule_batch import ReqKvInfo
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.common import free_kv_row_segments, free_swa_out_of_window_slots
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    from sglang.srt.mem_cache.kv_loc_plan import IdSpaceKind, TokenSpan
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc, MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    api = SGLangAPI(
        version=sglang.__version__, SWAKVPool=SWAKVPool, MHATokenToKVPool=MHATokenToKVPool,
        SWATokenToKVPoolAllocator=SWATokenToKVPoolAllocator, ReqToTokenPool=ReqToTokenPool, ReqKvInfo=ReqKvInfo,
        KVWriteLoc=KVWriteLoc, free_swa_out_of_window_slots=free_swa_out_of_window_slots,
        free_kv_row_segments=free_kv_row_segments,
        TorchNativeAttnBackend=TorchNativeAttnBackend, TRTLLMHAAttnBackend=TRTLLMHAAttnBackend,
        TRTLLMMHAMetadata=TRTLLMMHAMetadata, RadixAttention=RadixAttention, ForwardBatch=ForwardBatch,
        ForwardMode=ForwardMode, forward_context=forward_context, ForwardContext=ForwardContext,
        KVIndexTranslator=KVIndexTranslator, IdSpaceKind=IdSpaceKind, TokenSpan=TokenSpan, module=sglang,
    )
    problems = signature_problems(api)
    if problems:
        raise UnsupportedSGLang(f"sglang {api.version} does not match the adapter (supports sglang=="
                                f"{SUPPORTED_VERSION}): {'; '.join(problems)}")
    _loaded = api
    return api


def signature_problems(api: SGLangAPI) -> list[str]:
    """Every parameter or method the adapter calls that the installed SGLang lacks."""
    out = []
    for name, params in _SIGNATURES:
        target = getattr(api, name)
        accepted = inspect.signature(target).parameters
        missing = [p for p in params if p not in accepted]
        if missing:
            out.append(f"{name} takes no {', '.join(missing)}")
    for cls_name, method in _METHODS:
        if not callable(getattr(getattr(api, cls_name), method, None)):
            out.append(f"{cls_name} has no {method}()")
    return out

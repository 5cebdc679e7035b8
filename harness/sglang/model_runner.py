"""A stand-in for SGLang's ``ModelRunner``, built from a scenario, carrying what SGLang's graph runners read.

SGLang's ``DecodeCudaGraphRunner`` takes a ``ModelRunner`` and reads about thirty of its attributes and a few of
its methods. The real one loads a checkpoint, initializes distributed state and allocates the pools from a
memory budget; none of that is what a graph check is about. ``HarnessModelRunner`` is a subclass of SGLang's
``ModelRunner`` whose constructor skips the real one (as SGLang's own MLX stub does) and sets the attributes from
the harness's pieces instead:

* ``model``: the harness's synthetic model behind SGLang's ``model.forward(input_ids, positions,
  forward_batch)``; its layers are SGLang ``RadixAttention`` layers, so attention goes through the attention
  backend of the forward context the runner opens;
* ``req_to_token_pool`` and ``token_to_kv_pool``: the installed ``ReqToTokenPool`` and ``SWAKVPool`` of the
  scenario's SGLang stack (``stack.SGLangStack``), and that stack's allocator;
* ``kv_index_translator``: the installed ``KVIndexTranslator`` over them;
* ``model_config``: SGLang's ``ModelConfig`` read from a tiny Hugging Face config written from the model spec;
* ``server_args``: the published CPU ``ServerArgs`` (``publish_cpu_server_args``).

Every method the runner calls that only reads those attributes (``decode_num_tokens_per_req``,
``get_aux_hidden_states_width``, ``attn_tp_sequence_sharded``, ...) is the installed ``ModelRunner``'s own,
inherited. The attributes set to a constant are listed in ``STUBS`` with the reason.
"""

from __future__ import annotations

import json
import socket
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from ..serving.model import ModelSpec, SyntheticModel
from .installed import load
from .stack import SGLangStack

STUBS: dict[str, str] = {
    "lora_manager = None": "no LoRA adapters: the runner skips LoRA batch metadata when it is None",
    "hisparse_coordinator = None": "no hierarchical sparse attention",
    "canary_manager = None": "no KV canary (the runner guards it with `is not None`, as SGLang's MLX stub relies on)",
    "ngram_embedding_manager.enabled = False": "no n-gram embeddings",
    "capture_head_hooks = capture_tail_hooks = []": "no model hooks around a captured forward",
    "device_timer = None": "no device timers",
    "layer_info.start_layer = 0": "one pipeline stage holding every layer (pp_size 1)",
    "is_draft_worker = False, spec_algorithm = NONE": "the target model, never a draft worker; spec_algorithm is EAGLE "
        "for a speculative timeline (target_verify.make_target_model_runner), so the graph runner captures TARGET_VERIFY",
    "is_generation = True": "a generation model (the prefill runner returns logits, not pooled states)",
    "attention_layers = the RadixAttentions, moe_layers = moe_fusions = mha_companion_layers = []":
        "what ModelRunner collects from the loaded model for the prefill runner: no MoE, no MHA companions",
}
"""Each attribute of the stand-in set to a constant rather than built by SGLang, with why."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_published: dict[str, Any] = {}


def hf_config(spec: ModelSpec) -> dict[str, Any]:
    """A Llama-shaped Hugging Face config with the model spec's geometry (what ``ModelConfig`` reads)."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size, "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim, "num_hidden_layers": spec.num_layers,
        "vocab_size": spec.vocab_size, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "torch_dtype": spec.dtype, "rope_theta": spec.rope_theta,
    }


def publish_cpu_server_args(spec: ModelSpec) -> Any:
    """Publish CPU ``ServerArgs`` for ``spec`` (once per process and spec) and bring up SGLang's process groups
    with one gloo rank, as ``ModelRunner`` does on a CPU; returns the server args."""
    key = json.dumps(hf_config(spec), sort_keys=True)
    if key in _published:
        return _published[key]
    load()
    from sglang.srt.distributed import parallel_state
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    folder = Path(tempfile.mkdtemp(prefix="harness-sglang-model-"))
    (folder / "config.json").write_text(json.dumps(hf_config(spec)))
    # torch_native is the one attention backend SGLang resolves on a CPU; its resolution turns CUDA graphs
    # off, which graph_config() turns back on for the runner under test
    server_args = ServerArgs(model_path=str(folder), device="cpu", attention_backend="torch_native",
                             skip_tokenizer_init=True, dtype=spec.dtype)
    # one process at world rank 0 (the launcher's placement): the runner reads tp_rank
    publish(server_args, role="test", ranks=SpawnRanks(world_rank=0))
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend="gloo",
            distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
        parallel_state.initialize_model_parallel()
    _published.clear()
    _published[key] = server_args
    return server_args


class TransformerLayers(torch.nn.Module):
    """The transformer body SGLang's prefill graph runner captures (``model.model``, owning ``layers``, as in
    SGLang's Llama): the synthetic model's layers, returning hidden states; the LM head stays outside."""

    def __init__(self, outer: HarnessModel) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(outer.attn)
        self._outer = (outer,)  # not a submodule: the outer model owns this one

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any) -> torch.Tensor:
        outer = self._outer[0]
        spec = outer.inner.spec

        def attention(layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            out = outer.attn[layer_id].forward(q, k.view(-1, spec.num_kv_heads, spec.head_dim),
                                               v.view(-1, spec.num_kv_heads, spec.head_dim), forward_batch)
            return out.reshape(q.shape[0], -1)

        return outer.inner.forward(input_ids, positions, attention)


class HarnessModel(torch.nn.Module):
    """The harness's synthetic model behind SGLang's ``forward(input_ids, positions, forward_batch)``: each layer's
    attention is an installed ``RadixAttention``, run by the backend of the forward context; the body is
    ``self.model`` (``TransformerLayers``), which the prefill graph runner replays in place of its ``forward``."""

    def __init__(self, model: SyntheticModel) -> None:
        super().__init__()
        api = load()
        from sglang.srt.configs.shared_experts import SharedExpertsConfig

        self.inner = model
        spec = model.spec
        # what SGLang's loader sets on every model: no fused shared experts here
        self.shared_experts_config = SharedExpertsConfig()
        self.attn = [
            api.RadixAttention(spec.num_heads, spec.head_dim, scaling=spec.head_dim ** -0.5,
                               num_kv_heads=spec.num_kv_heads, layer_id=i,
                               sliding_window_size=-1 if spec.layer_window(i) is None else spec.layer_window(i) - 1)
            for i in range(spec.num_layers)
        ]
        self.model = TransformerLayers(self)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any) -> Any:
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        # through the attribute: the prefill graph runner swaps self.model.forward for its replay
        hidden = self.model.forward(input_ids, positions, forward_batch)
        logits = hidden.float() @ self.inner.embed.float().T
        # the hidden states too, as a model asked to capture them returns them: what the dense oracle certifies
        return LogitsProcessorOutput(next_token_logits=logits, hidden_states=hidden)


def _model_runner_class() -> type:
    load()
    from sglang.srt.model_executor.model_runner import ModelRunner

    class HarnessModelRunner(ModelRunner):
        """``ModelRunner`` without its constructor: the attributes come from the scenario's pieces."""

        canary_manager = None
        prefill_aware_swa = False

        def __init__(self, *, stack: SGLangStack, model: SyntheticModel, server_args: Any,
                     attn_backend_cls: Any = None) -> None:  # noqa: D107 - no super().__init__: see the module
            from sglang.srt.configs.model_config import ModelConfig
            from sglang.srt.model_executor.graph_shared_output import GraphSharedOutput
            from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

            api = stack.api
            self.server_args = server_args
            self.device = str(stack.device)
            self.gpu_id = 0
            self.dtype = model.dtype
            self.model_config = ModelConfig.from_server_args(server_args)
            self.model = HarnessModel(model)
            self.req_to_token_pool = stack.req_to_token_pool.real
            self.token_to_kv_pool = stack.kv_pool
            self.token_to_kv_pool_allocator = stack.allocator
            self.page_size = stack.page_size
            self.kv_index_translator = api.KVIndexTranslator(
                req_to_token=self.req_to_token_pool.req_to_token, token_to_kv_pool_allocator=stack.allocator,
                token_to_kv_pool=stack.kv_pool, page_size=stack.page_size, device=self.device)
            self.spec_algorithm = SpeculativeAlgorithm.NONE
            self.is_draft_worker = False
            self.lora_manager = None
            self.hisparse_coordinator = None
            self.ngram_embedding_manager = SimpleNamespace(enabled=False, table=None)
            self.capture_head_hooks = []
            self.capture_tail_hooks = []
            self.device_timer = None
            self.layer_info = SimpleNamespace(start_layer=0, end_layer=model.spec.num_layers)
            self.shared_read_done_event = None
            from sglang.srt.runtime_context import get_parallel

            self.pp_group, self.tp_group = get_parallel().pp_group, get_parallel().tp_group
            self.max_running_requests = self.req_to_token_pool.size
            self.graph_shared_output = None
            self.is_generation = True
            self.attention_layers = list(self.model.attn)
            self.moe_layers, self.moe_fusions, self.mha_companion_layers = [], [], []
            # what the FlashInfer-family backends read of the model runner (ModelRunner resolves them from the
            # server args and the model): the backend the stand-in is built with, the pool's dtype, the window
            self.prefill_attention_backend_str = self.decode_attention_backend_str = _backend_name(attn_backend_cls)
            self.kv_cache_dtype = stack.kv_pool.full_kv_pool.dtype
            self.sliding_window_size = model.spec.window - 1 if any(model.spec.layer_is_swa) else None
            self.attn_backend = None if attn_backend_cls is None else attn_backend_cls(self)

        def share_logits_buffer(self) -> None:
            """The process's shared logits buffer, as ``ModelRunner`` makes it once graphs are configured."""
            from sglang.srt.model_executor.graph_shared_output import GraphSharedOutput

            self.graph_shared_output = GraphSharedOutput.create_for_model_runner(self)

    return HarnessModelRunner


def _backend_name(cls: Any) -> str:
    """The ``--attention-backend`` name of an SGLang backend class, as ``ModelRunner`` knows it."""
    names = {"TRTLLMHAAttnBackend": "trtllm_mha", "FlashInferAttnBackend": "flashinfer"}
    return next((name for base, name in names.items() if cls is not None and any(
        k.__name__ == base for k in cls.__mro__)), "torch_native")


_RUNNER_CLASS: type | None = None


def harness_model_runner(*, stack: SGLangStack, model: SyntheticModel, attn_backend_cls: Any = None) -> Any:
    """The stand-in ``ModelRunner`` over ``stack`` and ``model`` (CPU server args published first)."""
    global _RUNNER_CLASS
    server_args = publish_cpu_server_args(model.spec)
    if _RUNNER_CLASS is None:
        _RUNNER_CLASS = _model_runner_class()
    return _RUNNER_CLASS(stack=stack, model=model, server_args=server_args, attn_backend_cls=attn_backend_cls)

"""A tiny seeded transformer whose layers are either sliding-window (SWA) or full attention.

Attention is not computed here: each layer hands its q/k/v to an ``AttentionFn`` supplied by the runner,
which writes the KV cache and attends through the backend. Everything else (embedding, RMSNorm, RoPE,
projections, MLP) is plain torch so the graph engines can capture it.

The attention output of layer k feeds layer k+1, so a wrong KV read in one layer changes the K/V that
every later layer writes, as in a real model.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# A forward runs on token rows padded to a multiple of this. CPU kernels are not batch-invariant: GEMM
# picks different blockings for 3 rows and 4 rows, and vectorized elementwise loops compute the tail of a
# buffer with scalar code (std::cos vs SLEEF's cos differ in the last bit). Without padding, a graph
# replaying a padded bucket would differ from the eager run in the last bit for reasons that are not bugs.
# With every buffer a whole number of row blocks, row r's bits never depend on how many rows came with it,
# and the harness can demand bitwise equality on CPU.
_ROW_BLOCK = 16

# RoPE angles come from a table gathered by position, as serving engines keep a cos/sin cache; a gather
# is exact, where computing cos per batch would round differently per batch shape.
MAX_POSITIONS = 4096

AttentionFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(layer_id, q [T, Hq*D], k [T, Hkv*D], v [T, Hkv*D]) -> attention output [T, Hq*D]"""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    name: str
    layer_pattern: tuple[str, ...]
    """per layer: "swa" (sliding window) or "full\""""
    window: int
    """keys visible to a query in an SWA layer, the query's own key included (FlashInfer window_left = W - 1)"""
    hidden_size: int = 64
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 128
    vocab_size: int = 256
    rope_theta: float = 10000.0
    dtype: str = "float32"
    seed: int = 0
    layer_windows: tuple[int | None, ...] = ()
    """per layer, for a model whose sliding-window layers differ: an SWA layer's window (at most ``window``,
    the widest, which eviction frees by), None for a full layer; empty: every SWA layer's window is ``window``"""

    @property
    def num_layers(self) -> int:
        return len(self.layer_pattern)

    @property
    def layer_is_swa(self) -> tuple[bool, ...]:
        return tuple(kind == "swa" for kind in self.layer_pattern)

    def layer_window(self, layer_id: int) -> int | None:
        """Keys visible in ``layer_id``; None for full attention."""
        if self.layer_pattern[layer_id] != "swa":
            return None
        return self.layer_windows[layer_id] if self.layer_windows else self.window

    def problems(self) -> list[str]:
        """Every rule the spec breaks, as ``field: what is wrong``."""
        out = []
        if not 1 <= len(self.layer_pattern) <= _MAX_LAYERS:
            out.append(f"layer_pattern: expected 1 to {_MAX_LAYERS} layers, got {len(self.layer_pattern)}")
        bad = sorted({k for k in self.layer_pattern if k not in ("swa", "full")})
        if bad:
            out.append(f"layer_pattern: expected entries 'swa' or 'full', got {bad}")
        if self.layer_windows:
            if len(self.layer_windows) != len(self.layer_pattern):
                out.append(f"layer_windows: expected one entry per layer ({len(self.layer_pattern)}), "
                           f"got {len(self.layer_windows)}")
            else:
                for i, (kind, w) in enumerate(zip(self.layer_pattern, self.layer_windows)):
                    if kind == "full" and w is not None:
                        out.append(f"layer_windows[{i}]: a full layer has no window (None), got {w}")
                    elif kind == "swa" and not (isinstance(w, int) and 1 <= w <= self.window):
                        out.append(f"layer_windows[{i}]: expected an integer from 1 to window ({self.window}), got {w}")
        for name, hi in _BOUNDS.items():
            value = getattr(self, name)
            if not 1 <= value <= hi:
                out.append(f"{name}: expected an integer from 1 to {hi}, got {value}")
        if 1 <= self.num_kv_heads and self.num_heads % self.num_kv_heads:
            out.append(f"num_heads: expected a multiple of num_kv_heads ({self.num_kv_heads}), got {self.num_heads}")
        if self.head_dim % 2:
            out.append(f"head_dim: expected an even number for RoPE, got {self.head_dim}")
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 1.0):
            out.append(f"rope_theta: expected a finite number > 1, got {self.rope_theta}")
        if self.dtype not in DTYPES:
            out.append(f"dtype: expected one of {sorted(DTYPES)}, got {self.dtype!r}")
        if not 0 <= self.seed <= _SEED_MAX:
            out.append(f"seed: expected an integer from 0 to {_SEED_MAX}, got {self.seed}")
        return out


# Models are tiny by design (docs/design.md section 10); a size past these is a typo, and honouring it would make
# every run, the reference included, fail to allocate its weights.
_MAX_LAYERS = 64
_BOUNDS = {
    "window": MAX_POSITIONS,
    "hidden_size": 4096,
    "num_heads": 128,
    "num_kv_heads": 128,
    "head_dim": 512,
    "intermediate_size": 16384,
    "vocab_size": 1 << 18,
}
_SEED_MAX = (1 << 63) - 1  # torch.Generator.manual_seed takes a signed 64-bit integer


def _pattern(unit: tuple[str, ...], repeats: int) -> tuple[str, ...]:
    return unit * repeats


PRESETS: dict[str, ModelSpec] = {
    # gpt-oss alternates sliding and full attention, sliding first.
    "gpt-oss-mini": ModelSpec(name="gpt-oss-mini", layer_pattern=_pattern(("swa", "full"), 2), window=8),
    # Gemma 3/4: five sliding layers, then one global.
    "gemma-mini": ModelSpec(
        name="gemma-mini", layer_pattern=_pattern(("swa",) * 5 + ("full",), 1), window=6, head_dim=32
    ),
    "all-swa": ModelSpec(name="all-swa", layer_pattern=("swa",) * 3, window=4),
    # FlashInfer's cells: it has no float32 kernels and its prebuilt kernels take head_dim 64 and up
    "gpt-oss-mini-bf16": ModelSpec(name="gpt-oss-mini-bf16", layer_pattern=_pattern(("swa", "full"), 2), window=8,
                                   head_dim=64, dtype="bfloat16"),
    "gemma-mini-fp16": ModelSpec(name="gemma-mini-fp16", layer_pattern=_pattern(("swa",) * 5 + ("full",), 1),
                                 window=6, head_dim=64, dtype="float16"),
}


def model_spec(preset: str, **overrides: object) -> ModelSpec:
    """A preset with fields replaced; raises KeyError naming the known presets."""
    if preset not in PRESETS:
        raise KeyError(f"unknown model preset {preset!r}; known: {', '.join(sorted(PRESETS))}")
    return dataclasses.replace(PRESETS[preset], **overrides)  # type: ignore[arg-type]


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight`` for a 2-D ``x``: the ``mm`` that ``matmul`` calls, without its dispatch around it."""
    return torch.mm(x, weight)


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x`` with zero rows appended up to ``rows``."""
    extra = rows - x.shape[0]
    if extra == 0:
        return x
    return torch.nn.functional.pad(x, (0, 0) * (x.dim() - 1) + (0, extra))


def row_block(rows: int) -> int:
    return -(-rows // _ROW_BLOCK) * _ROW_BLOCK


# torch.promote_types dispatches an aten op per call; a forward asks it for the same few dtypes
_ACC_DTYPES: dict[torch.dtype, torch.dtype] = {}


def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    """Accumulate in float32 at least; the float64 oracle stays in float64."""
    found = _ACC_DTYPES.get(x.dtype)
    if found is None:
        found = _ACC_DTYPES[x.dtype] = torch.promote_types(x.dtype, torch.float32)
    return found


def _cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # ``x.to(x.dtype)`` returns ``x`` itself; skipping the call skips the capture-time hook on ``Tensor.to``
    return x if x.dtype == dtype else x.to(dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = _cast(x, _acc_dtype(x))
    var = xf.pow(2).mean(-1, keepdim=True)
    return _cast(xf * torch.rsqrt(var + eps), x.dtype) * weight


def rope_cache(head_dim: int, theta: float, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate-half tables [MAX_POSITIONS, head_dim]: ``(cos, cos)`` and ``(-sin, sin)`` along the last dim."""
    half = head_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(half, dtype=torch.float64) / half))
    angles = torch.arange(MAX_POSITIONS, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()
    return (torch.cat((cos, cos), dim=-1).to(device=device, dtype=dtype),
            torch.cat((-sin, sin), dim=-1).to(device=device, dtype=dtype))


def apply_rope(x: torch.Tensor, head_dim: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on [T, H*D]; ``cos`` and ``sin`` [T, 1, D] are the ``rope_cache`` rows at the tokens' positions.

    ``(x1, x2) * (cos, cos) + (x2, x1) * (-sin, sin)`` is ``(x1*cos - x2*sin, x2*cos + x1*sin)`` bit for bit
    (negation is exact and ``a + (-b)`` is ``a - b`` in IEEE arithmetic), in five ops where the halves take ten.
    """
    t = x.shape[0]
    xh = _cast(x.view(t, -1, head_dim), cos.dtype)
    out = xh * cos + xh.roll(head_dim // 2, -1) * sin
    return _cast(out, x.dtype).view(t, -1)


@dataclass(slots=True)
class LayerWeights:
    attn_norm: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    mlp_norm: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor

    def tensors(self) -> list[torch.Tensor]:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]


class SyntheticModel:
    """Weights drawn from ``spec.seed``; ``forward`` runs the layer stack around an injected attention."""

    def __init__(self, spec: ModelSpec, device: torch.device | str = "cpu") -> None:
        self.spec = spec
        self.device = torch.device(device)
        self.dtype = DTYPES[spec.dtype]
        gen = torch.Generator().manual_seed(spec.seed)

        def w(*shape: int) -> torch.Tensor:
            t = torch.randn(*shape, generator=gen, dtype=torch.float32) / shape[0] ** 0.5
            return t.to(device=self.device, dtype=self.dtype)

        def norm(n: int) -> torch.Tensor:
            t = 1.0 + 0.1 * torch.randn(n, generator=gen, dtype=torch.float32)
            return t.to(device=self.device, dtype=self.dtype)

        h, d = spec.hidden_size, spec.head_dim
        self.embed = torch.randn(spec.vocab_size, h, generator=gen).to(device=self.device, dtype=self.dtype)
        self.layers = [
            LayerWeights(
                attn_norm=norm(h),
                wq=w(h, spec.num_heads * d),
                wk=w(h, spec.num_kv_heads * d),
                wv=w(h, spec.num_kv_heads * d),
                wo=w(spec.num_heads * d, h),
                mlp_norm=norm(h),
                w_up=w(h, spec.intermediate_size),
                w_down=w(spec.intermediate_size, h),
            )
            for _ in range(spec.num_layers)
        ]
        self.final_norm = norm(h)
        self.rope_cos, self.rope_sin = rope_cache(
            spec.head_dim, spec.rope_theta, torch.promote_types(self.dtype, torch.float32), self.device
        )

    def cast(self, dtype: torch.dtype) -> "SyntheticModel":
        """The same weights in another dtype (the oracle runs the rounded weights in float64)."""
        twin = object.__new__(SyntheticModel)
        twin.spec, twin.device, twin.dtype = self.spec, self.device, dtype
        twin.embed = self.embed.to(dtype)
        twin.layers = [LayerWeights(*(w.to(dtype) for w in lw.tensors())) for lw in self.layers]
        twin.final_norm = self.final_norm.to(dtype)
        twin.rope_cos, twin.rope_sin = rope_cache(
            self.spec.head_dim, self.spec.rope_theta, torch.promote_types(dtype, torch.float32), self.device
        )
        return twin

    def parameters(self) -> list[torch.Tensor]:
        out = [self.embed, self.final_norm]
        for layer in self.layers:
            out.extend(layer.tensors())
        return out

    def buffers(self) -> list[torch.Tensor]:
        """Constant tensors that are not weights (the RoPE cos/sin cache): graph inputs like the weights."""
        return [self.rope_cos, self.rope_sin]

    def kv_scales(self) -> list[tuple[float, float]]:
        """Per-layer FP8 k/v scales, deterministic in the seed (real checkpoints ship per-layer scales)."""
        gen = torch.Generator().manual_seed(self.spec.seed + 7919)
        raw = 0.01 + 0.02 * torch.rand(self.spec.num_layers, 2, generator=gen)
        return [(float(k), float(v)) for k, v in raw.tolist()]

    def rope_angles(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The RoPE caches at ``positions``, [T, 1, D] each: gathered once per forward, read by every layer."""
        return self.rope_cos[positions][:, None, :], self.rope_sin[positions][:, None, :]

    def project_qkv(
        self, layer_id: int, hidden: torch.Tensor, angles: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pre-norm and the q/k/v projections of one layer, RoPE (``rope_angles``) applied to q and k."""
        lw = self.layers[layer_id]
        x = rms_norm(hidden, lw.attn_norm)
        d = self.spec.head_dim
        q = apply_rope(linear(x, lw.wq), d, *angles)
        k = apply_rope(linear(x, lw.wk), d, *angles)
        v = linear(x, lw.wv)
        return q, k, v

    def finish_layer(self, layer_id: int, hidden: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        lw = self.layers[layer_id]
        hidden = hidden + linear(attn_out, lw.wo)
        x = rms_norm(hidden, lw.mlp_norm)
        return hidden + linear(torch.nn.functional.silu(linear(x, lw.w_up)), lw.w_down)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionFn) -> torch.Tensor:
        """Final hidden states [T, hidden] of the tokens in ``input_ids``.

        Everything but attention runs on rows padded to a whole row block; attention sees the T real rows.
        """
        t = input_ids.shape[0]
        rows = row_block(t)
        hidden = pad_rows(self.embed[input_ids], rows)
        angles = self.rope_angles(pad_rows(positions, rows))
        for layer_id in range(self.spec.num_layers):
            q, k, v = self.project_qkv(layer_id, hidden, angles)
            if t < rows:  # a slice of every row would be the same memory, at the price of three more ops
                q, k, v = q[:t], k[:t], v[:t]
            out = attention(layer_id, q, k, v)
            hidden = self.finish_layer(layer_id, hidden, pad_rows(out, rows))
        out = rms_norm(hidden, self.final_norm)
        return out[:t] if t < rows else out

"""What a model is, as a scenario names it: ``ModelSpec``, its rules and the presets.

Plain data, apart from ``model.py`` which builds and runs the model with torch: loading and listing a
scenario file reads these without importing torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

DTYPE_NAMES = ("float32", "bfloat16", "float16")
"""the model dtypes, by name (``model.DTYPES`` maps them to torch's)"""

# RoPE angles come from a table gathered by position, as serving engines keep a cos/sin cache; a gather
# is exact, where computing cos per batch would round differently per batch shape.
MAX_POSITIONS = 4096

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
        if self.dtype not in DTYPE_NAMES:
            out.append(f"dtype: expected one of {sorted(DTYPE_NAMES)}, got {self.dtype!r}")
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

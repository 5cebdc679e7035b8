"""``python -m harness.gpuci.jit``: FlashInfer's kernel modules for the harness's shapes, built once, in parallel.

FlashInfer compiles a module per (query dtype, KV dtype, head dim, sliding window or not) the first time a
wrapper plans one: inside a test that would bill minutes of nvcc to whichever test came first, under its
time limit, once per xdist worker racing for the same lock. This step builds exactly the modules the
harness's runs use, with one ninja invocation (``MAX_JOBS`` / ``FLASHINFER_JIT_PREBUILD_MAX_JOBS`` bound its
parallelism) into the JIT cache under ``FLASHINFER_WORKSPACE_BASE``, which CI keeps between runs; a cached
module costs nothing. The FlashInfer backend drives only the FA2 paged decode and prefill kernels
(``backends/flashinfer.py`` pins ``backend="fa2"``), so those are the only modules built.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["KernelShape", "harness_kernel_shapes", "main"]

TEST_SHAPE = ("bfloat16", 64)
"""the bfloat16, head_dim 64 copy of a preset that the GPU tests and the benchmark run FlashInfer on (FlashInfer
has no float32 kernels and prebuilt head dims of 64 and up)"""


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class KernelShape:
    kind: str
    """decode or prefill"""
    q_dtype: str
    kv_dtype: str
    """the query's dtype or fp8_e4m3"""
    head_dim: int
    swa: bool
    """planned with a window (``window_left >= 0``)"""


def harness_kernel_shapes(models: Iterable[tuple[str, int, bool, bool]]) -> list[KernelShape]:
    """Every module the harness's runs plan, from (dtype, head_dim, has SWA layers, has full layers) per model:
    both kinds, a pool of the query's dtype and an FP8 one, one module per window group present."""
    shapes = set()
    for dtype, head_dim, has_swa, has_full in models:
        for kind in ("decode", "prefill"):
            for kv in (dtype, "fp8_e4m3"):
                for swa in (flag for flag, present in ((True, has_swa), (False, has_full)) if present):
                    shapes.add(KernelShape(kind=kind, q_dtype=dtype, kv_dtype=kv, head_dim=head_dim, swa=swa))
    return sorted(shapes)


def _library_models() -> list[tuple[str, int, bool, bool]]:
    from ..backends.flashinfer import kernel_problems
    from ..serving.model import PRESETS

    out = []
    for spec in PRESETS.values():
        pattern = set(spec.layer_pattern)
        layers = ("swa" in pattern, "full" in pattern)
        out.append((*TEST_SHAPE, *layers))
        if not kernel_problems(spec, spec.dtype):  # a preset FlashInfer runs as it is
            out.append((spec.dtype, spec.head_dim, *layers))
    return out


def _jit_specs(shapes: Sequence[KernelShape]) -> list:
    import torch
    from flashinfer.jit.attention import modules

    dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16, "fp8_e4m3": torch.float8_e4m3fn}
    specs = []
    for s in shapes:
        q, kv = dtypes[s.q_dtype], dtypes[s.kv_dtype]
        # positional: (q, kv, out, index dtypes, head dims qk/vo, no RoPE in the kernel, window, no soft cap)
        common = (q, kv, q, torch.int32, s.head_dim, s.head_dim, 0, s.swa, False)
        if s.kind == "decode":
            specs.append(modules.gen_batch_decode_module(*common))
        else:
            specs.append(modules.gen_batch_prefill_module("fa2", *common, False))
    return specs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.gpuci.jit",
                                     description="build FlashInfer's kernel modules for the harness's shapes")
    parser.add_argument("--list", action="store_true", help="print the shapes, build nothing (no FlashInfer needed)")
    args = parser.parse_args(argv)
    shapes = harness_kernel_shapes(_library_models())
    if args.list:
        for s in shapes:
            print(f"{s.kind} q={s.q_dtype} kv={s.kv_dtype} head_dim={s.head_dim} {'swa' if s.swa else 'full'}")
        return 0
    try:
        from flashinfer.jit import build_jit_specs
        from flashinfer.jit import env as jit_env
    except ImportError as exc:
        print(f"FlashInfer is not importable: {exc}", file=sys.stderr)
        return 1
    started = time.perf_counter()
    specs = _jit_specs(shapes)
    cached = [s.name for s in specs if s.is_compiled]
    print(f"JIT cache {jit_env.FLASHINFER_JIT_DIR}: {len(specs)} modules, {len(cached)} already built")
    build_jit_specs([s for s in specs if s.name not in cached], verbose=False)
    for s in specs:
        print(f"  {'cached' if s.name in cached else 'built '} {s.name}")
    missing = [s.name for s in specs if not s.is_compiled]
    print(f"JIT build: {time.perf_counter() - started:.1f} s")
    if missing:
        print("not built: " + ", ".join(missing), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

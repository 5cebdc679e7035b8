"""What a KV pool is, as a scenario names it: ``PoolSpec``, its rules, and the vocabulary of its fields.

Plain data, apart from ``pool.py`` which allocates the pools with torch: loading and listing a scenario
file reads these without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass

KV_DTYPES = ("float32", "bfloat16", "float16", "fp8_e4m3")

FREE_ORDERS = ("lowest", "fifo", "lifo")
"""how freed slots (pages) are reused: the lowest free one first (the harness default: a freed slot is
reused at once, which exposes stale writes sooner), the longest free first (SGLang at page size 1: freed
slots join the tail of its free list), or the last freed first (SGLang with pages: freed pages join the head)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSpec:
    full_size: int
    """slots in the full pool, the dummy slot 0 included"""
    swa_size: int
    """slots in the SWA pool, the dummy slot 0 included"""
    kv_dtype: str = "float32"
    """one of KV_DTYPES; fp8_e4m3 is stored as uint8 with per-layer k/v scales"""
    max_context_len: int = 64
    """longest request (prompt plus output) the pool's page tables are sized for"""
    max_running_requests: int = 16
    """rows of req_to_token, the dummy row 0 excluded"""
    page_size: int = 1
    """token slots per page; page 0 of each pool is the dummy page padded rows write to"""
    free_order: str = "lowest"
    """how freed slots are reused: one of FREE_ORDERS"""

    def problems(self) -> list[str]:
        """Every rule the spec breaks, as ``field: what is wrong``."""
        out = [
            f"{name}: expected an integer from {lo} to {hi}, got {getattr(self, name)}"
            for name, (lo, hi) in _POOL_BOUNDS.items()
            if not lo <= getattr(self, name) <= hi
        ]
        if self.kv_dtype not in KV_DTYPES:
            out.append(f"kv_dtype: expected one of {', '.join(map(repr, KV_DTYPES))}, got {self.kv_dtype!r}")
        if self.free_order not in FREE_ORDERS:
            out.append(f"free_order: expected one of {', '.join(map(repr, FREE_ORDERS))}, got {self.free_order!r}")
        if self.page_size not in SUPPORTED_PAGE_SIZES:
            out.append(f"page_size: expected one of {', '.join(map(str, SUPPORTED_PAGE_SIZES))}, got {self.page_size}")
        # full_size and swa_size need not be a multiple of the page: as SGLang's allocator (size // page_size
        # pages), the miniature hands out whole pages only, and a trailing part of a page is no slot
        if not out and (self.max_running_requests + 1) * self.max_context_len > _TABLE_CELLS:
            # req_to_token is allocated whole for every run (and the load-time dry run): bound its size
            out.append(
                f"max_running_requests: (max_running_requests + 1) x max_context_len must stay within "
                f"{_TABLE_CELLS} req_to_token cells, got ({self.max_running_requests} + 1) x {self.max_context_len}"
            )
        return out


# slot 0 of each pool is the dummy padded rows write to, so a usable pool has at least two slots; sizes past
# these are typos for a harness whose models and pools are tiny, and would make every run allocate gigabytes
POOL_SIZE_LIMIT = 1 << 20
_POOL_BOUNDS = {
    "full_size": (2, POOL_SIZE_LIMIT),
    "swa_size": (2, POOL_SIZE_LIMIT),
    "max_context_len": (1, POOL_SIZE_LIMIT),
    "max_running_requests": (1, POOL_SIZE_LIMIT),
}
_TABLE_CELLS = 1 << 22
# SGLang's TRT-LLM MHA backend (the one PR 24138 fixed) runs only with pages of 16, 32 or 64 tokens
SUPPORTED_PAGE_SIZES = (1, 4, 16, 32, 64)

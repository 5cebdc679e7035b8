"""SGLang's real radix tree as the pool invariants read a prefix cache (``invariants.CacheHoldings``).

With prefix sharing, SGLang's own schedule (``schedule.py``) keeps the installed ``UnifiedRadixCache`` with its
full and SWA components. The invariants must check *that* tree's holdings, not a model of it: every token it
keeps, with its full slot (the FULL component's value), what the pool maps that slot to, and whether the SWA
component gave the token's SWA KV up (its value is None: a tombstone). Two derived facts come from the tree's
shape and its locks, as ``prefix_cache.SWARadixCache.cached_tokens`` derives them for the harness's own cache:

* ``read_by``: a request admitted with a matched prefix whose lock still holds the SWA part (SGLang releases it
  early, ``release_swa_prefix_lock``, once the window has moved past the prefix; an insert of the request's own
  tokens moves the lock, ``checkpoint_into_tree``) reads the ``sliding_window_size`` tokens before its match
  end from the tree;
* ``trailing_of``: every leaf's last ``sliding_window_size`` tokens, the only place a later match can end.

The walk reads SGLang's Python tree core (``UnifiedTreeCore``, the one SGLang falls back to without the Rust
toolchain): 0.5.23's Rust core exposes no node walk (its ``root_node`` and ``node_by_id`` raise a
``NotImplementedError``), and its match runs in compiled code a fault cannot patch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..serving.invariants import CachedToken


@dataclass(frozen=True, slots=True)
class Reader:
    """A request whose first queries read its matched prefix from the tree."""

    rid: str
    node_id: int
    """the tree node its match ended on (``req.last_node`` at admission, a node id)"""


@dataclass(slots=True)
class RadixHoldings:
    """What the installed tree holds, walked from its root each time the invariants ask."""

    tree_cache: Any
    """SGLang's ``UnifiedRadixCache`` (enabled, Python tree core)"""
    translate: Callable[[torch.Tensor], torch.Tensor]
    """the stack's full -> SWA translation (the pool's mapping as it stands)"""
    readers: Callable[[], Sequence[Reader]]
    """the requests reading a matched prefix now (the scheduler knows whose lock is the admission one)"""

    def cached_tokens(self) -> list[CachedToken]:
        """Every token the tree holds, parents before children, with its slots as the pool maps them."""
        from sglang.srt.mem_cache.unified_cache.components import ComponentType  # noqa: PLC0415 - lazy SGLang

        full_ct, swa_ct = ComponentType.FULL, ComponentType.SWA
        core = self.tree_cache.tree_core
        root = core.root_node
        nodes = list(_walk(root))
        if not nodes:
            return []
        need = self.tree_cache.sliding_window_size
        read_by: dict[tuple[int, int], list[str]] = {}
        for reader in self.readers():
            for where in _last_tokens(core.node_by_id(reader.node_id), root, need):
                read_by.setdefault(where, []).append(reader.rid)
        trailing: dict[tuple[int, int], list[int]] = {}
        for node, start in nodes:
            if not node.children:
                for where in _last_tokens(node, root, need):
                    trailing.setdefault(where, []).append(start + len(node.key))
        values = [node.component(full_ct).value for node, _ in nodes]
        for (node, start), value in zip(nodes, values):
            if value is None:
                raise ValueError(f"SGLang's radix tree node {node.id} (tokens {start}..) holds no full KV on the "
                                 "device: the adapter runs without HiCache, where every cached node keeps it")
        full = torch.cat([v.to(torch.int64) for v in values])
        swa = iter(self.translate(full).tolist())
        out = []
        for node, start in nodes:
            tombstoned = node.component(swa_ct).value is None
            for i, slot in enumerate(node.component(full_ct).value.tolist()):
                out.append(CachedToken(pos=start + i, full_slot=int(slot), swa_slot=int(next(swa)),
                                       tombstoned=tombstoned, read_by=tuple(read_by.get((node.id, i), ())),
                                       trailing_of=tuple(trailing.get((node.id, i), ()))))
        return out


def _walk(root: Any) -> Iterator[tuple[Any, int]]:
    """Every node but the root with the position it starts at, parents before children."""
    stack = [(child, 0) for child in reversed(list(root.children.values()))]
    while stack:
        node, start = stack.pop()
        yield node, start
        stack.extend((child, start + len(node.key)) for child in reversed(list(node.children.values())))


def _last_tokens(end: Any, root: Any, n: int) -> Iterator[tuple[int, int]]:
    """(node id, offset) of the ``n`` tokens before the end of ``end`` (fewer near the root)."""
    node = end
    while node is not None and node is not root and n > 0:
        for i in range(len(node.key) - 1, -1, -1):
            if n <= 0:
                return
            yield node.id, i
            n -= 1
        node = node.parent

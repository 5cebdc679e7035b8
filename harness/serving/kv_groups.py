"""A serving stack's KV layout, said without naming any engine's pools: its KV groups.

A KV group is a set of layers whose K/V live in one pool of slots, numbered from 0 (the dummy page) to
``size - 1``, with one slot mapping: the slot each token holds in that pool. SGLang's hybrid SWA layout is
two groups, ``full`` (the full-attention layers, slots = ``out_cache_loc``) and ``swa`` (the sliding-window
layers, slots = the full slots translated through ``full_to_swa_index_mapping``); vLLM's hybrid allocator
keeps one group per attention kind and window, each with its own block table. A stack declares its groups
(``ServingStack.kv_groups``) and hands out each live token's slot in each (``ServingStack.group_slots``);
snapshots, the diff, the invariants, the results records and the report key on the groups' names and
read nothing else of the layout.

A group with a window holds a token's slot only while the token is inside its request's eviction window
(``LiveToken.in_window``): evicting frees it, and the diff compares only those tokens' rows there. A group
without one (full attention) holds every token's slot until its request is freed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

HIDDEN = "hidden"
"""what records name a final hidden state's mismatch in place of a group: no group may take the name"""


@dataclass(frozen=True, slots=True, kw_only=True)
class KVGroup:
    """One group of layers sharing a pool of slots and one slot mapping."""

    name: str
    """what records, the diff and the report call it ("full", "swa"); a short identifier"""
    layer_ids: tuple[int, ...]
    """the model's layers whose K/V live here, ascending (may be empty: a pool the model does not use)"""
    window: int | None
    """keys a query of its layers sees, its own included (the widest of its layers'); None for full attention.
    A group with a window gives up a token's slot once the token leaves the window (0 where unknown: a
    bookkeeping-only stack spec)"""
    size: int
    """slots of its pool, the dummy page included"""
    page_size: int = 1
    """token slots per page; page 0 (slots 0 .. page_size - 1) is the dummy page padded rows write to"""
    kv_dtype: str = "float32"
    """the pool's KV dtype (``pool.KV_DTYPES``)"""
    num_kv_heads: int = 1
    head_dim: int = 1
    label: str = ""
    """how prose names it ("SWA" for SGLang's ``swa``); the name when empty"""

    @property
    def title(self) -> str:
        return self.label or self.name

    @property
    def has_window(self) -> bool:
        return self.window is not None

    def problems(self) -> list[str]:
        """Every rule the group breaks, as ``field: what is wrong``."""
        out = []
        if not self.name.isidentifier() or self.name == HIDDEN:
            out.append(f"name: expected an identifier other than {HIDDEN!r}, got {self.name!r}")
        if list(self.layer_ids) != sorted(set(self.layer_ids)) or any(i < 0 for i in self.layer_ids):
            out.append(f"layer_ids: expected distinct ascending layer ids, got {list(self.layer_ids)}")
        if self.window is not None and self.window < 0:
            out.append(f"window: expected a number of keys or None, got {self.window}")
        if self.page_size < 1:
            out.append(f"page_size: expected a positive number of token slots, got {self.page_size}")
        elif self.size < 0 or self.size % self.page_size:
            out.append(f"size: expected a multiple of page_size ({self.page_size}), got {self.size}")
        return out


@dataclass(frozen=True, slots=True)
class KVGroups:
    """A stack's groups in its declared order: the order of ``LiveToken.slots`` and of ``KVBuffers``."""

    groups: tuple[KVGroup, ...]
    _by_name: dict[str, int] = field(init=False, repr=False, compare=False)
    _by_layer: dict[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        problems = [f"{g.name}: {p}" for g in self.groups for p in g.problems()]
        by_name: dict[str, int] = {}
        by_layer: dict[int, int] = {}
        for i, g in enumerate(self.groups):
            if g.name in by_name:
                problems.append(f"{g.name}: two groups have this name")
            by_name.setdefault(g.name, i)
            for layer in g.layer_ids:
                if layer in by_layer:
                    problems.append(f"{g.name}: layer {layer} is already in group {self.groups[by_layer[layer]].name}")
                by_layer.setdefault(layer, i)
        if not self.groups:
            problems.append("expected at least one KV group")
        if problems:
            raise ValueError("KV groups: " + "; ".join(problems))
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_by_layer", by_layer)

    def __iter__(self) -> Iterator[KVGroup]:
        return iter(self.groups)

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, name: str) -> KVGroup:
        return self.groups[self.index(name)]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.groups)

    def index(self, name: str) -> int:
        """The position of group ``name``; KeyError naming the groups there are."""
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no KV group {name!r}; the stack's groups are {', '.join(self.names)}") from None

    def of_layer(self, layer_id: int) -> KVGroup:
        """The group holding ``layer_id``'s K/V; KeyError for a layer no group holds."""
        try:
            return self.groups[self._by_layer[layer_id]]
        except KeyError:
            raise KeyError(f"no KV group holds layer {layer_id}") from None

    def windowed(self) -> tuple[KVGroup, ...]:
        """The groups that give a token's slot up when it leaves the window."""
        return tuple(g for g in self.groups if g.has_window)

    def shown(self) -> tuple[KVGroup, ...]:
        """The groups the model has layers in, windowed ones first (narrowest window first; the pools the
        harness exists for), then the full-attention ones, each in declared order: the report's order."""
        used = [g for g in self.groups if g.layer_ids]
        return tuple(sorted((g for g in used if g.has_window), key=lambda g: g.window or 0)) \
            + tuple(g for g in used if not g.has_window)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupBuffers:
    """One group's K/V buffers, one [slots, Hkv, D] tensor per layer of the group (in ``layer_ids`` order),
    in storage dtype."""

    k: Sequence[torch.Tensor]
    v: Sequence[torch.Tensor]
    log: Sequence[torch.Tensor] | None = None
    """per layer, [slots] int32: the step that last wrote each slot since it was poisoned, -1 for none (the
    pool's write log); None where the stack keeps no log (snapshots then infer writes from changes)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class KVBuffers:
    """What snapshots read of a stack: its groups and each group's buffers, in the groups' order."""

    groups: KVGroups
    buffers: tuple[GroupBuffers, ...]

    def __post_init__(self) -> None:
        if len(self.buffers) != len(self.groups):
            raise ValueError(f"KV buffers: {len(self.buffers)} buffer sets for {len(self.groups)} groups")

    def __getitem__(self, name: str) -> GroupBuffers:
        return self.buffers[self.groups.index(name)]


def hybrid_swa_groups(*, layer_is_swa: Sequence[bool], layer_windows: Sequence[int | None], full_size: int,
                      swa_size: int, page_size: int, kv_dtype: str, num_kv_heads: int,
                      head_dim: int) -> KVGroups:
    """SGLang's hybrid SWA layout as groups: ``full`` (full-attention layers, the full pool) then ``swa``
    (sliding-window layers, the SWA pool), whether or not the model has layers of each kind."""
    windows = [w for w, swa in zip(layer_windows, layer_is_swa) if swa and w is not None]
    common = {"page_size": page_size, "kv_dtype": kv_dtype, "num_kv_heads": num_kv_heads, "head_dim": head_dim}
    return KVGroups((
        KVGroup(name="full", layer_ids=tuple(i for i, swa in enumerate(layer_is_swa) if not swa), window=None,
                size=_whole_pages(full_size, page_size), **common),
        KVGroup(name="swa", layer_ids=tuple(i for i, swa in enumerate(layer_is_swa) if swa),
                window=max(windows, default=0), size=_whole_pages(swa_size, page_size), label="SWA", **common),
    ))


def _whole_pages(size: int, page_size: int) -> int:
    """The slots of a pool's whole pages: a trailing part of a page is never handed out (SGLang's allocator has
    ``size // page_size`` pages), so it is no slot of the group."""
    return size // page_size * page_size

"""The torch-native backend over the window-groups stack: each layer reads its own group's page table,
made from the request's token ids through that group's slot mapping (``stack.group_slots``), where SGLang's
layout translates one SWA table for every sliding layer. Eager only: the graph buffers hold SGLang's two
tables."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from harness.backends.base import AttentionBatch, GraphSupport
from harness.backends.torch_native import (
    TorchNativeBackend,
    TorchNativeImpl,
    TorchNativeMetadata,
    TorchNativeMetadataBuilder,
)


@dataclass(slots=True, kw_only=True)
class GroupTablesMetadata(TorchNativeMetadata):
    group_tables: torch.Tensor
    """[groups, bs, max_context_len] int64: each group's slot of every position (0 where it holds none)"""


class GroupTablesBuilder(TorchNativeMetadataBuilder):
    def build(self, batch: AttentionBatch) -> GroupTablesMetadata:
        md = super().build(batch)
        fields = {f.name: getattr(md, f.name) for f in dataclasses.fields(md)}
        return GroupTablesMetadata(**fields, group_tables=self.stack.group_slots(md.page_table))


class GroupTablesImpl(TorchNativeImpl):
    def _layer_table(self, layer_id: int, md: GroupTablesMetadata) -> torch.Tensor:  # type: ignore[override]
        groups = self.stack.groups
        return md.group_tables[groups.index(groups.of_layer(layer_id).name)]


class WindowGroupsBackend(TorchNativeBackend):
    """Dense masked attention, each layer over its KV group's pages."""

    name = "window_groups_torch_native"
    graph_support = GraphSupport.NONE
    known_faults = frozenset({"window_from_wrong_layer"})
    builder_cls = GroupTablesBuilder
    impl_cls = GroupTablesImpl

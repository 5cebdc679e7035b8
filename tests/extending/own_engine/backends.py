"""Backends of one's own, built on the library's gathering backend as an engine engineer builds on an existing one."""

from __future__ import annotations

from harness.backends.torch_gather import TorchGatherBackend, TorchGatherMetadataBuilder


class _UntranslatedEagerBuilder(TorchGatherMetadataBuilder):
    def _swa_pages(self, pages, p, *, graph):
        # the bug: the eager path hands the SWA layers the full pool's page table as it is (the graph refill
        # translates); SGLang PRs 24617 and 23984 in a backend of one's own
        return super()._swa_pages(pages, p, graph=graph) if graph else pages


class UntranslatedEagerGather(TorchGatherBackend):
    """Reads the SWA pool through untranslated full-pool ids on its eager path only."""

    name = "untranslated_eager_gather"
    builder_cls = _UntranslatedEagerBuilder
    known_faults = TorchGatherBackend.known_faults


class SameGather(TorchGatherBackend):
    """The gathering backend unchanged under another name: correct, judged against the library's reference."""

    name = "same_gather"


class HalvedGather(TorchGatherBackend):
    """Wrong the same way in every mode (its attention output halved), and its own declared reference: only the
    dense oracle, which knows nothing of backends, can tell."""

    name = "halved_gather"
    reference_backend = "tests.extending.own_engine.backends:HalvedGather"

    def forward(self, q, k, v, layer_id, forward_batch):
        return super().forward(q, k, v, layer_id, forward_batch) * 0.5

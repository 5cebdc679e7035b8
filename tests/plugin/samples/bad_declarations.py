"""Third-party plug-ins whose declarations break the contract, one class per kind of break, as a user might
write them by mistake. Tests name them by import path (``bad_declarations:Class``) with this folder on the
path; each must give one line naming the class and the declaration, and error verdicts for its runs only."""

from harness.backends.registry import backend_class
from harness.runners.decode_graph import DecodeGraphRunner
from harness.serving.designs import declare, translate
from harness.serving.eviction import TightEviction
from harness.serving.miniature import MiniatureStack

TorchNative = backend_class("torch_native")


class UnsupportedRaises(TorchNative):
    name = "unsupported_raises"

    @classmethod
    def unsupported(cls, **case):
        raise RuntimeError("cannot tell")


class UnsupportedReturnsNone(TorchNative):
    name = "unsupported_returns_none"

    @classmethod
    def unsupported(cls, **case):
        return None


class NoDevices(TorchNative):
    name = "no_devices"
    devices = frozenset()


class GraphSupportString(TorchNative):
    name = "graph_support_string"
    graph_support = "FULL"


class UnsupportedRaisesOnlyInFull(TorchNative):
    """Keeps the contract for the probe (eager) and breaks it for one mode: the break is per case."""

    name = "unsupported_raises_in_full"

    @classmethod
    def unsupported(cls, *, mode, **case):
        if mode == "full":
            raise ValueError("full mode puzzles me")
        return super().unsupported(mode=mode, **case)


class CoversAList(DecodeGraphRunner):
    """A decode graph runner whose covers are a list, not a tuple of GraphCover."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.covers = list(self.covers)


class KVGroupsADict(MiniatureStack):
    name = "kv_groups_a_dict"

    @classmethod
    def kv_groups(cls, spec):
        return {"full": tuple(range(len(spec.layer_is_swa)))}


class FrontierAFloat(TightEviction):
    name = "frontier_a_float"

    def frontier(self, req):
        return float(super().frontier(req))


@declare(sound="yes", rule="translate in every layer", reference="none")
def sound_as_a_string(forward_batch, pool, metadata, layer_id):
    return translate(forward_batch, pool, metadata, layer_id)


def record_not_a_design(forward_batch, pool, metadata, layer_id):
    return translate(forward_batch, pool, metadata, layer_id)


record_not_a_design.design = {"sound": True}

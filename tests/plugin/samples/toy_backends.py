"""Third-party backends as a user would add them: one module, each a torch-native backend that declares
something different. Tests copy this file beside a scenario and name a class by import path."""

from harness.backends.base import GraphSupport, KVLayout
from harness.backends.registry import backend_class
from harness.runspec import Device, KVWrite

TorchNative = backend_class("torch_native")


class Renamed(TorchNative):
    """The torch-native backend under another name: gives every verdict the torch-native one gives."""

    name = "renamed"


class PiecewiseOnly(TorchNative):
    name = "piecewise_only"
    graph_support = GraphSupport.PIECEWISE_ONLY


class CudaOnly(TorchNative):
    name = "cuda_only"
    devices = frozenset({Device.CUDA})


class NoFaults(TorchNative):
    name = "no_faults"
    known_faults = frozenset()


class LargePagesOnly(TorchNative):
    """Pages of 16 tokens or more, as TRT-LLM's decode kernel wants them."""

    name = "large_pages_only"
    page_sizes = frozenset({16, 32})


class CannotRunAnything(TorchNative):
    """Lacks everything at once, so a case's reasons can be counted."""

    name = "cannot_run_anything"
    devices = frozenset({Device.CUDA})
    graph_support = GraphSupport.NONE
    kv_write_paths = frozenset({KVWrite.PLAIN})
    page_sizes = frozenset({16})
    kv_layouts = frozenset({KVLayout.HND})
    known_faults = frozenset()

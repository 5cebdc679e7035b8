"""Attention backends. ``torch_native`` runs anywhere; a FlashInfer backend needs CUDA."""

from .torch_native import TorchNativeBackend

BACKENDS = {"torch_native": TorchNativeBackend}

__all__ = ["BACKENDS", "TorchNativeBackend"]

"""Attention backends by name. A backend of this package is one module plus one line here; a third-party
one is named by ``package.module:Class`` wherever a name is expected, like a design."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from ..imports import load_named, subclass_of

if TYPE_CHECKING:  # the names are what option errors need; a backend's module (and torch) come with its class
    from .base import AttentionBackend

BACKENDS: dict[str, str] = {
    "torch_native": "harness.backends.torch_native:TorchNativeBackend",
    "torch_gather": "harness.backends.torch_gather:TorchGatherBackend",
    "flashinfer": "harness.backends.flashinfer:FlashInferBackend",
    "trtllm_mha": "harness.backends.trtllm_mha:TrtllmMHABackend",
}


def _is_declared_backend(obj: object) -> str | None:
    from .base import DECLARATIONS, AttentionBackend

    if (why := subclass_of(AttentionBackend)(obj)) is not None:
        return why
    if missing := cast("type[AttentionBackend]", obj).missing_declarations():
        return f"does not declare {', '.join(missing)}; an AttentionBackend declares {', '.join(DECLARATIONS)}"
    return None


def backend_class(name: str) -> type[AttentionBackend]:
    """The backend class a registered name or a ``package.module:Class`` path names; KeyError otherwise."""
    return cast("type[AttentionBackend]", load_named(name, BACKENDS, kind="backend", check=_is_declared_backend))


def reference_backend(name: str) -> str:
    """The backend whose eager run is the reference for runs of backend ``name`` (its declared
    ``reference_backend``, or itself); a name that does not load is its own (its cases are skipped)."""
    try:
        return backend_class(name).reference_backend or name
    except KeyError:
        return name

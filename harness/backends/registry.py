"""Attention backends by name. A backend of this package is one module plus one line here; a third-party
one is named by ``package.module:Class`` wherever a name is expected, like a design."""

from __future__ import annotations

import importlib

from .base import DECLARATIONS, AttentionBackend

BACKENDS: dict[str, str] = {
    "torch_native": "harness.backends.torch_native:TorchNativeBackend",
    "torch_gather": "harness.backends.torch_gather:TorchGatherBackend",
}


def backend_class(name: str) -> type[AttentionBackend]:
    """The backend class a registered name or a ``package.module:Class`` path names; KeyError otherwise."""
    path = BACKENDS.get(name, name)
    module_name, sep, attr = path.partition(":")
    if not sep:
        raise KeyError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}, or 'package.module:Class'")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a module that exits or raises at import is a bad name, not a crash
        raise KeyError(f"backend {name!r} cannot be imported: {type(exc).__name__}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, AttentionBackend)):
        raise KeyError(f"backend {name!r} is not an AttentionBackend subclass")
    if missing := cls.missing_declarations():
        raise KeyError(f"backend {name!r} does not declare {', '.join(missing)}; an AttentionBackend declares "
                       f"{', '.join(DECLARATIONS)}")
    return cls

"""Attention backends by name. A backend of this package is one module plus one line here; a third-party
one is named by ``package.module:Class`` wherever a name is expected, like a design."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from ..declarations import call_hook, expected, is_collection, is_int, owner, tuple_of, values_of
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
    check_declarations(cast("type[AttentionBackend]", obj))
    return None


_CHECKED: set[type] = set()
"""backend classes whose declarations hold (a class is checked once per process)"""


def check_declarations(cls: type[AttentionBackend]) -> None:
    """Every declaration of a backend class has its type and values, and ``unsupported()`` returns reasons;
    DeclarationError (one line naming the class and the declaration) otherwise."""
    if cls in _CHECKED:
        return
    from ..runspec import Device, KVWrite
    from .base import AttentionImpl, AttentionMetadataBuilder, GraphSupport, KVLayout

    at = owner(cls)
    if not isinstance(cls.name, str) or not cls.name:
        raise expected("backend", f"{at}.name", "a non-empty str", cls.name)
    if not isinstance(cls.graph_support, GraphSupport):
        raise expected("backend", f"{at}.graph_support",
                       f"a GraphSupport ({', '.join(s.name for s in GraphSupport)})", cls.graph_support)
    values_of("backend", f"{at}.devices", cls.devices, Device)
    values_of("backend", f"{at}.kv_write_paths", cls.kv_write_paths, KVWrite)
    values_of("backend", f"{at}.kv_layouts", cls.kv_layouts, KVLayout)
    values_of("backend", f"{at}.known_faults", cls.known_faults, _attention_faults(), empty=True)
    sizes = cls.page_sizes
    if sizes is not None and not (is_collection(sizes) and sizes and all(is_int(p) and p > 0 for p in sizes)):
        raise expected("backend", f"{at}.page_sizes", "None (any) or a non-empty set of positive ints", sizes)
    if not (is_int(cls.pad_seq_len) and cls.pad_seq_len > 0):
        raise expected("backend", f"{at}.pad_seq_len", "a positive int", cls.pad_seq_len)
    for attr, base in (("builder_cls", AttentionMetadataBuilder), ("impl_cls", AttentionImpl)):
        value = getattr(cls, attr)
        if not (isinstance(value, type) and issubclass(value, base)):
            raise expected("backend", f"{at}.{attr}", f"a subclass of {base.__name__}", value)
    if cls.reference_backend is not None and not isinstance(cls.reference_backend, str):
        raise expected("backend", f"{at}.reference_backend", "None or a backend's name", cls.reference_backend)
    # the hook every case asks, asked once here for a case it must answer: eager on a device it declares
    unsupported_reasons(cls, mode="eager", device=sorted(cls.devices)[0])
    _CHECKED.add(cls)


def _attention_faults() -> frozenset[str]:
    from ..serving.faults import Component, faults_acting_on

    return faults_acting_on(Component.ATTENTION_BACKEND)


def unsupported_reasons(cls: type[AttentionBackend], **case: object) -> tuple[str, ...]:
    """``cls.unsupported(**case)``, which must return a tuple of reasons (str); DeclarationError otherwise."""
    return call_hook("backend", f"{owner(cls)}.unsupported()", cls.unsupported, **case,  # type: ignore[return-value]
                     returns="a tuple of reasons (str), empty when it can run the case", valid=tuple_of(str))


def backend_class(name: str) -> type[AttentionBackend]:
    """The backend class a registered name or a ``package.module:Class`` path names, its declarations checked
    (``check_declarations``); KeyError otherwise (a DeclarationError for a declaration that does not hold)."""
    return cast("type[AttentionBackend]", load_named(name, BACKENDS, kind="backend", check=_is_declared_backend))


LIBRARY_REFERENCES: tuple[str, ...] = ("torch_native", "torch_gather")
"""the library's own reference backends, in order of preference: the one whose eager run judges a backend
named by import path that declares no ``reference_backend`` is the first that can run the case's geometry"""


def reference_backend(name: str, *, library: bool = True, **case: object) -> str:
    """The backend whose eager run is the reference for runs of backend ``name``: its declared
    ``reference_backend``; else a registered backend itself; else (a backend named by import path, never its
    own judge) the first of ``LIBRARY_REFERENCES`` whose ``unsupported(**case)`` is empty for the reference run's
    ``case`` (device, page size, KV write path, ...), the first of them when none is; itself where ``library``
    is False (a serving stack whose KV groups the library's backends do not serve). A name that does not load
    is its own (its cases are errors or skipped before any reference runs)."""
    try:
        cls = backend_class(name)
    except KeyError:
        return name
    if cls.reference_backend is not None:
        return cls.reference_backend
    if name in BACKENDS or not library:
        return name
    for candidate in LIBRARY_REFERENCES:
        if not case or not unsupported_reasons(backend_class(candidate), **case):
            return candidate
    return LIBRARY_REFERENCES[0]

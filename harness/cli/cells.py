"""What ``python -m harness list`` says of the backends: each one's declaration, how many of the selected cells
it has, and why the ones it cannot run here are skipped (a GPU or FlashInfer missing, a model its kernels do not
take, a fault it has no switch for)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..backends.registry import BACKENDS, backend_class
from ..imports import is_import_path
from ..runspec import Device
from ..check.matrix.case import Case


def added_backends(named: Iterable[str]) -> list[str]:
    """The backends named on a command line that every scenario runs, listed or not: import paths, and the
    registered backends that run on no CPU. The library lists each CPU backend where its fault switches are,
    and leaves GPU backends (FlashInfer's) to be asked for."""
    out = []
    for name in dict.fromkeys(named):
        if name in BACKENDS:
            if Device.CPU not in backend_class(name).devices:
                out.append(name)
        elif is_import_path(name):
            out.append(name)
    return out


def _declared(name: str) -> tuple[str, str, str]:
    try:
        cls = backend_class(name)
    except KeyError as exc:  # an import path that fails to load: its cells say why
        return "-", "-", str(exc.args[0])
    sizes = "any" if cls.page_sizes is None else ",".join(map(str, sorted(cls.page_sizes)))
    return ",".join(sorted(cls.devices)), cls.graph_support.name, sizes


def backend_rows(cells: Sequence[Case], *, registered: Iterable[str] = BACKENDS) -> list[tuple[str, ...]]:
    """One row per backend (every registered one, then those the cells add): where it runs, its graph support,
    its page sizes, its cells among ``cells`` and how many of them are skipped here."""
    names = list(dict.fromkeys([*registered, *(c.backend for c in cells)]))
    rows = []
    for name in names:
        mine = [c for c in cells if c.backend == name]
        skipped = sum(c.unsupported is not None for c in mine)
        rows.append((name, *_declared(name), str(len(mine)), str(skipped)))
    return rows


def skipped_rows(cells: Sequence[Case]) -> list[tuple[str, ...]]:
    """One row per scenario, backend and set of reasons: the skipped cells' count, their modes, and why."""
    groups: dict[tuple[str, str, str], list[Case]] = {}
    for c in cells:
        if c.unsupported is not None:
            groups.setdefault((c.scenario.name, c.backend, c.unsupported), []).append(c)
    return [(scenario, backend, str(len(found)), ",".join(dict.fromkeys(c.mode for c in found)), why)
            for (scenario, backend, why), found in groups.items()]

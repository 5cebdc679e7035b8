"""Runners by name: how batches reach the model in each mode. One of this package is one module plus one
line here; a third-party runner is named by ``package.module:Class`` (``RunSpec.runner``; on the command
line ``--runner MODE=package.module:Class``, under pytest ``--harness-runner``), replacing the mode's own.

The contract a runner keeps (``base.Runner``): ``forward(batch)`` returns the final hidden states of one
forward; ``forward_log()`` says how each completed forward ran; ``observations()`` gives graph statistics
and audit findings (None without graphs). A graph runner also declares ``covers``, the batches its graphs
take (``dispatch.GraphCover``s), and the run's dispatcher hands it those forwards only; a runner without
``covers`` takes every forward. It is built by the classmethod
``for_run(ctx, spec, *, eager)`` from the run's context (model, backend, pools), its ``RunSpec`` (graph
engine, buckets, capture policy, faults) and the eager runner to fall back on; a graph runner makes a fresh
engine of ``spec.engine`` (``graphs.registry.get_engine``).
"""

from __future__ import annotations

from ..imports import load_named, unknown_name
from ..runspec import Mode

RUNNERS: dict[str, str] = {
    Mode.EAGER: "harness.runners.eager:EagerRunner",
    Mode.FULL: "harness.runners.decode_graph:DecodeGraphRunner",
    Mode.PIECEWISE: "harness.runners.piecewise:PiecewisePrefillRunner",
}
"""the built-in runner of each mode"""

GRAPH_RUNNERS: dict[str, tuple[str, ...]] = {
    Mode.EAGER: (),
    Mode.FULL: (Mode.FULL, "harness.runners.draft_graph:DraftGraphRunner", "harness.runners.verify_graph:VerifyGraphRunner",
                "harness.runners.draft_extend_graph:DraftExtendGraphRunner"),
    Mode.PIECEWISE: (Mode.PIECEWISE,),
}
"""the graph runners each mode registers with the dispatcher (``dispatch.py``), by registered name or
``package.module:Class``, first cover first: a runner for another batch shape is one more name here"""


def runner_class(name: str) -> type:
    """The runner class a registered name or ``package.module:Class`` names; KeyError otherwise."""
    return load_named(name, RUNNERS, kind="runner", check=_is_runner_class)  # type: ignore[return-value]


def _is_runner_class(obj: object) -> str | None:
    if not isinstance(obj, type):
        return "is not a class"
    missing = [m for m in ("for_run", "forward", "forward_log", "observations") if not callable(getattr(obj, m, None))]
    return f"lacks the runner contract's {', '.join(missing)}" if missing else None


def runner_option(text: str) -> tuple[str, str]:
    """``MODE=package.module:Class`` (``--runner``, ``--harness-runner``) as (mode, runner); ValueError saying
    what is wrong, a runner that does not import or lacks the contract included, before anything runs."""
    mode, sep, name = text.partition("=")
    if not sep or mode not in tuple(Mode):
        close = f"; {unknown_name('mode', mode, Mode)}" if sep else ""
        raise ValueError(f"expected MODE=package.module:Class, MODE one of {', '.join(map(str, Mode))}, "
                         f"got {text!r}{close}")
    try:
        runner_class(name)
    except KeyError as exc:
        raise ValueError(str(exc.args[0])) from None
    return mode, name

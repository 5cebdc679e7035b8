"""Which input-audit findings bear on a run's first divergence, decided from the run's data.

A divergence is a symptom (``slot 1 of a@11 was not written``); a finding of the graph engine's input
audit is often its cause (``unregistered graph input pool._memo_value``: the graph replays a translation
frozen at capture). A finding is about one captured graph; the first divergent step's forwards say which
graphs that step replayed. A finding of a graph the step replayed is shown beside the divergence; one of
another graph (the bucket-2 graph, when the step replayed bucket 4) is not, and neither is any finding of a
step that replayed nothing (an eager forward reads no captured input). Nothing here reads words: graphs
are joined by the label the runner gave the graph at capture, which its forwards and findings both carry.

The write log says the rest, for every mode (eager runs have no audit): which step, and which of its forwards,
last wrote the slot of the first divergence in the subject's run (``write_cause``). A slot that holds stale
K/V was written by an earlier step's forward, or by none since it was poisoned.
"""

from __future__ import annotations

from dataclasses import dataclass

from .views import CaseView, FindingView, ForwardView


@dataclass(frozen=True, slots=True, kw_only=True)
class Cause:
    """The findings that bear on the first divergence, and the graphs of its step they belong to."""

    step: int
    graphs: tuple[str, ...]
    """labels of the graphs the first divergent step replayed and the findings name, in replay order"""
    findings: tuple[FindingView, ...]


def first_divergence_cause(view: CaseView) -> Cause | None:
    """The audit findings of the graphs replayed at the first divergent step; None when there are none (a
    match, an error, an eager run, a clean audit, a results file written before forwards named their graph)."""
    if view.first is None or view.graph is None or not view.graph.findings:
        return None
    step = next((s for s in view.steps if s.index == view.first.step), None)
    if step is None:
        return None
    replayed = tuple(dict.fromkeys(f.graph for f in step.forwards if f.path == "replay" and f.graph))
    found = tuple(f for f in view.graph.findings if f.graph in replayed)
    if not found:
        return None
    return Cause(step=step.index, graphs=tuple(g for g in replayed if any(f.graph == g for f in found)),
                 findings=found)


def _forward_text(f: ForwardView) -> str:
    if f.path == "replay":
        return f"the replay of {f.graph or f'bucket {f.bucket}'}"
    if f.path == "fallback":
        return f"an eager forward of {f.rows} rows (no bucket fits)"
    return f"an eager forward of {f.rows} rows"


def write_cause(view: CaseView) -> str | None:
    """Which forward of which step left what the first divergent slot holds, by the subject's write log; None
    when there is no KV divergence (a match, an error, a hidden state) or the record predates the write log."""
    first = view.first
    if first is None or first.slot is None or first.pool == "hidden":
        return None
    where = f"{first.pool} slot {first.slot}" + (f" (layer {first.layer})" if first.layer is not None else "")
    if first.written_at is None:
        if first.what == "schedule" or first.classification != "unwritten":
            return None
        return f"nothing wrote {where} since it was poisoned (the write log)"
    step = next((s for s in view.steps if s.index == first.written_at), None)
    if step is None or not step.forwards:
        return f"{where} was last written at step {first.written_at} (the write log)"
    forwards = ", ".join(dict.fromkeys(_forward_text(f) for f in step.forwards))
    when = "this step" if first.written_at == first.step else f"step {first.written_at}"
    return f"{where} was last written at {when} ({step.kind}), by {forwards} (the write log)"

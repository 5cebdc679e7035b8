"""Which input-audit findings bear on a run's first divergence, decided from the run's data.

A divergence is a symptom (``slot 1 of a@11 was not written``); a finding of the graph engine's input
audit is often its cause (``unregistered graph input pool._memo_value``: the graph replays a translation
frozen at capture). A finding is about one captured graph; the first divergent step's forwards say which
graphs that step replayed. A finding of a graph the step replayed is shown beside the divergence; one of
another graph (the bucket-2 graph, when the step replayed bucket 4) is not, and neither is any finding of a
step that replayed nothing (an eager forward reads no captured input). Nothing here reads words: graphs
are joined by the label the runner gave the graph at capture, which its forwards and findings both carry.
"""

from __future__ import annotations

from dataclasses import dataclass

from .views import CaseView, FindingView


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

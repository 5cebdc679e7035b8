"""Terminal renderings: the failure block, the run table, one-line summaries.

Everything that reaches a terminal passes through ``printable``: scenario names, request ids, messages
and ``why`` texts come from files and exceptions, and a control character in them (a colour or title
escape, BEL, a newline forging a pytest ``PASSED`` line) must be shown, not obeyed.
"""

from __future__ import annotations

from collections.abc import Sequence

from .cause import first_divergence_cause
from .views import CaseView, ErrorView, FindingView, GraphView, MismatchView, Tally, fault_split


def printable(text: object, *, keep_newlines: bool = False) -> str:
    """``text`` with every non-printable character escaped (``\\x1b``, ``\\n``, ``\\u2028``)."""
    out = []
    for ch in str(text):
        if ch.isprintable() or (keep_newlines and ch == "\n"):
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    return "".join(out)


ELLIPSIS = "\u2026"


def shorten(text: object, width: int) -> str:
    """``printable(text)`` in at most ``width`` characters, cut with an ellipsis, never inside an escape."""
    pieces = [printable(ch) for ch in str(text)]
    if sum(map(len, pieces)) <= width:
        return "".join(pieces)
    out, used = [], 0
    for piece in pieces:
        if used + len(piece) > width - len(ELLIPSIS):
            break
        out.append(piece)
        used += len(piece)
    return "".join(out) + ELLIPSIS


def where(m: MismatchView) -> str:
    if m.pool == "hidden":
        return f"step {m.step}, hidden state of {printable(m.owner)}"
    layer = f", layer {m.layer}" if m.layer is not None else ""  # a schedule record names no layer
    return f"step {m.step}, {m.pool} pool{layer}, slot {m.slot} (owner {printable(m.owner)})"


def summary(view: CaseView) -> str:
    """The observed verdict in one line."""
    if view.skip_reason is not None:
        return f"skipped: {printable(view.skip_reason)}"
    if view.error is not None:
        at = f" at step {view.error.step}" if view.error.step is not None else ""
        return f"error{at}: {printable(view.error.type)}: {printable(view.error.message)}"
    if view.verdict == "diverge" and view.first is not None:
        f = view.first
        return (f"diverge: first at {where(f)}: {f.classification} ({printable(f.detail)}); "
                f"{view.mismatches} mismatches over {view.mismatched_slots} slots")
    return view.verdict


def first_divergence(view: CaseView, width: int = 90) -> str:
    """The table's last column: the first divergence, or the error."""
    if view.error is not None:
        return shorten(f"{view.error.type}: {view.error.message}", width)
    if view.skip_reason is not None:
        return shorten(view.skip_reason, width)
    if view.first is not None:
        return f"{where(view.first)}: {view.first.classification}"
    return ""


FRAMES_TITLE = "raised at, innermost last (the harness's own machinery left out)"
"""the heading of an error's frames, in the terminal and on a scenario page"""


def frame_lines(error: ErrorView) -> list[str]:
    """Where the error was raised, one ``file:line in function`` per frame, outermost first (``file in
    Class.method`` for the harness's own frames, which are keyed by function, line 0)."""
    return [f"{printable(f.file)}{f':{f.line}' if f.line else ''} in {printable(f.function)}" for f in error.frames]


def graph_lines(graph: GraphView) -> list[str]:
    out = [f"{graph.captures} graphs captured, {graph.replays} replays ({graph.padded_replays} padded), "
           f"{graph.eager_fallbacks} eager fallbacks"]
    out.extend(finding_line(f) for f in graph.findings)
    if graph.rerun_ops:
        out.append("replayed by calling them again (their kernels are invisible to the dispatcher): "
                   + ", ".join(map(printable, graph.rerun_ops)))
    out.extend(f"note: {printable(n)}" for n in graph.notes)
    return out


def finding_line(f: FindingView) -> str:
    path = printable(f.path) if f.path else "<no attribute path>"
    label = printable(f.graph)
    if f.kind == "unregistered":
        return f"{label}: unregistered graph input {path} {f.dtype}{list(f.shape)}"
    if f.kind == "moved":
        return (f"{label}: {path} moved at {f.replays} replay(s): the graph still reads the memory it captured "
                f"({printable(f.captured)}); now {printable(f.now)}")
    return (f"{label}: stale input {path} at {f.replays} replay(s): the graph still reads the tensor captured from "
            f"it ({printable(f.captured)}), nothing refreshes it; it now holds {printable(f.now)}")


def failure_block(view: CaseView) -> str:
    """The block a failing case prints: expected vs observed, where it first diverged, how to reproduce."""
    head = f"{printable(view.name)}: expected {view.expected}, observed {view.verdict}"
    if view.unexpected_pass:
        head = (f"UNEXPECTED PASS {head}. The known bug no longer reproduces: if a fix landed, update the "
                f"expectation and its why in the scenario file")
    # a multi-line why keeps its lines, indented under the heading; other control characters stay escaped
    why = printable(view.why, keep_newlines=True).replace("\n", "\n    ")
    lines = [head, f"  why expected: {why}"]
    if view.faults:
        lines.append(f"  faults: {', '.join(view.faults)}")
    lines.append(f"  observed: {summary(view)}")
    if (cause := first_divergence_cause(view)) is not None:
        lines.append(f"  cause: the input audit of the graph{'s' if len(cause.graphs) > 1 else ''} "
                     f"step {cause.step} replayed ({', '.join(map(printable, cause.graphs))}) found:")
        lines.extend(f"    {finding_line(f)}" for f in cause.findings)
    if view.error is not None and view.error.frames:
        lines.append(f"  {FRAMES_TITLE}:")
        lines.extend(f"    {line}" for line in frame_lines(view.error))
    if view.mismatches:
        classes = ", ".join(f"{name} {n}" for name, n in view.classes)
        lines.append(f"  {view.mismatches} mismatches over {view.mismatched_slots} slots ({classes}); "
                     f"dummy-slot writes: {view.dummy_writes}")
        for m in view.details[1:4]:
            lines.append(f"    also: {where(m)}: {m.classification} ({printable(m.detail)})")
    if view.graph is not None:
        lines.extend(f"  graph: {line}" for line in graph_lines(view.graph))
    lines.append(f"  reproduce: {view.reproduce_pytest}   or   {view.reproduce_cli}")
    return "\n".join(lines)


def failure_blocks(views: Sequence[CaseView]) -> str:
    """The failure block of every unexpected run, as pytest shows each (the CLI prints them after its table)."""
    return "\n\n".join(failure_block(v) for v in views if not v.ok)


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns; the last column is not padded."""
    rows = [[printable(c) for c in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    return "\n".join("  ".join([c.ljust(w) for c, w in zip(r, widths)] + [r[-1]]).rstrip() for r in rows)


def run_table(views: Sequence[CaseView]) -> str:
    rows = [(v.name, v.expected, v.verdict, "" if v.ok else "UNEXPECTED", first_divergence(v)) for v in views]
    return table(("run", "expected", "observed", "", "first divergence / error"), rows)


def totals_line(views: Sequence[CaseView], load_errors: int = 0) -> str:
    skipped = sum(v.skip_reason is not None for v in views)
    bad = sum(not v.ok for v in views)
    ran = len(views) - skipped
    line = f"{len(views)} runs: {ran - bad} as expected, {bad} unexpected"
    if skipped:
        line += f", {skipped} skipped"
    return line + f", {load_errors} scenario files failed to load"


def fault_split_line(views: Sequence[CaseView]) -> str | None:
    """The totals apart: runs with no fault injected (a design's own bugs show here) and runs under the
    library's injected faults; None when no run injects one."""
    if not any(v.faults for v in views):
        return None
    split = fault_split(views)
    clean, faulted = split["clean"], split["injected_faults"]

    def part(t: Tally) -> str:
        return f"{t.as_expected} as expected, {t.unexpected} unexpected" + (f", {t.skipped} skipped" if t.skipped else "")
    return f"clean runs (no fault injected): {part(clean)}; under the library's injected faults: {part(faulted)}"


def progress_line(done: int, total: int, view: CaseView, width: int | None = None) -> str:
    """``[done/total] name: verdict (mark)``, shortened to ``width`` when given (a terminal's status line)."""
    mark = "skipped" if view.skip_reason is not None else ("ok" if view.ok else "UNEXPECTED")
    line = f"[{done}/{total}] {view.name}: {view.verdict} ({mark})"
    return printable(line) if width is None else shorten(line, width)

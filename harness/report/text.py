"""Terminal renderings: the failure block, the run table, one-line summaries.

Everything that reaches a terminal passes through ``printable``: scenario names, request ids, messages
and ``why`` texts come from files and exceptions, and a control character in them (a colour or title
escape, BEL, a newline forging a pytest ``PASSED`` line) must be shown, not obeyed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import TextIO

from .cause import first_divergence_cause, write_cause
from .views import CaseView, ErrorView, FindingView, GraphView, MismatchView, Tally, fault_split


def printable(text: object, *, keep_newlines: bool = False) -> str:
    """``text`` with every non-printable character escaped (``\\x1b``, ``\\n``, ``\\u2028``)."""
    text = str(text)
    # nearly every string is printable whole: one check in C instead of one per character
    if text.isprintable() or (keep_newlines and text.replace("\n", "").isprintable()):
        return text
    out = []
    for ch in text:
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
                f"{view.mismatches} mismatches over {view.mismatched_slots} slots{_schedule(view)}")
    return f"{view.verdict}{_schedule(view)}"


def _schedule(view: CaseView) -> str:
    if view.schedule_note is None:
        return ""
    return (f" (another schedule than the reference's from {printable(view.schedule_note)}; every live token "
            f"compared where its own run keeps it)")


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
STOPPED_TITLE = ("stopped at, innermost last (its main thread when the time limit ran out; the harness's own "
                 "machinery left out)")
"""the heading of a timed-out run's frames"""


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
    if view.unexpected_pass and view.added_design:  # its expectation is borrowed: the scenario file is not wrong
        head = (f"UNEXPECTED PASS {head}, the expectation taken for a design the scenario does not list: "
                f"--expect states another")
    elif view.unexpected_pass:
        head = (f"UNEXPECTED PASS {head}. The known bug no longer reproduces: if a fix landed, update the "
                f"expectation and its why in the scenario file")
    # a multi-line why keeps its lines, indented under the heading; other control characters stay escaped
    why = printable(view.why, keep_newlines=True).replace("\n", "\n    ")
    lines = [head, f"  why expected: {why}"]
    if view.judged_by is not None:
        lines.append(f"  judged against: {printable(view.judged_by)}")
    if view.faults:
        lines.append(f"  faults: {', '.join(view.faults)}")
    lines.append(f"  observed: {summary(view)}")
    if (cause := first_divergence_cause(view)) is not None:
        lines.append(f"  cause: the input audit of the graph{'s' if len(cause.graphs) > 1 else ''} "
                     f"step {cause.step} replayed ({', '.join(map(printable, cause.graphs))}) found:")
        lines.extend(f"    {finding_line(f)}" for f in cause.findings)
    if (written := write_cause(view)) is not None:
        lines.append(f"  written: {printable(written)}")
    if view.error is not None and view.error.frames:
        lines.append(f"  {STOPPED_TITLE if view.error.type == 'Timeout' else FRAMES_TITLE}:")
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


def table(header: Sequence[str], rows: Sequence[Sequence[object]], *, width: int | None = None) -> str:
    """Left-aligned columns; the last column is not padded. With ``width``, a table wider than that narrows
    its widest columns (never below a header, never the first, which names the row) and wraps their cells after a comma, semicolon or space onto
    continuation lines whose other cells are blank."""
    cells = [[printable(c) for c in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    if width is not None:
        floors = [widths[0], *(max(len(h), _MIN_COLUMN) for h in cells[0][1:])]
        while sum(widths) + 2 * (len(widths) - 1) > width:
            i = max(range(len(widths)), key=lambda j: widths[j] - floors[j])
            if widths[i] <= floors[i]:
                break  # as narrow as it goes: the header's row is wider than the table may be
            widths[i] -= 1
    lines = []
    for row in cells:
        parts = [_wrap(c, w) for c, w in zip(row, widths)]
        for k in range(max(map(len, parts))):
            line = [p[k] if k < len(p) else "" for p in parts]
            lines.append("  ".join([c.ljust(w) for c, w in zip(line[:-1], widths)] + [line[-1]]).rstrip())
    return "\n".join(lines)


_MIN_COLUMN = 8


def record(name: str, fields: Sequence[tuple[str, str]], *, width: int) -> str:
    """``name`` on a line of its own, then its ``key: value`` fields packed onto indented lines of at most
    ``width`` (a value too long for one line wraps after a separator): for rows whose cells together are far
    wider than a terminal. A field with an empty value is left out."""
    indent = "    "
    lines, line = [printable(name)], ""
    for key, value in fields:
        if not value:
            continue
        text = f"{key}: {printable(value)}"
        if line and len(indent) + len(line) + 2 + len(text) <= width:
            line += "  " + text
            continue
        if line:
            lines.append(indent + line)
        parts = _wrap(text, width - len(indent))
        lines.extend(indent + p for p in parts[:-1])
        line = parts[-1]
    if line:
        lines.append(indent + line)
    return "\n".join(lines)


def _wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width``, broken after a separator where one is near (else anywhere)."""
    if len(text) <= width:
        return [text]
    lines, line = [], ""
    for piece in re.findall(r"[^,; ]*[,; ]*", text):
        while len(line) + len(piece.rstrip()) > width:
            if line.strip():
                lines.append(line.rstrip())
                line, piece = "", piece.lstrip()
            else:  # one piece wider than the column: cut it
                lines.append(piece[:width])
                piece = piece[width:]
        line += piece
    if line.strip():
        lines.append(line.rstrip())
    return lines


def run_table(views: Sequence[CaseView], *, colour: bool = False) -> str:
    """One row per run; ``colour``: its UNEXPECTED mark in red (a terminal's, ``wants_colour``)."""
    rows = [(v.name, v.expected, v.verdict, _mark(v), first_divergence(v)) for v in views]
    text = table(("run", "expected", "observed", "", "first divergence / error"), rows)
    if not colour:
        return text
    # the mark's column, found by position (a name or an error could hold the word too)
    header, *lines = text.split("\n")
    at = header.index("observed") + max(len(printable(c)) for c in ("observed", *(v.verdict for v in views))) + 2
    mark = "UNEXPECTED"
    return "\n".join([header, *(line[:at] + paint(mark, RED) + line[at + len(mark):]
                                if not v.ok and line[at:at + len(mark)] == mark else line
                                for line, v in zip(lines, views))])


def _mark(view: CaseView) -> str:
    if view.information and view.skip_reason is None:
        return "fault reaches it" if view.verdict != "match" else "fault misses it"
    return "" if view.ok else "UNEXPECTED"


RED, GREEN = "31", "32"
"""SGR colour codes"""


def paint(text: str, colour: str) -> str:
    """``text`` in a terminal colour (one of the SGR codes above), reset after it."""
    return f"\033[{colour}m{text}\033[0m"


def wants_colour(stream: TextIO, environ: Mapping[str, str] = os.environ) -> bool:
    """Colour for a terminal only: never into a pipe or a file, nor under NO_COLOR set to anything but empty
    (https://no-color.org)."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty()) and not environ.get("NO_COLOR")


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


def information_line(views: Sequence[CaseView]) -> str | None:
    """What the runs without a known verdict (an added design under a fault scenario's faults) say: whether the
    fault reached the design; None when there are none."""
    info = [v for v in views if v.information and v.skip_reason is None]
    if not info:
        return None
    reached = sum(v.verdict != "match" for v in info)
    one = len(info) == 1
    return (f"{len(info)} run{'' if one else 's'} of added designs under injected faults {'has' if one else 'have'} no "
            f"known verdict and count{'s' if one else ''} as expected (information): the fault reached the design in {reached} "
            f"(not a match), not in {len(info) - reached} (a match); their faults-off reruns are judged, and "
            f"--expect states a verdict for them instead")


def progress_line(done: int, total: int, view: CaseView, width: int | None = None, *,
                  left_s: float | None = None) -> str:
    """``[done/total, about 1m05s left] name: verdict (mark)``, shortened to ``width`` when given (a terminal's
    status line); ``left_s``, the estimated seconds left, is shown when given."""
    mark = "skipped" if view.skip_reason is not None else (
        "information" if view.information else "ok" if view.ok else "UNEXPECTED")
    left = "" if left_s is None else f", about {duration_text(left_s)} left"
    line = f"[{done}/{total}{left}] {view.name}: {view.verdict} ({mark})"
    return printable(line) if width is None else shorten(line, width)


def duration_text(seconds: float) -> str:
    """``45s``, ``3m05s``, ``1h02m``: a duration as a person reads it at a glance."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def time_left(elapsed_s: float, finished: int, remaining: int) -> float | None:
    """Seconds left at the pace so far (runs at a time included, as they shorten the elapsed time alike);
    None before the first run finishes, when there is no pace to go by."""
    if finished <= 0:
        return None
    return elapsed_s / finished * remaining

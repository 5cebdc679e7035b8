"""Renderings of ``make bench`` results: the terminal table and the section of BENCHMARKS.md."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..bench_rows import CAPTURE_GOAL_MS, REPLAY_GOALS, BenchRow, DiffBenchRow
from .files import write_atomic
from .text import table

BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"

_INTRO = """# Benchmarks

`python -m harness.bench` (or `make bench`) times, for every model preset and graph bucket, one forward
through a graph runner (decode graphs: static-buffer fill, backend replay-metadata hook and replay;
piecewise prefill graphs: fill, metadata and replay with attention as an eager island) against
`EagerRunner.forward` on an identical batch over the same model, backend and KV pool, and the capture of
that bucket's graph (warm-up included). Eager and replay calls alternate, so drift hits both alike; the
ratio column is the median of the per-pair ratios, with the 10th and 90th percentiles beside it.

The goals (a graph exists to remove per-step overhead): replay at most 0.6x eager for a decode graph and
0.8x for a prefill graph (its attention stays an eager island), in every row, and a capture of at most 15 ms;
a row above its replay goal says `no` in the `goal` column. These numbers are measurements of one machine,
never test assertions. The section below is rewritten on every run.
"""

_HEADER = ("preset", "kind", "bucket", "real", "engine", "eager ms", "replay ms", "replay/eager", "p10-p90",
           "capture ms", "goal")


def _cells(row: BenchRow) -> tuple[str, ...]:
    return (row.preset, row.kind, str(row.bucket), str(row.real), f"{row.engine}/{row.device}",
            f"{row.eager_ms:.3f}", f"{row.replay_ms:.3f}", f"{row.ratio:.2f}",
            f"{row.ratio_p10:.2f}-{row.ratio_p90:.2f}", f"{row.capture_ms:.1f}", "yes" if row.ok else "no")


def _goals_line(rows: Sequence[BenchRow]) -> str:
    slow, long = sum(not r.ok for r in rows), sum(not r.capture_ok for r in rows)
    goals = ", ".join(f"{kind} <= {goal:g}x eager" for kind, goal in REPLAY_GOALS.items())
    return (f"{len(rows)} rows, {slow} above their replay goal ({goals}), {long} with a capture above "
            f"{CAPTURE_GOAL_MS:g} ms")


def render_markdown(rows: Sequence[BenchRow], info: dict[str, str]) -> str:
    lines = ["## Latest run", ""]
    lines += [f"- {key}: {value}" for key, value in info.items()]
    lines += ["", f"{_goals_line(rows)} (`goal` = no: the replay's).", ""]
    lines.append("| " + " | ".join(_HEADER) + " |")
    lines.append("|" + "|".join("---:" if h.endswith(("ms", "eager", "bucket", "real", "p90")) else "---"
                                for h in _HEADER) + "|")
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


DIFF_BEGIN = "<!-- bench-diff:begin -->"
DIFF_END = "<!-- bench-diff:end -->"


def write_section(path: Path, section: str, *, begin: str = BEGIN, end_marker: str = END) -> None:
    """Put ``section`` between a pair of bench markers of ``path``, leaving the rest of the file as it is."""
    block = f"{begin}\n{section.rstrip()}\n{end_marker}\n"
    text = path.read_text() if path.exists() else _INTRO
    start = text.find(begin)
    end = text.find(end_marker, start + len(begin)) if start >= 0 else -1
    if start >= 0 and end >= 0:
        tail = text[end + len(end_marker):]
        text = text[:start] + block + (tail[1:] if tail.startswith("\n") else tail)
    else:
        text = text.rstrip("\n") + "\n\n" + block
    write_atomic(path, text)


def render_terminal(rows: Sequence[BenchRow], info: dict[str, str]) -> str:
    lines = [f"{key}: {value}" for key, value in info.items()]
    lines += ["", table(_HEADER, [_cells(r) for r in rows]), ""]
    lines.append(f"{_goals_line(rows)} (measured, not asserted)")
    return "\n".join(lines)


def render_diff_markdown(rows: Sequence[DiffBenchRow], machine: str | None = None) -> str:
    """The rows as a markdown table, with the cache geometry above it."""
    if not rows:
        return ""
    first = rows[0]
    lines = [
        f"Cache {first.cache_bytes / 2**20:.0f} MiB per snapshot (both pools, every layer, K and V), "
        f"{first.live_slots} live (pool, slot) pairs per step, {max(r.steps for r in rows)} steps per run"
        + (f"; {machine}" if machine else "") + ".",
        "",
        "| case | slots found | bad rows | seconds | vs copy | vs clone | peak MiB | peak / snapshot | judge s "
        "| judge / diff |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        peak = "n/a" if r.peak_bytes is None else f"{r.peak_bytes / 2**20:.0f}"
        share = "n/a" if r.peak_bytes is None else f"{r.peak_bytes / r.cache_bytes:.2f}"
        judge = "" if r.judge_seconds is None else f"{r.judge_seconds:.3f}"
        judge_share = "" if r.judge_seconds is None else f"{r.judge_seconds / r.seconds:.2f}x"
        lines.append(
            f"| {r.case} | {r.found_slots} | {r.mismatches} | {r.seconds:.3f} | {r.vs_copy:.2f}x | "
            f"{r.vs_clone:.2f}x | {peak} | {share} | {judge} | {judge_share} |"
        )
    return "\n".join(lines) + "\n"

"""``python -m harness bench``: graph replay time against eager time, per model preset and bucket.

A captured graph exists to remove per-step overhead, so replaying it should cost no more than the eager
forward it replaces. This module measures both on identical batches and identical pool state:

* decode graphs (``mode="full"``): ``DecodeGraphRunner.forward`` on a decode batch of exactly ``bucket``
  requests (and, where the bucket is above 1, of ``bucket - 1`` requests padded into it), which includes
  filling the static buffers, the backend's replay-metadata hook and the replay: what an engine pays per
  decode step;
* piecewise prefill graphs (``mode="piecewise"``): ``PiecewisePrefillRunner.forward`` on one extend batch
  of exactly ``bucket`` tokens.

Each is compared with ``EagerRunner.forward`` built over the same model, backend and pool. Repeated
forwards on one batch are idempotent (the KV writes rewrite the same slots with the same values), so one
batch is timed over and over. The numbers are measurements, never assertions: a row where replay is slower
than eager is flagged in the ``ok`` column, and the command still succeeds.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .check.run import GraphSpec, RunSpec, Session, build_session
from .runners import EagerRunner, Runner, run_batch
from .serving.batch import ForwardBatch
from .serving.model import PRESETS, model_spec
from .serving.pool import PoolSpec
from .serving.timeline import RequestSpec, TimelineSpec

__all__ = ["BenchRow", "DECODE_BUCKETS", "PREFILL_BUCKETS", "measure", "render_markdown", "run_bench",
           "write_section"]

DECODE_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16)
PREFILL_BUCKETS: tuple[int, ...] = (16, 32, 64)
BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"
_WARMUP = 3

# Big enough for 16 requests of up to ~2W+16 tokens each without the allocator running dry; the
# page-table width (max_context_len) stays at the harness default so the attention kernel reads the
# same number of columns as in every scenario run.
_POOL = PoolSpec(full_size=1024, swa_size=1024, max_context_len=64, max_running_requests=16)

_INTRO = """# Benchmarks

`python -m harness bench` (or `make bench`) times, for every model preset and graph bucket, one forward
through a graph runner (decode graphs: static-buffer fill, backend replay-metadata hook and replay;
piecewise prefill graphs: fill, metadata and replay with attention as an eager island) against
`EagerRunner.forward` on an identical batch over the same model, backend and KV pool. Each time is the
median of `--repeats` timed calls after a short warm-up.

These numbers are measurements of one machine, not test assertions: a row whose replay is slower than
eager is flagged `no` in the `ok` column and the command still succeeds. The section below is rewritten
on every run.
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchRow:
    preset: str
    kind: str
    """"decode" (full decode graph) or "prefill" (piecewise prefill graph)"""
    bucket: int
    """captured bucket: batch size for decode, token count for prefill"""
    real: int
    """real rows (decode) or tokens (prefill) in the batch; below ``bucket`` when padded"""
    engine: str
    device: str
    eager_ms: float
    replay_ms: float

    @property
    def ratio(self) -> float:
        return self.replay_ms / self.eager_ms

    @property
    def ok(self) -> bool:
        """Replay is at least as fast as the eager forward it replaces."""
        return self.ratio <= 1.0


# ---- building the batches ---------------------------------------------------------------------------


def _spec(preset: str, timeline: TimelineSpec, *, mode: str, graphs: GraphSpec, engine: str, device: str) -> RunSpec:
    return RunSpec(model=model_spec(preset), pool=_POOL, timeline=timeline, mode=mode, engine=engine,
                   device=device, graphs=graphs)


def _eager_over(session: Session) -> EagerRunner:
    # the same model, backend and pool objects as the graph runner, so both paths do identical work
    return EagerRunner(model=session.model, backend=session.backend, pool=session.pool)


def _decode_case(preset: str, bucket: int, real: int, engine: str, device: str) -> tuple[Runner, EagerRunner, ForwardBatch]:
    window = model_spec(preset).window
    # prompts past the window and of different lengths: SWA slots are already evicted and the page
    # table rows differ, as in a real decode batch
    requests = tuple(RequestSpec(rid=f"r{i}", prompt_len=window + 1 + i, output_len=2) for i in range(real))
    session = build_session(_spec(preset, TimelineSpec(requests=requests, seed=31), mode="full",
                                  graphs=GraphSpec(decode_buckets=(bucket,)), engine=engine, device=device))
    eager = _eager_over(session)
    while (step := session.scheduler.next_step()) is not None and step.kind != "decode":
        run_batch(eager, step.batch)
        session.scheduler.finish_step()  # frees the SWA slots of tokens that left the window
    if step is None or step.batch.batch_size != real:
        raise RuntimeError(f"{preset}: expected a decode batch of {real} requests, got {step}")
    return session.runner, eager, step.batch


def _prefill_case(preset: str, bucket: int, engine: str, device: str) -> tuple[Runner, EagerRunner, ForwardBatch]:
    timeline = TimelineSpec(requests=(RequestSpec(rid="p", prompt_len=bucket, output_len=0),), seed=32)
    session = build_session(_spec(preset, timeline, mode="piecewise", graphs=GraphSpec(prefill_buckets=(bucket,)),
                                  engine=engine, device=device))
    step = session.scheduler.next_step()
    if step is None or step.kind != "extend" or step.batch.num_tokens != bucket:
        raise RuntimeError(f"{preset}: expected an extend batch of {bucket} tokens, got {step}")
    return session.runner, _eager_over(session), step.batch


# ---- timing -----------------------------------------------------------------------------------------


def _timed(fn: Callable[[], object], sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - start) * 1e3


def _compare(
    graph: Runner, eager: EagerRunner, batch: ForwardBatch, *, repeats: int, warmup: int, device: str
) -> tuple[float, float]:
    """Median eager and graph milliseconds; calls alternate so drift (clock, cache) hits both alike."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(warmup):
        eager.forward(batch)
        graph.forward(batch)
    eager_ms, graph_ms = [], []
    for _ in range(max(1, repeats)):
        eager_ms.append(_timed(lambda: eager.forward(batch), sync))
        graph_ms.append(_timed(lambda: graph.forward(batch), sync))
    return statistics.median(eager_ms), statistics.median(graph_ms)


def _targets() -> list[tuple[str, str]]:
    """(engine, device) pairs this machine can measure: the tape on CPU always, real graphs where CUDA is."""
    out = [("tape", "cpu")]
    if torch.cuda.is_available():
        out.append(("cuda", "cuda"))
    return out


def measure(
    *,
    presets: Sequence[str] | None = None,
    decode_buckets: Sequence[int] = DECODE_BUCKETS,
    prefill_buckets: Sequence[int] = PREFILL_BUCKETS,
    repeats: int = 20,
    warmup: int = _WARMUP,
    padded: bool = True,
    targets: Sequence[tuple[str, str]] | None = None,
    progress: Callable[[BenchRow], None] | None = None,
) -> list[BenchRow]:
    """One row per (target, preset, graph kind, bucket[, padded]); ``targets`` defaults to what is available."""
    rows: list[BenchRow] = []
    for engine, device in targets or _targets():
        for preset in presets or tuple(PRESETS):
            cases: list[tuple[str, int, int]] = []
            for bucket in decode_buckets:
                cases.append(("decode", bucket, bucket))
                if padded and bucket > 1:
                    cases.append(("decode", bucket, bucket - 1))
            cases.extend(("prefill", bucket, bucket) for bucket in prefill_buckets)
            for kind, bucket, real in cases:
                if kind == "decode":
                    graph, eager, batch = _decode_case(preset, bucket, real, engine, device)
                else:
                    graph, eager, batch = _prefill_case(preset, bucket, engine, device)
                eager_ms, replay_ms = _compare(graph, eager, batch, repeats=repeats, warmup=warmup, device=device)
                row = BenchRow(preset=preset, kind=kind, bucket=bucket, real=real, engine=engine, device=device,
                               eager_ms=eager_ms, replay_ms=replay_ms)
                rows.append(row)
                if progress is not None:
                    progress(row)
    return rows


# ---- reporting --------------------------------------------------------------------------------------

_HEADER = ("preset", "kind", "bucket", "real", "engine", "eager ms", "replay ms", "replay/eager", "ok")


def _cells(row: BenchRow) -> tuple[str, ...]:
    return (row.preset, row.kind, str(row.bucket), str(row.real), f"{row.engine}/{row.device}",
            f"{row.eager_ms:.3f}", f"{row.replay_ms:.3f}", f"{row.ratio:.2f}", "yes" if row.ok else "no")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _machine_info(targets: Sequence[tuple[str, str]], repeats: int) -> dict[str, str]:
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count() or "unknown"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch threads": str(torch.get_num_threads()),
        # other processes on a small machine skew wall-clock times (and oversubscribe torch's threads)
        "load average at start": " / ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a",
        "engine/device": ", ".join(f"{e}/{d}" for e, d in targets),
        "repeats": f"{repeats} (median), {_WARMUP} warm-up calls",
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def render_markdown(rows: Sequence[BenchRow], info: dict[str, str]) -> str:
    lines = ["## Latest run", ""]
    lines += [f"- {key}: {value}" for key, value in info.items()]
    slow = sum(not r.ok for r in rows)
    lines += ["", f"{len(rows)} rows, {slow} with replay slower than eager (`ok` = no).", ""]
    lines.append("| " + " | ".join(_HEADER) + " |")
    lines.append("|" + "|".join("---:" if h.endswith(("ms", "eager", "bucket", "real")) else "---" for h in _HEADER) + "|")
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_section(path: Path, section: str) -> None:
    """Put ``section`` between the bench markers of ``path``, leaving the rest of the file as it is."""
    block = f"{BEGIN}\n{section.rstrip()}\n{END}\n"
    text = path.read_text() if path.exists() else _INTRO
    start = text.find(BEGIN)
    end = text.find(END, start + len(BEGIN)) if start >= 0 else -1
    if start >= 0 and end >= 0:
        tail = text[end + len(END):]
        text = text[:start] + block + (tail[1:] if tail.startswith("\n") else tail)
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.parent.mkdir(parents=True, exist_ok=True)
    # a reader (or an interrupted run) never sees a half-written file
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _print_table(rows: Sequence[BenchRow]) -> None:
    table = [_HEADER, *(_cells(r) for r in rows)]
    widths = [max(len(r[i]) for r in table) for i in range(len(_HEADER))]
    for r in table:
        print("  ".join(c.rjust(w) if i >= 2 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip())


def run_bench(*, repeats: int = 20, out: Path = Path("BENCHMARKS.md")) -> int:
    """Measure every preset and bucket, print the table, rewrite the section of ``out``; always 0."""
    targets = _targets()
    info = _machine_info(targets, repeats)

    def progress(row: BenchRow) -> None:
        sys.stderr.write(f"  {row.engine}/{row.device} {row.preset} {row.kind} bucket={row.bucket} real={row.real}: "
                         f"{row.ratio:.2f}\n")
        sys.stderr.flush()

    rows = measure(repeats=repeats, targets=targets, progress=progress)
    for key, value in info.items():
        print(f"{key}: {value}")
    print()
    _print_table(rows)
    slow = [r for r in rows if not r.ok]
    print(f"\n{len(rows)} rows, {len(slow)} with replay slower than eager (measured, not asserted)")
    write_section(out, render_markdown(rows, info))
    print(f"Markdown: {out.resolve()}")
    return 0

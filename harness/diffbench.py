"""Diff throughput and memory, side by side with a plain copy of the same cache.

``measure_diff`` builds two runs' snapshots of a hybrid cache of about ``cache_bytes`` directly (no model
run): random K/V rows in every live slot, poison elsewhere, as ``assemble`` leaves a pool. Then, in
one process, it times

* ``copy``: ``Tensor.copy_`` of one snapshot's four pool tensors into warm, preallocated buffers (memory
  bandwidth: the strict baseline);
* ``clone``: ``Tensor.clone`` of the same tensors, fresh memory each time, as a snapshot is taken;
* ``identical``: ``diff_runs`` over ``steps`` steps whose subject is a byte-equal copy of the reference
  (the snapshots hold what each step changed, so the diff rebuilds the pools from them as it goes);
* ``P% of slots mismatched`` and ``N mismatched slots``: the same with that share of the live (pool, slot)
  pairs, or N of them, corrupted in every layer of their pool and every step, cycling through poison,
  another live token's row, the expected row moved to a free slot, and a small numeric change, so that
  every classification rule is exercised.

Each diff case is also timed through ``verdict.judge``, as a case's verdict is reached: the same diff,
with the heatmap's counts per (step, pool, layer) and the ``DETAIL_LIMIT`` records it keeps (the diff
alone builds its default 200). The two run back to back on one subject, taking turns going first.

Throughput is cache bytes per second: a copy moves ``cache_bytes`` per snapshot, the diff compares
``cache_bytes`` of subject (against as many of reference) per step, so ``vs_copy`` = (steps x copy time)
/ diff time; 1.0 means the diff gets through a step's cache as fast as a copy would. The cases are timed
in ``repeats`` interleaved rounds and each keeps its best time, so that a burst of other work on the
machine does not land on one case only.

Peak memory is the growth of the process's resident set during the call: Linux resets the high-water
mark (``VmHWM``) when "5" is written to ``/proc/self/clear_refs``, so it is reset right before each call
and read right after. torch allocates CPU tensors with malloc, so the resident set follows live tensors
(tracemalloc would not see them) once the memory the process keeps free is given back: ``make bench`` runs
as a worker child does, holding freed blocks for reuse (``check/run/malloc.py``), so the first round gives
them back before each call (its peaks are whole) and later rounds run on them, as a long diff's steps do.
Where the reset is not allowed the peak is reported as None.

Memory needed: about 4 x ``cache_bytes`` (the reference, the copy's buffers, one subject at a time and
the clone's or the diff's transient memory).
"""

from __future__ import annotations

import gc
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .bench_rows import DiffBenchRow
from .check.run.malloc import release_freed_memory
from .runspec import RunSpec
from .serving.model import ModelSpec
from .serving.pool import PoolSpec, poison_
from .serving.timeline import LiveToken, TimelineSpec, TokenKey
from .check.diff.diff import DiffResult, diff_runs
from .check.run.result import RunResult
from .check.diff.snapshot import WholePool, WholeStep, hybrid_step, snapshots_of
from .check.matrix.verdict import judge

__all__ = ["measure_diff"]


@dataclass(frozen=True, slots=True)
class _Cache:
    ref: WholeStep
    live_slots: dict[str, torch.Tensor]
    """pool -> slots compared there"""
    free_slots: dict[str, torch.Tensor]
    """pool -> slots neither live nor the dummy"""


_PATTERN = ("swa", "full", "swa", "full")


def measure_diff(
    cache_bytes: int,
    mismatched_slots: Sequence[int] = (1_000, 10_000, 100_000),
    seed: int = 0,
    *,
    mismatched_shares: Sequence[float] = (0.01, 0.1),
    steps: int = 2,
    repeats: int = 3,
    num_kv_heads: int = 4,
    head_dim: int = 64,
    dtype: torch.dtype = torch.float32,
) -> list[DiffBenchRow]:
    """Copy, clone, identical diff, and one diff per share of the live slots in ``mismatched_shares`` and per
    count in ``mismatched_slots``, on a cache of ~``cache_bytes``."""
    gen = torch.Generator().manual_seed(seed)
    cache = _build(cache_bytes, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype, gen=gen)
    size = _snapshot_bytes(cache.ref)
    live = sum(s.numel() for s in cache.live_slots.values())
    reference = snapshots_of((cache.ref,) * steps)
    targets = [t for p in cache.ref.pools for t in (p.k, p.v)]
    copies = [torch.empty_like(t) for t in targets]

    def copy() -> None:
        for dst, src in zip(copies, targets):
            dst.copy_(src)

    copy()  # touch the destination pages once: the copy is timed into warm memory
    # case -> what to do before timing, returning the calls to time by name
    prepare: dict[str, Callable[[], dict[str, Callable[[], object]]]] = {
        "copy": lambda: {"copy": copy}, "clone": lambda: {"clone": lambda: [t.clone() for t in targets]},
    }
    requested = {"copy": 0, "clone": 0}
    # a count beyond the live slots of a small cache becomes "all of them" rather than an error
    cases = [("identical", 0)]
    cases += [(f"{share:.0%} of slots mismatched", max(1, round(share * live))) for share in mismatched_shares]
    cases += [(f"{n} mismatched slots", n) for n in sorted({min(n, live) for n in mismatched_slots})]
    spec = _spec(cache.ref, dtype)
    judged = RunResult(spec=spec, snapshots=reference)
    for index, (name, n) in enumerate(cases):
        # A subject is built right before its calls and dropped after, the same every round (a seed of its
        # own), so that memory does not grow with the number of cases.
        def diff(
            name: str = name, n: int = n, case_seed: int = seed * 1_000 + index
        ) -> dict[str, Callable[[], object]]:
            subject = snapshots_of((_corrupted(cache, n, torch.Generator().manual_seed(case_seed)),) * steps)
            return {
                name: lambda: diff_runs(subject, reference),
                _JUDGE + name: lambda: judge(RunResult(spec=spec, snapshots=subject), judged).diff,
            }

        prepare[name] = diff
        requested[name] = n

    best: dict[str, float] = {}
    peaks: dict[str, int | None] = {}
    results: dict[str, object] = {}
    for round_ in range(max(1, repeats)):
        for make in prepare.values():
            calls = make()
            # a case's calls take turns going first, so that neither always meets a warmer machine
            names = list(reversed(calls)) if round_ % 2 else list(calls)
            for name in names:
                # the first round's peaks are whole (``_timed``); later rounds run as a long diff's steps do,
                # on the pages its earlier steps freed
                seconds, peak, results[name] = _timed(calls[name], fresh=round_ == 0)
                best[name] = min(best.get(name, float("inf")), seconds)
                if peak is not None:
                    peaks[name] = max(peaks.get(name) or 0, peak)
            del calls
    rows = []
    for name in prepare:
        result = results[name]
        diffed = isinstance(result, DiffResult)
        n_steps = steps if diffed else 1
        rows.append(DiffBenchRow(
            case=name, cache_bytes=size, steps=n_steps, live_slots=live, mismatched_slots=requested[name],
            found_slots=result.mismatched_slots if diffed else 0, mismatches=result.total if diffed else 0,
            classes=result.classes if diffed else (), seconds=best[name],
            vs_copy=n_steps * best["copy"] / best[name], vs_clone=n_steps * best["clone"] / best[name],
            peak_bytes=peaks.get(name), judge_seconds=best.get(_JUDGE + name),
        ))
    return rows


_JUDGE = "judge: "


def _spec(snap: WholeStep, dtype: torch.dtype) -> RunSpec:
    """A run spec of the cache's shape, as ``judge`` reads one: layers, dtype, a CPU run of one backend (exact)."""
    name = str(dtype).removeprefix("torch.")
    full, swa = snap.pool("full").k, snap.pool("swa").k
    model = ModelSpec(name="diffbench", layer_pattern=_PATTERN, window=128, num_kv_heads=full.shape[2],
                      head_dim=full.shape[3], dtype=name)
    return RunSpec(model=model, pool=PoolSpec(full_size=full.shape[1], swa_size=swa.shape[1]),
                   timeline=TimelineSpec(requests=()))


# ---- building the caches --------------------------------------------------------------------------------

def _build(cache_bytes: int, *, num_kv_heads: int, head_dim: int, dtype: torch.dtype, gen: torch.Generator) -> _Cache:
    row = num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
    n_full, n_swa = _PATTERN.count("full"), _PATTERN.count("swa")
    # The SWA pool has a third of the full pool's slots, as SGLang sizes it for a window well below the context;
    # requests of 128 tokens fill 85% of the full pool, their in-window tokens 90% of the SWA pool.
    full_size = max(16, int(cache_bytes / (2 * row * (n_full + n_swa / 3))))
    swa_size = max(8, full_size // 3)
    req_len = 128
    n_req = max(1, int(0.85 * (full_size - 1)) // req_len)
    in_window = max(1, min(req_len, int(0.9 * (swa_size - 1)) // n_req))
    full_slots = (torch.randperm(full_size - 1, generator=gen)[: n_req * req_len] + 1).view(n_req, req_len)
    swa_slots = (torch.randperm(swa_size - 1, generator=gen)[: n_req * in_window] + 1).view(n_req, in_window)

    live = []
    for r in range(n_req):
        first_in = req_len - in_window
        fs, ss = full_slots[r].tolist(), swa_slots[r].tolist()
        live.extend(
            LiveToken(rid=f"r{r}", pos=p, slots=(fs[p], ss[p - first_in] if p >= first_in else 0),
                      in_window=p >= first_in)
            for p in range(req_len)
        )
    written = tuple(TokenKey(f"r{r}", req_len - 1) for r in range(n_req))  # a decode step: each request's newest token

    def pool(size: int, layers: int, used: torch.Tensor) -> torch.Tensor:
        t = torch.empty((layers, size, num_kv_heads, head_dim), dtype=dtype)
        poison_(t)
        t[:, 0] = 0
        t[:, used] = torch.randn((layers, used.numel(), num_kv_heads, head_dim), generator=gen).to(dtype)
        return t

    used_full, used_swa = full_slots.flatten(), swa_slots.flatten()
    ref = hybrid_step(
        step=0, kind="decode", live=tuple(live), layer_is_swa=tuple(kind == "swa" for kind in _PATTERN),
        full_k=pool(full_size, n_full, used_full), full_v=pool(full_size, n_full, used_full),
        swa_k=pool(swa_size, n_swa, used_swa), swa_v=pool(swa_size, n_swa, used_swa),
        hidden=torch.randn((n_req, 64), generator=gen), hidden_owners=written,
    )

    def free(size: int, used: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(size, dtype=torch.bool)
        mask[0] = False
        mask[used] = False
        return mask.nonzero().flatten()

    return _Cache(
        ref=ref, live_slots={"full": used_full, "swa": used_swa},
        free_slots={"full": free(full_size, used_full), "swa": free(swa_size, used_swa)},
    )


def _corrupted(cache: _Cache, n: int, gen: torch.Generator) -> WholeStep:
    """A byte-equal copy of the reference snapshot with ``n`` live (pool, slot) pairs made to differ."""
    ref = cache.ref
    tensors = {name: (ref.pool(name).k.clone(), ref.pool(name).v.clone()) for name in ("full", "swa")}
    counts = {pool: slots.numel() for pool, slots in cache.live_slots.items()}
    if n > sum(counts.values()):
        raise ValueError(f"{n} mismatched slots requested but only {sum(counts.values())} are live")
    picked = torch.randperm(sum(counts.values()), generator=gen)[:n]
    offset = 0
    for pool, count in counts.items():
        live = cache.live_slots[pool]
        at = picked[(picked >= offset) & (picked < offset + count)] - offset
        offset += count
        k, v = tensors[pool]
        ref_k, ref_v = ref.pool(pool).k, ref.pool(pool).v
        poisoned, copied, moved, drifted = (at[torch.arange(at.numel()) % 4 == i] for i in range(4))
        # never written: poison
        for t in (k, v):
            rows = t.new_empty((t.shape[0], poisoned.numel(), *t.shape[2:]))
            poison_(rows)
            t[:, live[poisoned]] = rows
        # another live token's row (any other position: live slots are distinct)
        others = (copied + torch.randint(1, max(2, count), (copied.numel(),), generator=gen)) % count
        k[:, live[copied]], v[:, live[copied]] = ref_k[:, live[others]], ref_v[:, live[others]]
        # the expected row moved to a free slot, a fresh row left behind; without free slots left, a drift
        free = cache.free_slots[pool]
        moved, stayed = moved[: free.numel()], moved[free.numel() :]
        dest = free[: moved.numel()]
        k[:, dest], v[:, dest] = ref_k[:, live[moved]], ref_v[:, live[moved]]
        k[:, live[moved]] = torch.randn((k.shape[0], moved.numel(), *k.shape[2:]), generator=gen).to(k.dtype)
        # a small numeric change in one element
        drifted = live[torch.cat([drifted, stayed])]
        k[:, drifted, 0, 0] = (k[:, drifted, 0, 0].float() + 1e-3).to(k.dtype)
    return WholeStep(
        step=ref.step, kind=ref.kind, live=ref.live, groups=ref.groups,
        pools=tuple(WholePool(k=tensors[g.name][0], v=tensors[g.name][1]) for g in ref.groups),
        hidden=ref.hidden.clone(), hidden_owners=ref.hidden_owners,
    )


def _snapshot_bytes(s: WholeStep) -> int:
    return sum(t.numel() * t.element_size() for p in s.pools for t in (p.k, p.v))


# ---- measuring ------------------------------------------------------------------------------------------

def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1)) * 1024


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _timed(call: Callable[[], object], *, fresh: bool) -> tuple[float, int | None, object]:
    """Seconds, resident-set growth (None where it cannot be measured) and result of one call. ``fresh``: the
    memory the process keeps free (``malloc.keep_freed_memory``) is given back first, so the call's growth is
    all it allocates; otherwise it may reuse those pages and its growth says less than its peak."""
    gc.collect()
    if fresh:
        release_freed_memory()
    measurable = _reset_peak()
    before = _status("VmRSS") if measurable else 0
    start = time.perf_counter()
    result = call()
    seconds = time.perf_counter() - start
    return seconds, (_status("VmHWM") - before) if measurable else None, result

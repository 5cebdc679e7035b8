"""The ordering SGLang's overlap scheduler allows, on the tape, and the write-location audit that sees what it breaks.

SGLang 0.5.23's ``Scheduler.event_loop_overlap`` launches forward ``i`` (``run_batch``), fences its schedule stream
behind the forward's *shared reads* (``_apply_war_barrier``: ``schedule_stream.wait_event(ev)`` on the event the
runner published, ``model_runner.shared_read_done_event``), then processes batch ``i - 1``'s result (finished,
aborted and retracted requests release their KV: ``full_to_swa_index_mapping`` entries cleared, slots freed) and
builds batch ``i + 1`` (SWA eviction, allocation: the mapping and ``req_to_token`` written), all while forward ``i``
is still running its layers. Where the fence sits is the attention backend's declaration,
``shared_read_ends(forward_mode)``, resolved by ``DecodeCudaGraphRunner._resolve_shared_read_ends``: for a decode
batch ``IN_REPLAY`` (the base class's, which ``TRTLLMHAAttnBackend`` keeps), so the event is the runner's
``in_graph_metadata_prep_done``, an *external* event recorded inside every captured graph right after
``init_forward_metadata_in_graph`` (``_record_in_graph_metadata_prep_done``). Everything a forward reads of the
scheduler's state after that point must have been snapshotted by then; 0.5.23's ``_get_layer_cache_loc`` asserts
as much ("a per-layer gather of the live mapping would race the scheduler after the WAR fence releases").

What is the harness's here, each the narrowest point found:

* ``ReadDoneMarker`` is that external event on the tape. ``make_external_event`` (``runner_utils.
  shared_read_event``, imported by name into the decode runner) returns ``torch.cuda.Event(external=True)`` only
  when ``is_cuda()``; on a CPU it returns None and the runner falls back to ``POST_REPLAY`` (a fence after the whole
  replay), which cannot show the race. ``external_read_done_event()`` binds the decode runner's name to a factory
  of markers. A marker's ``record()`` during capture calls ``harness_sglang::shared_read_done``, a ``torch.library``
  op whose kernel runs out of sight of the tape, so the tape records it as one opaque op (``rerun_ops``) and calls
  it again at every replay, at the point of the graph where SGLang records the event, as a CUDA graph re-records an
  event node. At a replay the kernel runs what the driver armed: the next iteration's scheduler work.
* ``WriteLocationLog`` observes the installed ``SWAKVPool.set_kv_buffer`` of one pool instance: it copies the
  location each layer's write lands at (an SWA layer's ``swa_loc``, a full layer's ``loc``) into a static buffer per
  layer, with tensor ops, so a captured forward copies what it writes at on every replay; then it calls SGLang's
  method unchanged. ``misplaced_writes`` compares, row by row, what each layer wrote at with what the iteration's
  allocation gave the row (its ``out_cache_loc`` and that slot's SWA peer through the mapping as it stood when the
  batch was built), and names who holds the slot written at once the scheduler work has run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .installed import load

_LIB = torch.library.Library("harness_sglang_overlap", "DEF")
_LIB.define("shared_read_done(Tensor(a!) stamp) -> ()")

_ARMED: dict[int, Callable[[], None]] = {}
"""per marker (its stamp's storage pointer), the host work to run when a replay reaches the marker"""


def _shared_read_done_kernel(stamp: torch.Tensor) -> None:
    # out of sight of every dispatch mode: the tape records the op itself and calls it again at each replay
    with _disable_current_modes():
        stamp.add_(1)
        work = _ARMED.pop(stamp.untyped_storage().data_ptr(), None)
        if work is not None:
            work()


def _no_output(stamp: torch.Tensor) -> None:
    return None


_LIB.impl("shared_read_done", _shared_read_done_kernel, "CPU")
_LIB.impl("shared_read_done", _no_output, "Meta")


class ReadDoneMarker:
    """The runner's in-graph read-done event (``torch.cuda.Event(external=True)`` on CUDA) as an op of the tape."""

    def __init__(self) -> None:
        self.stamp = torch.zeros(1, dtype=torch.int64)
        """times a graph reached the marker (capture's own call is undone with the capture)"""

    def record(self, stream: Any = None) -> None:
        torch.ops.harness_sglang_overlap.shared_read_done(self.stamp)

    def wait(self, stream: Any = None) -> None:
        pass  # CPU ops run in program order: what the marker marks has run

    def arm(self, work: Callable[[], None]) -> None:
        """Run ``work`` (once) when the next replay reaches this marker."""
        _ARMED[self.stamp.untyped_storage().data_ptr()] = work

    def disarm(self) -> bool:
        """Drop work armed and not run; True when there was some (no replay reached the marker)."""
        return _ARMED.pop(self.stamp.untyped_storage().data_ptr(), None) is not None

    def __repr__(self) -> str:
        return f"<ReadDoneMarker (tape) reached {int(self.stamp)} times>"


@contextmanager
def external_read_done_event() -> Iterator[None]:
    """The decode runner's ``make_external_event`` makes ``ReadDoneMarker``s while the block runs (CUDA's external
    event; SGLang's own factory returns None off CUDA)."""
    load()
    from sglang.srt.model_executor.runner import decode_cuda_graph_runner

    original = decode_cuda_graph_runner.make_external_event
    decode_cuda_graph_runner.make_external_event = lambda device_module: ReadDoneMarker()
    try:
        yield
    finally:
        decode_cuda_graph_runner.make_external_event = original


def arm_at_read_end(runner: Any, backend: Any, forward_mode: Any, work: Callable[[], None]) -> ReadDoneMarker | None:
    """The runner's in-graph read-done marker armed with ``work``, where SGLang's resolution of the backend's
    ``shared_read_ends`` says the replay's shared reads end there (``IN_REPLAY``); None where they end after it."""
    from sglang.srt.layers.attention.base_attn_backend import SharedReadEnds

    ends = runner._resolve_shared_read_ends(backend, forward_mode)
    if ends is not SharedReadEnds.IN_REPLAY:
        return None
    marker = runner.in_graph_metadata_prep_done
    if not isinstance(marker, ReadDoneMarker):
        raise RuntimeError(f"the runner's in-graph read-done event is {marker!r}, not the tape's marker: "
                           "overlap runs need overlap.external_read_done_event() bound at capture")
    marker.arm(work)
    return marker


def check_fence(marker: ReadDoneMarker, model_runner: Any, step: int) -> None:
    """After the replay: it reached the marker, and the runner published the marker as its read-done event."""
    if marker.disarm():
        raise RuntimeError(f"step {step}: the replay never reached the runner's read-done marker")
    if model_runner.shared_read_done_event is not marker:
        raise RuntimeError(f"step {step}: the runner published {model_runner.shared_read_done_event!r} as its "
                           "read-done event, not the in-graph marker its backend's shared_read_ends resolved to")


@dataclass(frozen=True, slots=True, kw_only=True)
class MisplacedWrite:
    """One row of one layer's KV write that landed where the iteration's allocation did not put it."""

    step: int
    layer: int
    pool: str
    """the KV group written (``full`` or ``swa``)"""
    row: int
    rid: str
    pos: int
    planned: int
    """the slot the batch was built with for the row: ``out_cache_loc``, or its SWA peer at batch build"""
    written: int
    """the slot the layer's write landed at"""
    holder: str
    """who holds ``written`` once the next iteration's scheduler work has run: ``rid@pos``, ``free``, ``dummy`` (slot
    0, where padded rows write) or ``not written`` (the layer wrote no row here)"""

    def __str__(self) -> str:
        return (f"step {self.step} layer {self.layer} ({self.pool}): row {self.row} ({self.rid}@{self.pos}) wrote at "
                f"slot {self.written} ({self.holder}), its batch was built with slot {self.planned}")


class WriteLocationLog:
    """Where each layer's K/V write of the current forward landed, row by row, on one installed ``SWAKVPool``."""

    def __init__(self, kv_pool: Any, *, num_layers: int, max_tokens: int) -> None:
        self.kv_pool = kv_pool
        self.where = torch.full((num_layers, max_tokens), -1, dtype=torch.int64)
        """per layer, the slot each token row of the forward wrote at (-1: not written)"""
        self._set_kv_buffer = kv_pool.set_kv_buffer
        self._own = vars(kv_pool).get("set_kv_buffer")
        """an instance attribute the pool already had (another observer), put back on exit"""

    def __enter__(self) -> WriteLocationLog:
        self.kv_pool.set_kv_buffer = self._observed
        return self

    def __exit__(self, *exc: object) -> None:
        if self._own is not None:
            self.kv_pool.set_kv_buffer = self._own
        else:
            del self.kv_pool.set_kv_buffer  # the class's method shows again

    def _observed(self, layer: Any, loc_info: Any, *args: Any, **kwargs: Any) -> Any:
        from sglang.srt.mem_cache.memory_pool import unwrap_write_loc

        loc, swa_loc, _ = unwrap_write_loc(loc_info)
        is_swa = self.kv_pool.layers_mapping[layer.layer_id][1]
        at = swa_loc if is_swa and swa_loc is not None else loc
        self.where[layer.layer_id, : at.shape[0]].copy_(at)  # a tensor op: a captured forward repeats it
        return self._set_kv_buffer(layer, loc_info, *args, **kwargs)

    def clear(self) -> None:
        self.where.fill_(-1)

    def misplaced_writes(self, *, step: int, rows: Sequence[tuple[str, int]], planned_full: torch.Tensor,
                         planned_swa: torch.Tensor, holders: dict[tuple[str, int], str]) -> list[MisplacedWrite]:
        """The writes of the forward just run whose slot differs from the one its batch was built with, for the
        batch's own ``rows`` (``(rid, pos)``; padded rows are the runner's and write at the dummy slot).
        ``holders`` names, per ``(pool, slot)``, the live token (``rid@pos``) holding that slot now."""
        out = []
        n = len(rows)
        mapping = self.kv_pool.layers_mapping
        for layer in range(self.where.shape[0]):
            is_swa = mapping[layer][1]
            planned = (planned_swa if is_swa else planned_full).tolist()
            written = self.where[layer, :n].tolist()
            pool = "swa" if is_swa else "full"
            for row, ((rid, pos), want, got) in enumerate(zip(rows, planned, written)):
                if got != want:
                    holder = ("not written" if got < 0 else "dummy" if got == 0
                              else holders.get((pool, got), "free"))
                    out.append(MisplacedWrite(step=step, layer=layer, pool=pool, row=row, rid=rid, pos=pos,
                                              planned=int(want), written=int(got), holder=holder))
        return out

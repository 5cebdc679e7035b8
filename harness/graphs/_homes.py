"""Memory a tape shares with the program, and what replay does when the program moves or drops it.

A CUDA graph keeps the device addresses it captured.  The tape's pins are tensors over the
program's storages (``StorageImpl``), which follows them in two ways a graph does not:

* a ``resize_`` past the storage's capacity swaps the storage's memory in place, and every
  tensor over it, pins included, follows to the new block.  A graph keeps the old block, which
  the caching allocator freed;
* a program that re-points its tensor (``set_``, ``t.data = ...``) and keeps nothing else of the
  old storage would let the allocator free it; the pins keep it alive, with the values it held.

Each such storage is a *home*.  Before a replay, when the input audit saw memory move under a
watched input (or, for homes the audit does not watch, when a home's data pointer moved), the
homes are settled: a reallocated home's pins move to a block of the tape's own of the old size,
filled with poison; a home no program tensor references any more is poisoned where it lies.
From then on the graph reads and writes that memory alone, as it would a freed block nobody
reused.  Memory the capture allocated is graph-pool memory and stays the graph's: only its
reallocation is followed.

References are counted across every live tape (``_TAPE_REFS``), so a storage several graphs
share (a runner's buckets over one KV pool) is freed only when the program lets go of it, not
when one graph's pins are all that is left.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from collections.abc import Iterable

import torch

from ._ops import StorageKey, poison_bytes, storage_key

__all__ = ["Homes"]

_use_count = torch._C._storage_Use_Count
_below_inplace_view = torch._C._AutoDispatchBelowADInplaceOrView

_TAPE_REFS: Counter[StorageKey] = Counter()
_LOCK = threading.Lock()


def _release(counts: Counter[StorageKey]) -> None:
    with _LOCK:
        _TAPE_REFS.subtract(counts)
        for key in [k for k, n in _TAPE_REFS.items() if n <= 0]:
            del _TAPE_REFS[key]


class _Home:
    __slots__ = ("key", "pins", "ptr", "nbytes", "dtype", "captured")

    def __init__(self, key: StorageKey, pins: list[torch.Tensor], *, captured: bool) -> None:
        storage = pins[0].untyped_storage()
        self.key, self.pins, self.dtype = key, pins, pins[0].dtype
        self.ptr, self.nbytes = storage.data_ptr(), storage.nbytes()
        self.captured = captured  # allocated during capture: graph-pool memory the graph keeps


class Homes:
    """The program's storages one tape binds, settled before a replay when memory moved."""

    __slots__ = ("_open", "_unwatched", "_counts", "__weakref__")

    def __init__(self, pins_by_key: dict[StorageKey, list[torch.Tensor]], *, skip: set[StorageKey],
                 watched: set[StorageKey], captured: Iterable[StorageKey]) -> None:
        captured = set(captured)
        homes = []
        for key, pins in pins_by_key.items():
            if key in skip:
                continue
            live = [p for p in pins if storage_key(p) == key]
            if live and live[0].untyped_storage().nbytes():
                homes.append(_Home(key, live, captured=key in captured))
        self._open = homes
        # homes whose memory no input the audit watches would show moving: checked at every replay
        self._unwatched = tuple((h.pins[0], h.pins[0].data_ptr()) for h in homes if h.key not in watched)
        self._counts = Counter({h.key: len(h.pins) for h in homes})
        with _LOCK:
            _TAPE_REFS.update(self._counts)
        weakref.finalize(self, _release, self._counts)  # the same Counter: what _keep_old_block gave back stays given

    def before_replay(self, memory_moved: bool) -> None:
        """Settle the homes if memory moved under a watched input or an unwatched home moved."""
        if not memory_moved:
            for pin, ptr in self._unwatched:
                if pin.data_ptr() != ptr:
                    break
            else:
                return
        self._settle()

    @property
    def checks_every_replay(self) -> bool:
        return bool(self._unwatched)

    def _settle(self) -> None:
        still_open = []
        for home in self._open:
            storage = home.pins[0].untyped_storage()
            if storage.data_ptr() != home.ptr or storage.nbytes() != home.nbytes:
                self._keep_old_block(home)
            elif not home.captured and _use_count(storage._cdata) - 1 <= _TAPE_REFS.get(home.key, 0):
                # every tensor left over this storage is a tape's pin: the program let go, the allocator
                # would have freed it
                poison_bytes(storage, home.dtype)
            else:
                still_open.append(home)
        self._open = still_open

    def _keep_old_block(self, home: _Home) -> None:
        device = home.pins[0].device
        old = torch.empty(home.nbytes, dtype=torch.uint8, device=device).untyped_storage()
        poison_bytes(old, home.dtype)
        with torch.no_grad(), _below_inplace_view():  # no version bump: the pins share the program's counters
            for pin in home.pins:
                pin.set_(old, pin.storage_offset(), pin.size(), pin.stride())
        gone = Counter({home.key: len(home.pins)})
        _release(gone)
        self._counts.subtract(gone)

"""One pytest-xdist worker per GPU: each worker process sees only its own device.

The controller names the devices in ``HARNESS_WORKER_GPUS`` (what ``CUDA_VISIBLE_DEVICES`` would list: indices
or UUIDs); worker ``gwN`` keeps the ``N``-th (round robin, so two workers per GPU share it). The variable is
set in the worker's own environment before anything initialises CUDA there, so every process the worker
starts inherits the same single device, where ``torch.cuda.set_device`` would reach this process only, and
every device stays visible to code that names one (``cuda:0``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping, Sequence

__all__ = ["WORKER_GPUS_ENV", "pin_worker", "worker_device"]

WORKER_GPUS_ENV = "HARNESS_WORKER_GPUS"


def worker_device(worker_id: str, gpus: Sequence[str]) -> str:
    """The device of xdist worker ``gwN`` among ``gpus`` (round robin)."""
    if not gpus:
        raise ValueError("no GPU to pin a worker to")
    if not (worker_id.startswith("gw") and worker_id[2:].isdigit()):
        raise ValueError(f"not a pytest-xdist worker id: {worker_id!r}")
    return gpus[int(worker_id[2:]) % len(gpus)]


def pin_worker(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Set ``CUDA_VISIBLE_DEVICES`` of this xdist worker to its GPU; the device, or None where nothing asks."""
    listed = environ.get(WORKER_GPUS_ENV, "").strip()
    worker_id = environ.get("PYTEST_XDIST_WORKER")
    if not listed or not worker_id:
        return None
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        # too late: this process already enumerated every device, and keeps them whatever the variable says
        raise RuntimeError(f"{WORKER_GPUS_ENV}: CUDA was initialised in worker {worker_id} before it was pinned")
    device = worker_device(worker_id, [g.strip() for g in listed.split(",") if g.strip()])
    environ["CUDA_VISIBLE_DEVICES"] = device
    return device

"""What a GPU CI log prints first: the devices, the driver, torch and FlashInfer, and which GPUs workers get."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass

__all__ = ["Machine", "REQUIRE_GPU_ENV", "gpu_required", "probe"]

REQUIRE_GPU_ENV = "HARNESS_REQUIRE_GPU"
"""set to 1 on a machine that must have a GPU: a run that finds none fails instead of skipping"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Machine:
    python: str
    torch: str
    torch_cuda: str | None
    """the CUDA version torch was built for; None: a CPU build"""
    flashinfer: str | None
    """None: not importable"""
    driver: str | None
    """from nvidia-smi; None where it is missing"""
    devices: tuple[str, ...]
    """one line per visible device"""
    gpus: tuple[str, ...]
    """the ``CUDA_VISIBLE_DEVICES`` entry of each visible device, for pinning workers"""
    cuda_problem: str | None = None
    """why torch sees no device where nvidia-smi or the build says there should be one"""

    def lines(self) -> list[str]:
        """The environment block of the log."""
        out = [f"python {self.python}, torch {self.torch} (CUDA build: {self.torch_cuda or 'none, a CPU build'})",
               f"flashinfer {self.flashinfer or 'not installed'}",
               f"NVIDIA driver {self.driver or 'unknown (no nvidia-smi)'}"]
        out += [f"device {d}" for d in self.devices] or ["no CUDA device visible"]
        if self.cuda_problem:
            out.append(self.cuda_problem)
        return out


def gpu_required(flag: bool = False) -> bool:
    """Whether a GPU was promised: the option, or ``HARNESS_REQUIRE_GPU`` set to anything but 0 or empty."""
    return flag or os.environ.get(REQUIRE_GPU_ENV, "").strip() not in ("", "0")


def _flashinfer_version() -> str | None:
    for dist in ("flashinfer-python", "flashinfer"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    # a pack on PYTHONPATH carries the package without its distribution's metadata
    return "(version unknown: no distribution metadata)" if importlib.util.find_spec("flashinfer") else None


def _driver() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    versions = sorted({line.strip() for line in done.stdout.splitlines() if line.strip()})
    return ", ".join(versions) if done.returncode == 0 and versions else None


def _visible_entries(count: int) -> tuple[str, ...]:
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return tuple(str(i) for i in range(count))
    return tuple(e.strip() for e in listed.split(",") if e.strip())[:count]


def probe() -> Machine:
    """This machine as torch and nvidia-smi see it (initialises CUDA in this process, never in a worker)."""
    import torch

    problem = None
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except RuntimeError as exc:  # a driver too old for the build, a device in a bad state
        count, problem = 0, f"torch cannot use CUDA: {exc}"
    devices = []
    for i in range(count):
        p = torch.cuda.get_device_properties(i)
        devices.append(f"{i}: {p.name}, sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB")
    return Machine(python=platform.python_version(), torch=torch.__version__, torch_cuda=torch.version.cuda,
                   flashinfer=_flashinfer_version(), driver=_driver(), devices=tuple(devices),
                   gpus=_visible_entries(count), cuda_problem=problem)

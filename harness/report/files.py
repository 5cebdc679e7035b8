"""Writing report files: atomically (a reader never sees half a file) and with the user's normal mode."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary file beside ``path`` and rename it into place, as pytest writes its caches.

    ``mkstemp`` creates files 0600; a report is for sharing, so it gets what ``open()`` would have given.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def unwritable(path: Path) -> str | None:
    """Why a report file cannot be written at ``path`` (checked before a run, so no result is lost after
    it); None when it can."""
    if path.is_dir():
        return "is a directory; name a file"
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a directory"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot write in {folder}"
    if path.exists() and not os.access(path, os.W_OK):
        return "exists and is not writable"
    return None

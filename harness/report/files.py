"""Writing report files: atomically (a reader never sees half a file), with the user's normal mode, and
never through a link out of the report folder.

A report folder holds one report. ``ReportFolder`` writes each file through directory descriptors opened
without following links (``O_NOFOLLOW``), so a ``scenarios/`` that someone replaced with a link to another
folder is refused instead of written through, even if it is swapped in while the report is being written;
when the report is complete, the pages of an earlier report that this one does not hold are removed, so
the folder never lists another run's scenarios. Destinations are judged before a run (``unwritable``,
``unwritable_folder``), so that no result is lost to a bad path after the run.

A report is written whole or not at all: every file goes to a temporary file beside its place first, and
only once all of them are written (a full disk shows on the first that does not fit) are they renamed into
place; a report that fails leaves the folder as it was (an earlier report whole, or no folder). Text is
encoded so that a string Python holds but UTF-8 cannot (a lone surrogate, from a results file's ``\udcff``)
becomes a visible escape instead of an error half-way through.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

REPORT_FILES = ("index.html", "compare.html", "results.json", "results.csv")
"""the files a report writes at the top of its folder (``compare.html`` only from ``compare``)"""
PAGES_DIR = "scenarios"
"""the subfolder of a report's scenario pages, all ``*.html``"""


class ReportFolderError(OSError):
    """A report folder that cannot be written without leaving it or overwriting what is not a report's."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def encoded(text: str) -> bytes:
    """``text`` as UTF-8, whatever it holds: a lone surrogate becomes the escape ``\\udcff``, not an error."""
    return text.encode("utf-8", "backslashreplace")


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary file beside ``path``, flush it to the disk and rename it into place: a reader,
    or a machine that loses power, sees the old file or the new one whole, never a part.

    ``mkstemp`` creates files 0600; a report is for sharing, so it gets what ``open()`` would have given.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(encoded(text))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)


def _sync_folder(folder: Path | int) -> None:
    """Flush a folder's entries (the rename) to the disk; where a system cannot, the rename still stands."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY) if not isinstance(folder, int) else os.dup(folder)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def os_error_text(exc: OSError) -> str:
    """An OSError in words: ``File too large (/x/.r.json.tmp)``; a ``ReportFolderError`` says it all itself."""
    if isinstance(exc, ReportFolderError) or not exc.strerror:
        return str(exc)
    return f"{exc.strerror} ({exc.filename})" if exc.filename else exc.strerror


def _existing_ancestor(path: Path) -> Path:
    folder = path
    while not os.path.lexists(folder):
        folder = folder.parent
    return folder


def unwritable(path: Path) -> str | None:
    """Why a results file cannot be written at ``path`` (checked before a run, so no result is lost after
    it); None when it can."""
    if path.is_dir():
        return "is a directory; name a file"
    if path.exists() and not path.is_file():
        return "is not a regular file"
    folder = _existing_ancestor(path.parent)
    if not folder.is_dir():
        return f"{folder} is not a directory"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot write in {folder}"
    if path.exists() and not os.access(path, os.W_OK):
        return "exists and is not writable"
    return None


def unwritable_folder(path: Path) -> str | None:
    """Why a report cannot be written into the folder ``path`` (checked before a run); None when it can.

    The folder itself may be a link to a folder (the user named it); inside it, nothing the report writes
    may be a link or something other than what the report would write there.
    """
    if os.path.lexists(path) and not path.exists():
        return f"is a broken symbolic link to {os.readlink(path)}"
    if path.exists() and not path.is_dir():
        return f"is a symbolic link to a file ({path.resolve()}); name a folder" if path.is_symlink() else \
            "is a file; name a folder"
    folder = _existing_ancestor(path)
    if not folder.is_dir():
        return f"{folder} is not a directory"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot write in {folder}"
    if folder != path:
        return None  # created by the report: nothing inside it yet
    pages = path / PAGES_DIR
    if os.path.lexists(pages):
        if pages.is_symlink():
            return (f"{PAGES_DIR} is a symbolic link (to {os.readlink(pages)}); a report never writes through a "
                    "link out of its folder")
        if not pages.is_dir():
            return f"{PAGES_DIR} is not a directory"
        if not os.access(pages, os.W_OK | os.X_OK):
            return f"cannot write in {pages}"
    for name in REPORT_FILES:
        if os.path.isdir(path / name) and not os.path.islink(path / name):
            return f"{name} is a directory"
    return None


def destination_problems(*, results: tuple[str, Path | None], folder: tuple[str, Path | None]) -> list[str]:
    """``option path: why`` for each destination that cannot be written, and for a pair that collide.

    ``results`` is (option, path) of a results file, ``folder`` of a report folder; a path may be None.
    """
    (file_option, file_path), (dir_option, dir_path) = results, folder
    out = []
    if file_path is not None and (problem := unwritable(file_path)):
        out.append(f"{file_option} {file_path}: {problem}")
    if dir_path is not None and (problem := unwritable_folder(dir_path)):
        out.append(f"{dir_option} {dir_path}: {problem}")
    if not out and file_path is not None and dir_path is not None:
        a, b = file_path.resolve(), dir_path.resolve()
        if a == b or b.is_relative_to(a):
            out.append(f"{dir_option} {dir_path}: the results file {file_option} {file_path} would be in its way")
    return out


class ReportFolder:
    """The files of one report, written into ``root`` and only there, whole or not at all.

    ``write`` puts each file in a temporary file beside its place; ``commit`` (leaving the ``with`` block
    without an error) renames them all into place, then, if ``remove_stale`` asked for it, removes the report
    files an earlier report left that this one did not write. Leaving with an error removes the temporary
    files, and the folders this report created: an earlier report stays whole, and a new one leaves nothing.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._created: list[Path] = []
        try:
            missing = [p for p in (self.root, *self.root.parents) if not os.path.lexists(p)]
            self.root.mkdir(parents=True, exist_ok=True)
            self._created = missing  # deepest first: removed in this order when the report fails
            # the folder the user named may be a link to a folder: followed once, here; below it, never
            self._fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            self._remove_created()
            raise ReportFolderError(f"{self.root}: cannot write a report there: {exc.strerror or exc}") from None
        self._pages_fd: int | None = None
        self._pages_created = False
        self._staged: list[tuple[int, str, str, str]] = []
        """(folder descriptor, temporary name, final name, relative path) of each file written, in order"""
        self._remove_stale: set[str] | None = None
        self.written: set[str] = set()
        """paths written, relative to ``root``"""

    def _dir_fd(self, relative: str) -> tuple[int, str]:
        parts = relative.split("/")
        if len(parts) == 1 and relative in REPORT_FILES:
            return self._fd, relative
        if len(parts) != 2 or parts[0] != PAGES_DIR or not parts[1].endswith(".html") or parts[1].startswith("."):
            raise ReportFolderError(f"{self.root}: {relative!r} is not a report file")
        if self._pages_fd is None:
            try:
                os.mkdir(PAGES_DIR, dir_fd=self._fd)
                self._pages_created = True
            except FileExistsError:
                pass
            try:
                self._pages_fd = os.open(PAGES_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self._fd)
            except OSError as exc:
                raise ReportFolderError(f"{self.root / PAGES_DIR}: not a folder of this report (a link, or not a "
                                        f"directory): {exc.strerror}") from None
        return self._pages_fd, parts[1]

    def write(self, relative: str, text: str) -> Path:
        """Write ``root/relative`` (``index.html``, ``scenarios/x.html``) whole, beside its place until
        ``commit``; its path."""
        dir_fd, name = self._dir_fd(relative)
        data = encoded(text)
        for attempt in range(100):
            tmp = f".{name}.{os.getpid()}.{attempt}.tmp"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666, dir_fd=dir_fd)
                break
            except FileExistsError:
                continue
        else:
            raise ReportFolderError(f"{self.root}: cannot create a temporary file for {relative}")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            _unlink_quietly(dir_fd, tmp)
            raise
        for earlier in [s for s in self._staged if s[3] == relative]:  # written twice: the last one counts
            _unlink_quietly(earlier[0], earlier[1])
            self._staged.remove(earlier)
        self._staged.append((dir_fd, tmp, name, relative))
        self.written.add(relative)
        return self.root / relative

    def remove_stale(self, *, keep: Iterable[str] = ()) -> None:
        """At ``commit``, remove the report files this report did not write (but ``keep``): an earlier
        report's pages."""
        self._remove_stale = set(keep)

    def commit(self) -> None:
        """Rename every file written into place (``index.html`` last: it links to the rest), then remove what
        ``remove_stale`` asked for."""
        staged = sorted(self._staged, key=lambda s: s[3] == "index.html")
        for dir_fd, tmp, name, _ in staged:
            # rename replaces a link at ``name`` itself, never the file it points to
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        self._staged = []
        for fd in {self._fd, *((self._pages_fd,) if self._pages_fd is not None else ())}:
            _sync_folder(fd)
        if self._remove_stale is not None:
            self._remove_stale_now({*self.written, *self._remove_stale})

    def discard(self) -> None:
        """Remove every temporary file, and the folders this report created (when nothing else is in them)."""
        for dir_fd, tmp, _, _ in self._staged:
            _unlink_quietly(dir_fd, tmp)
        self._staged = []
        if self._pages_created:
            try:
                os.rmdir(PAGES_DIR, dir_fd=self._fd)
            except OSError:
                pass
        self._remove_created()

    def _remove_created(self) -> None:
        for folder in self._created:
            try:
                folder.rmdir()
            except OSError:
                break  # something else is in it now: it stays, and so do the folders above it

    def _remove_stale_now(self, keep: set[str]) -> None:
        for name in REPORT_FILES:
            if name not in keep:
                _unlink_file(self._fd, name)
        if self._pages_fd is None:
            try:
                self._pages_fd = os.open(PAGES_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self._fd)
            except OSError:
                return  # no pages folder, or not one of ours: nothing of an earlier report to remove
        for name in os.listdir(self._pages_fd):
            if name.endswith(".html") and f"{PAGES_DIR}/{name}" not in keep:
                _unlink_file(self._pages_fd, name)

    def close(self) -> None:
        for fd in (self._pages_fd, self._fd):
            if fd is not None:
                os.close(fd)
        self._pages_fd = None

    def __enter__(self) -> ReportFolder:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None:
                try:
                    self.commit()
                except BaseException:
                    self.discard()
                    raise
            else:
                self.discard()
        finally:
            self.close()


def _unlink_quietly(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def _unlink_file(dir_fd: int, name: str) -> None:
    """Remove ``name`` when it is a file or a link (never a folder: that is not a report's)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)

"""Files that survive a crash: atomic writes, JSON that names itself when corrupt, folder locks.

A file written with :func:`atomic_write` is either the old content or the new one, never half
of either: the bytes go to a temporary file in the same folder, are flushed to disk
(``fsync``), renamed over the target (atomic on POSIX within one file system) and the folder
entry itself is flushed. :func:`read_json` raises :class:`CorruptFileError` naming the file
(a file truncated by a crash before this module was used, or edited by hand), so a resume can
say which file it redoes. :class:`FolderLock` keeps a second process out of a folder
(docs/main-job.md).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any


def user_cache_dir(name: str) -> Path:
    """The library's per-user cache folder ``name``: ``$XDG_CACHE_HOME/bpo_gym/<name>``, with
    ``~/.cache`` when ``XDG_CACHE_HOME`` is unset (each caller's own override comes first)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "bpo_gym" / name


class CorruptFileError(ValueError):
    """A file exists but does not hold what it should (truncated, or not JSON)."""

    def __init__(self, path: str | os.PathLike[str], why: str) -> None:
        self.path = Path(path)
        self.why = why
        super().__init__(f"{self.path} is corrupt ({why}): delete it to redo what wrote it")


class FolderLockedError(RuntimeError):
    """Another process holds the folder's lock."""


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Replace ``path`` with ``data`` (``str`` is written as UTF-8) so that a crash at any point
    leaves either the old file or the whole new one."""
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else bytes(data)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def write_json(path: str | os.PathLike[str], value: Any, *, indent: int | None = None) -> None:
    """:func:`atomic_write` of ``value`` as JSON."""
    atomic_write(path, json.dumps(value, indent=indent))


_MISSING = object()


def read_json(path: str | os.PathLike[str], default: Any = _MISSING) -> Any:
    """The JSON in ``path``; ``default`` when it does not exist (raises ``FileNotFoundError``
    without one). Raises :class:`CorruptFileError` naming the file when it cannot be parsed."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        if default is _MISSING:
            raise
        return default
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        why = "empty" if not raw else f"not JSON: {exc}"
        raise CorruptFileError(path, why) from None


def read_json_or_redo(path: str | os.PathLike[str], default: Any = None) -> Any:
    """The JSON in ``path``, or ``default`` when it is missing or corrupt; a corrupt file is
    named on stderr (its result is redone by the caller, which then overwrites it)."""
    try:
        return read_json(path, default)
    except CorruptFileError as exc:
        print(f"warning: {exc.path} is corrupt ({exc.why}); redoing it", file=sys.stderr)
        return default


class FolderLock:
    """An exclusive ``flock`` on ``folder/.lock`` while the ``with`` block runs.

    A second process asking for the same folder gets :class:`FolderLockedError` naming the
    holder's pid at once (no waiting). The kernel drops the lock when its holder exits, however
    it exits, so a crashed run never leaves a stale lock behind.
    """

    NAME = ".lock"

    def __init__(self, folder: str | os.PathLike[str], what: str = "another process") -> None:
        self.folder = Path(folder)
        self.what = what
        self._fd: int | None = None
        self._made_folder = False

    @property
    def path(self) -> Path:
        return self.folder / self.NAME

    def acquire(self) -> None:
        self._made_folder = not self.folder.exists()
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise FolderLockedError(
                    f"{self.folder} is in use by {self.what} (pid {holder}, lock {self.path}); "
                    "wait for it to finish or choose another folder"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Unlock; a folder this lock created and nothing else wrote to goes away with it (a run
        refused for bad input leaves nothing behind)."""
        if self._fd is not None:
            if self._made_folder and [p.name for p in self.folder.iterdir()] == [self.NAME]:
                self.path.unlink()
                self.folder.rmdir()
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

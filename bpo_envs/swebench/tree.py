"""The host's walks of a folder the agent shaped: measuring, scrubbing and removing it.

The agent decides the tree's shape (3,000 nested folders, 150,000 files in one folder, 255-byte
names, FIFOs, sockets, sparse files whose apparent size is far above their allocated blocks), so
nothing here recurses, follows a link, opens a file or builds a path longer than the kernel takes:

* :func:`walk` is the one walk of a tree the three below share;
* :func:`scan_tree` measures: each entry counts ``max(allocated blocks, apparent size,``
  :data:`INODE_BYTES` ``)`` (a sparse 1 GiB file costs 1 GiB: reading it costs that much), each
  hard-linked inode once; it notes the first path longer than :data:`MAX_PATH_BYTES` (and stops
  descending there), special files (FIFOs, sockets, devices: never read) and a folder it cannot
  read;
* :func:`remove_tree` removes a folder of any depth with at most :data:`MAX_OPEN_DIRS` open
  descriptors (deeper folders are moved up first), each step relative to an open folder
  descriptor and never through a link;
* :func:`scrub_changed` removes what changed since a time (by ``ctime``, which no process can
  set back), so that the snapshot store's stat cache re-reads only what it still has to.

Used by the local backend (docs/reliability.md#the-host-side-of-a-step), the docker backend's
quota watch and ``bpo-gym-setup clean``.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

INODE_BYTES = 4096
"""What a file, folder or link counts at least in the disk quota: an inode costs space even
when its file is empty (100,000 empty files are 400 MB of quota, not zero)."""
UNREADABLE = 1 << 62
"""The usage reported for a tree with a folder that cannot be read or a path past
:data:`MAX_PATH_BYTES`: over any quota (what cannot be measured cannot be allowed)."""
MAX_PATH_BYTES = 3072
"""The longest path below the sandbox's root the host records (bytes). The kernel takes paths of
at most 4,095 bytes and the host's tools name a file by its absolute path, the root's included;
git cannot add, check out or clean a longer one."""
SCRUB_DEPTH = 32
"""Folders deeper than this many levels that changed are handed to :func:`scrub_changed`'s
``discard`` whole (git's own walks slow down with the square of the depth)."""
MAX_OPEN_DIRS = 64
"""Folder descriptors :func:`remove_tree` holds at once (deeper folders are moved up first)."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)  # third-party: os, platform flag


@dataclass
class TreeScan:
    """What :func:`scan_tree` found.

    ``bytes``: the sum over entries of ``max(st_blocks * 512, st_size, INODE_BYTES)`` (folders:
    their blocks); ``entries``: files, folders and links counted; ``too_long``: the first path
    longer than :data:`MAX_PATH_BYTES` (None: none); ``special``: the first few FIFOs, sockets or
    devices; ``unreadable``: a folder that could not be read (None: none)."""

    bytes: int = 0
    entries: int = 0
    too_long: str | None = None
    special: tuple[str, ...] = ()
    unreadable: str | None = None

    @property
    def usage(self) -> int:
        """``bytes``, or :data:`UNREADABLE` when part of the tree could not be measured."""
        return UNREADABLE if self.unreadable is not None or self.too_long is not None else self.bytes


def entry_bytes(st: os.stat_result) -> int:
    """What one entry costs: its allocated blocks, its apparent size (a sparse file is read as
    that many bytes), at least :data:`INODE_BYTES`."""
    apparent = st.st_size if stat.S_ISREG(st.st_mode) else 0
    return max(st.st_blocks * 512, apparent, INODE_BYTES)


class UnreadableError(OSError):
    """A folder or entry :func:`walk` could not read (``path`` relative to the walk's root)."""

    def __init__(self, path: str) -> None:
        super().__init__(f"cannot read {path!r}")
        self.path = path


def path_bytes(path: str) -> int:
    """The length of ``path`` as the kernel counts it (bytes; undecodable names included)."""
    return len(path.encode("utf-8", "surrogateescape"))


def walk(root: str | os.PathLike[str], descend: Callable[[str, os.stat_result], bool],
         strict: bool = False) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry below ``root`` as ``(path relative to it, its lstat)``, each folder's entries
    before any folder below it is opened; a folder is entered only where ``descend(path, st)``,
    asked once the consumer has seen the folder itself, says so. No recursion (a stack of
    relative paths), no link followed, no file opened. An entry or folder removed meanwhile is
    skipped; any other ``OSError`` skips it too, or with ``strict`` raises
    :class:`UnreadableError`. The one walk :func:`scan_tree`, :func:`largest_files` and
    :func:`scrub_changed` share."""
    base = os.fspath(root)
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            entries = os.scandir(os.path.join(base, rel) if rel else base)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if strict:
                raise UnreadableError(rel or ".") from exc
            continue
        with entries:
            for entry in entries:
                path = f"{rel}/{entry.name}" if rel else entry.name
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    if strict:
                        raise UnreadableError(path) from exc
                    continue
                yield path, st
                if stat.S_ISDIR(st.st_mode) and descend(path, st):
                    stack.append(path)


def scan_tree(root: str | os.PathLike[str], stop_above: int | None = None, max_special: int = 8) -> TreeScan:
    """Measure ``root`` (see the module docstring); with ``stop_above``, stop once ``bytes``
    passes it (the answer is then over it, which is all a quota check needs). A folder removed
    meanwhile is skipped; the walk stops at the first path past :data:`MAX_PATH_BYTES`."""
    scan = TreeScan()
    seen: set[tuple[int, int]] = set()
    special: list[str] = []
    try:
        for path, st in walk(root, descend=lambda _path, _st: True, strict=True):
            if path_bytes(path) > MAX_PATH_BYTES:
                scan.too_long = path
                break
            mode = st.st_mode
            if st.st_nlink > 1 and not stat.S_ISDIR(mode):
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    continue
                seen.add(key)
            scan.entries += 1
            scan.bytes += entry_bytes(st)
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode)) and len(special) < max_special:
                special.append(path)
            if stop_above is not None and scan.bytes > stop_above:
                break
    except UnreadableError as exc:
        scan.unreadable = exc.path
    scan.special = tuple(special)
    return scan


def largest_files(root: str | os.PathLike[str], max_files: int = 10_000) -> list[tuple[int, str]]:
    """``(bytes, path)`` of the regular files below ``root`` (:func:`entry_bytes` each, paths
    relative to it), largest first; at most ``max_files`` of them, and none past
    :data:`MAX_PATH_BYTES`."""
    found = [(entry_bytes(st), path)
             for path, st in walk(root, descend=lambda path, _st: path_bytes(path) <= MAX_PATH_BYTES - 256)
             if stat.S_ISREG(st.st_mode)]
    found.sort(reverse=True)
    return found[:max_files]


def disk_usage(root: str | os.PathLike[str]) -> int:
    """Bytes ``root`` takes (:meth:`TreeScan.usage` of :func:`scan_tree`): apparent sizes
    count as allocated ones; :data:`UNREADABLE` when part of it cannot be measured."""
    return scan_tree(root).usage


def _open_dir(name: str, dir_fd: int) -> int | None:
    """An open descriptor of the folder ``name`` in ``dir_fd`` (made readable first when it is
    not), or None when ``name`` is not a folder (a link to one included) or is gone."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                return None
            os.chmod(name, 0o700, dir_fd=dir_fd)  # a folder (checked just above), not a link
            return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError:
            return None
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise


def _remove_below(top: int) -> None:
    """Empty the open folder ``top`` (closed by the caller)."""
    stack: list[tuple[int, str]] = []  # (descriptor of a parent folder, the name of the one below it)
    token = os.urandom(6).hex()
    moved = 0
    fd = top
    try:
        while True:
            descended = False
            with os.scandir(fd) as entries:
                for entry in entries:
                    try:
                        is_dir = entry.is_dir(follow_symlinks=False)
                    except OSError:
                        is_dir = False
                    if not is_dir:
                        try:
                            os.unlink(entry.name, dir_fd=fd)
                        except FileNotFoundError:
                            pass
                        continue
                    if len(stack) >= MAX_OPEN_DIRS:
                        # too deep to hold every parent open: move it up to the top, emptied later
                        moved += 1
                        os.rename(entry.name, f".bpo-rm-{token}-{moved}", src_dir_fd=fd, dst_dir_fd=top)
                        continue
                    child = _open_dir(entry.name, fd)
                    if child is None:
                        continue  # gone meanwhile, or cannot be opened: rmdir below says so
                    stack.append((fd, entry.name))
                    fd = child
                    descended = True
                    break
            if descended:
                continue
            if not stack:
                return
            parent, name = stack.pop()
            os.close(fd)
            fd = parent
            try:
                os.rmdir(name, dir_fd=parent)
            except FileNotFoundError:
                pass
    finally:
        if fd != top:
            os.close(fd)
        for parent, _ in stack:
            if parent != top:
                os.close(parent)


def remove_tree(path: str | os.PathLike[str], ignore_errors: bool = True) -> None:
    """Remove ``path`` and everything below it, whatever its depth (see the module docstring).
    A link is removed, never followed. ``ignore_errors=False``: raise ``OSError`` when something
    cannot be removed."""
    path = Path(path)
    try:
        parent = os.open(path.parent, _DIR_FLAGS & ~os.O_NOFOLLOW)
    except OSError:
        if ignore_errors:
            return
        raise
    try:
        top = _open_dir(path.name, parent)
        if top is None:
            try:
                os.unlink(path.name, dir_fd=parent)
            except FileNotFoundError:
                pass
            return
        try:
            _remove_below(top)
        finally:
            os.close(top)
        os.rmdir(path.name, dir_fd=parent)
    except OSError:
        if not ignore_errors:
            raise
    finally:
        os.close(parent)


def scrub_changed(root: str | os.PathLike[str], since: float,
                  discard: Callable[[str], None] = remove_tree) -> int:
    """Remove every file, link and special file below ``root`` whose ``ctime`` is ``since`` or
    later (what changed since then; a process cannot set ``ctime`` back), and hand to ``discard``
    (which removes it, now or later) every folder whose path is within 256 bytes of
    :data:`MAX_PATH_BYTES` and every changed one more than :data:`SCRUB_DEPTH` levels deep;
    other folders stay. Returns the entries removed."""

    def handed_whole(path: str, st: os.stat_result) -> bool:
        return (path_bytes(path) > MAX_PATH_BYTES - 256
                or (st.st_ctime >= since and path.count("/") >= SCRUB_DEPTH))

    base = os.fspath(root)
    removed = 0
    for path, st in walk(base, descend=lambda path, st: not handed_whole(path, st)):
        if stat.S_ISDIR(st.st_mode):
            if handed_whole(path, st):
                discard(os.path.join(base, path))
                removed += 1
        elif st.st_ctime >= since:
            try:
                os.unlink(os.path.join(base, path))
                removed += 1
            except OSError:
                pass
    return removed


class Trash:
    """A folder that takes trees to remove: :meth:`discard` moves one in (a rename: at once,
    whatever its size) and a background thread removes it; :meth:`empty` waits for that."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def discard(self, path: str | os.PathLike[str]) -> None:
        """Move ``path`` out of the way now; it is removed in the background."""
        try:
            os.rename(path, self.folder / os.urandom(8).hex())
        except OSError:
            remove_tree(path)  # another file system, or gone: remove it here
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._empty_all, daemon=True, name="bpo-swe-trash")
                self._thread.start()

    def _empty_all(self) -> None:
        while True:
            with self._lock:
                try:
                    names = os.listdir(self.folder)
                except OSError:
                    names = []
                if not names:
                    self._thread = None
                    return
            for name in names:
                remove_tree(self.folder / name)

    def empty(self) -> None:
        """Remove everything discarded (waiting for the background thread)."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join()
        for name in os.listdir(self.folder) if self.folder.is_dir() else ():
            remove_tree(self.folder / name)

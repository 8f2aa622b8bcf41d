"""Naming the data an env runs on, so that a result can say which data made it.

Each data-backed env has ``env.unwrapped.provenance() -> dict`` with at least ``env``,
``data_source`` (``"bundled-generator"`` or ``"data_dir"``), ``split`` and ``task_count``; a
bundled generator adds ``generator`` and ``generator_version``, user data adds ``data_dir`` and
``files_sha256`` (:func:`hash_files` of the files the env reads).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterable
from pathlib import Path

_CACHE: dict[tuple[str, ...], str] = {}
_LOCK = threading.Lock()


def hash_files(paths: Iterable[str | os.PathLike], root: str | os.PathLike | None = None) -> str:
    """SHA-256 over the files in the given order: each file's name (relative to ``root`` when
    given) and bytes. Cached per process by (path, size, mtime)."""
    files = [Path(p) for p in paths]
    base = Path(root) if root is not None else None
    key = tuple(f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
    with _LOCK:
        cached = _CACHE.get(key)
    if cached is not None:
        return cached
    digest = hashlib.sha256()
    for path in files:
        name = str(path.relative_to(base)) if base is not None else path.name
        digest.update(name.encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    value = digest.hexdigest()
    with _LOCK:
        _CACHE[key] = value
    return value

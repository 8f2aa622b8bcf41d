"""Files only this user's processes can have written: bytes sealed with an HMAC-SHA256 under a
per-user key, checked before anything of them is loaded (docs/snapshots.md#trust).

For the few files that must stay pickles (a whole policy object, the ALFWorld translation
cache): their content is only unpickled after :func:`unseal` has checked that a process
holding the user's key wrote it. The key lives in ``$BPO_GYM_KEY_FILE``, by default
``$XDG_CACHE_HOME/bpo_gym/user.key`` (``~/.cache/...``): 32 random bytes, created on first
use with mode 0600. Machines that share sealed files (a cluster) share the key file.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import tempfile
from pathlib import Path

from bpo_envs.files import user_cache_dir

MAGIC = b"BPO\x00SEAL1"
_DIGEST = hashlib.sha256().digest_size


class SealError(ValueError):
    """Bytes that are not sealed with this user's key (written elsewhere, or changed since)."""


def key_path() -> Path:
    """The user's key file: ``$BPO_GYM_KEY_FILE``, else ``$XDG_CACHE_HOME/bpo_gym/user.key``."""
    explicit = os.environ.get("BPO_GYM_KEY_FILE")
    if explicit:
        return Path(explicit).expanduser()
    return user_cache_dir("user.key")


def user_key() -> bytes:
    """The user's key, created (0600, 32 random bytes) when missing; refuses a key file that
    others can read or write, or that is too short.

    Creation is atomic: the key is written whole to a 0600 temporary file in the same folder,
    then hard-linked to its name, which fails when a key is there already. Another process
    therefore sees no key file or a whole one, never a partial one, and when several create it
    at once the first link wins and every one of them returns the key it holds."""
    path = key_path()
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(32))
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:  # another process linked its key first: that one is the key
            pass
    finally:
        os.unlink(temporary)
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    with open(path, "rb") as fh:
        mode = os.fstat(fh.fileno()).st_mode
        key = fh.read()
    if mode & 0o077:
        raise SealError(f"the key file {path} is readable or writable by others (mode {mode & 0o777:o}): chmod 600 it")
    if len(key) < 16:
        raise SealError(f"the key file {path} holds {len(key)} bytes, fewer than 16: delete it to make a new key")
    return key


def _tag(purpose: str, data: bytes) -> bytes:
    return hmac.new(user_key(), purpose.encode() + b"\x00" + data, hashlib.sha256).digest()


def seal(data: bytes, purpose: str) -> bytes:
    """``data`` with a tag that :func:`unseal` checks (``purpose`` names what the bytes are:
    bytes sealed for one purpose do not unseal for another)."""
    return MAGIC + _tag(purpose, data) + bytes(data)


def unseal(blob: bytes, purpose: str, what: str = "the file") -> bytes:
    """The data :func:`seal` sealed for ``purpose``; :class:`SealError` naming ``what`` when
    the bytes were not sealed with this user's key (nothing of them is interpreted)."""
    blob = bytes(blob)
    if not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + _DIGEST:
        raise SealError(f"{what} is not sealed by bpo_envs (it was written elsewhere or by an older version); "
                        "it is not loaded: delete it to have it made again")
    tag, data = blob[len(MAGIC) : len(MAGIC) + _DIGEST], blob[len(MAGIC) + _DIGEST :]
    if not hmac.compare_digest(tag, _tag(purpose, data)):
        raise SealError(f"{what} is not sealed with this user's key ({key_path()}) or was changed since; "
                        "it is not loaded: delete it to have it made again")
    return data

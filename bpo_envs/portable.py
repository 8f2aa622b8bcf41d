"""The data-only byte format of ``Snapshot.portable()`` and of every other state this package
takes as bytes (TRL's ``state`` column, SkyRL's ``extras["state"]``, the Ray pool's moves).

Decoding these bytes never runs code: they hold plain data only (``None``, booleans, numbers,
strings, lists, tuples, dicts, sets, bytes and numeric numpy arrays), rebuilt by a decoder that
knows no other type. A pickle is refused before anything of it is read (docs/snapshots.md#trust).

Layout, all integers big-endian::

    MAGIC (8 bytes) | version (u16) | header length (u32) | header (UTF-8 JSON) | blobs

The header is ``{"format": str, "payload": tree, "blobs": [length, ...]}``, where ``tree`` is
JSON whose scalars stand for themselves and whose containers are one-key objects tagged
``L`` (list), ``T`` (tuple), ``D`` (dict, as ``[key, value]`` pairs), ``S`` (frozenset),
``B`` (bytes: a blob index) or ``A`` (numpy array: ``[dtype, shape, blob index]``). Blobs
follow the header in order; their lengths must add up to the rest of the bytes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

MAGIC = b"BPO\x00DATA"
VERSION = 1
MAX_DEPTH = 256
"""Deepest nesting the decoder accepts (a bound on its recursion)."""
_HEAD = struct.Struct(">HI")
_ARRAY_KINDS = frozenset("biufcSU")  # numeric, bytes and str arrays: never object or void dtypes


class PortableFormatError(ValueError):
    """Bytes that are not this module's format, or that hold something it does not decode."""


def looks_like_pickle(blob: bytes | bytearray | memoryview) -> bool:
    """True for bytes that start as a pickle does (protocol 2+: ``0x80``; protocol 0/1 opcodes)."""
    head = bytes(blob[:2])
    return bool(head) and (head[0] == 0x80 or head[:1] in (b"(", b"c", b"}", b"]", b"K", b"I", b"N", b"S", b"V", b"X"))


def _encode(value: Any, blobs: list[bytes], depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise PortableFormatError(f"state nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, np.generic) and not isinstance(value, np.object_):
        return _encode(value.item(), blobs, depth)
    if isinstance(value, (bytes, bytearray, memoryview)):
        blobs.append(bytes(value))
        return {"B": len(blobs) - 1}
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in _ARRAY_KINDS:
            raise PortableFormatError(f"a numpy array of dtype {value.dtype} cannot travel as data")
        blobs.append(np.ascontiguousarray(value).tobytes())
        return {"A": [value.dtype.str, list(value.shape), len(blobs) - 1]}
    if isinstance(value, tuple):
        return {"T": [_encode(v, blobs, depth + 1) for v in value]}
    if isinstance(value, list):
        return {"L": [_encode(v, blobs, depth + 1) for v in value]}
    if isinstance(value, (frozenset, set)):
        return {"S": [_encode(v, blobs, depth + 1) for v in value]}
    if isinstance(value, Mapping):
        return {"D": [[_encode(k, blobs, depth + 1), _encode(v, blobs, depth + 1)] for k, v in value.items()]}
    raise PortableFormatError(
        f"{type(value).__qualname__} cannot travel in portable bytes (plain data only: convert it in the env's "
        "_portable_task_state)"
    )


def dumps(format: str, payload: Mapping[str, Any]) -> bytes:
    """``payload`` (plain data, see the module docstring) as bytes tagged ``format``."""
    blobs: list[bytes] = []
    header = {"format": format, "payload": _encode(dict(payload), blobs, 0), "blobs": [len(b) for b in blobs]}
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    return b"".join([MAGIC, _HEAD.pack(VERSION, len(text)), text, *blobs])


class _Decoder:
    def __init__(self, blobs: list[bytes]) -> None:
        self.blobs = blobs

    def blob(self, index: Any) -> bytes:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.blobs):
            raise PortableFormatError(f"blob index {index!r} out of range")
        return self.blobs[index]

    def value(self, node: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise PortableFormatError(f"nested deeper than {MAX_DEPTH} levels")
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if not isinstance(node, dict) or len(node) != 1:
            raise PortableFormatError(f"unexpected node {str(node)[:60]!r}")
        (tag, body), = node.items()
        if tag == "B":
            return self.blob(body)
        if tag == "A":
            return self.array(body)
        if not isinstance(body, list):
            raise PortableFormatError(f"node {tag!r} holds {type(body).__name__}, not a list")
        if tag == "L":
            return [self.value(v, depth + 1) for v in body]
        if tag == "T":
            return tuple(self.value(v, depth + 1) for v in body)
        if tag == "S":
            return frozenset(self.value(v, depth + 1) for v in body)
        if tag == "D":
            out = {}
            for pair in body:
                if not isinstance(pair, list) or len(pair) != 2:
                    raise PortableFormatError("a dict entry is not a [key, value] pair")
                out[self.value(pair[0], depth + 1)] = self.value(pair[1], depth + 1)
            return out
        raise PortableFormatError(f"unknown node tag {tag!r}")

    def array(self, body: Any) -> np.ndarray:
        if not (isinstance(body, list) and len(body) == 3 and isinstance(body[0], str) and isinstance(body[1], list)):
            raise PortableFormatError("an array node is not [dtype, shape, blob]")
        try:
            dtype = np.dtype(body[0])
        except TypeError as exc:
            raise PortableFormatError(f"unknown array dtype {body[0]!r}") from exc
        if dtype.kind not in _ARRAY_KINDS or dtype.hasobject:
            raise PortableFormatError(f"array dtype {dtype} is not plain data")
        shape = body[1]
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
            raise PortableFormatError(f"bad array shape {shape!r}")
        data = self.blob(body[2])
        if len(data) != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise PortableFormatError("array data does not match its dtype and shape")
        return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def loads(blob: bytes | bytearray | memoryview, format: str, what: str = "portable bytes") -> dict[str, Any]:
    """The payload of bytes :func:`dumps` made with ``format``; :class:`PortableFormatError`
    naming ``what`` for anything else (a pickle included: it is never unpickled)."""
    data = bytes(blob)
    if not data.startswith(MAGIC):
        if looks_like_pickle(data):
            raise PortableFormatError(
                f"{what}: these bytes are a pickle, which bpo_envs never loads (unpickling runs code the bytes name); "
                "take portable() bytes from this version of bpo_envs (docs/snapshots.md#trust)"
            )
        raise PortableFormatError(f"not {what}: the bytes do not start with the bpo_envs portable-format marker")
    if len(data) < len(MAGIC) + _HEAD.size:
        raise PortableFormatError(f"{what}: truncated header")
    version, length = _HEAD.unpack_from(data, len(MAGIC))
    if version != VERSION:
        raise PortableFormatError(f"{what}: format version {version}, this bpo_envs reads version {VERSION}")
    start = len(MAGIC) + _HEAD.size
    if start + length > len(data):
        raise PortableFormatError(f"{what}: truncated header")
    try:
        header = json.loads(data[start : start + length].decode())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise PortableFormatError(f"{what}: the header is not JSON ({exc})") from None
    if not isinstance(header, dict) or set(header) != {"format", "payload", "blobs"}:
        raise PortableFormatError(f"{what}: the header's fields are not format, payload and blobs")
    if header["format"] != format:
        raise PortableFormatError(f"not {what}: format {header['format']!r}, expected {format!r}")
    sizes = header["blobs"]
    if not isinstance(sizes, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes):
        raise PortableFormatError(f"{what}: bad blob lengths")
    offset = start + length
    if offset + sum(sizes) != len(data):
        raise PortableFormatError(f"{what}: {len(data) - offset} bytes of blobs, the header says {sum(sizes)}")
    blobs = []
    for n in sizes:
        blobs.append(data[offset : offset + n])
        offset += n
    payload = _Decoder(blobs).value(header["payload"], 0)
    if not isinstance(payload, dict):
        raise PortableFormatError(f"{what}: the payload is not a dict")
    return payload

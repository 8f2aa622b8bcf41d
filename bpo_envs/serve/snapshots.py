"""The server's snapshots: a bounded table from ids to :class:`~bpo_envs.core.Snapshot` objects.

Every snapshot lives in the server process and is named on the wire by a random id (nothing a
client sends is ever unpickled). The table holds at most ``cap`` snapshots; taking one more
evicts the oldest. A snapshot is freed when its owner session ends, when a client releases it,
or when it is evicted; asking for a freed id raises :class:`UnknownSnapshotError`, which says
whether the id was evicted (recently) or never existed here.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bpo_envs.core import Snapshot

DEFAULT_CAP = 10_000


class UnknownSnapshotError(KeyError):
    """No live snapshot has this id (never made here, evicted, released or its session ended)."""

    def __init__(self, snapshot_id: str, reason: str) -> None:
        super().__init__(snapshot_id)
        self.snapshot_id = snapshot_id
        self.reason = reason

    def __str__(self) -> str:
        return f"snapshot {self.snapshot_id!r} {self.reason}"


@dataclass(slots=True)
class Entry:
    snapshot: Snapshot
    owner: str
    reply: dict[str, Any]
    """The observation message of the state (what ``reset(snapshot_id=...)`` answers)."""
    episode_id: str | None
    steps: int


class SnapshotStore:
    """Id -> snapshot, at most ``cap`` of them, oldest evicted first.

    ``free(snapshot)`` is called for every snapshot that leaves the table (the server runs the
    release off its event loop). Not thread-safe: the server uses it from its event loop only.
    """

    def __init__(self, cap: int = DEFAULT_CAP, free: Callable[[Snapshot], None] = Snapshot.release) -> None:
        if cap < 1:
            raise ValueError(f"cap must be >= 1, got {cap}")
        self.cap = cap
        self._free = free
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self._by_owner: dict[str, set[str]] = {}
        self._gone: OrderedDict[str, str] = OrderedDict()  # recently freed id -> why
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, owner: str, snapshot: Snapshot, reply: dict[str, Any], episode_id: str | None = None, steps: int = 0) -> str:
        """Store ``snapshot`` for session ``owner``; returns its new id."""
        snapshot_id = secrets.token_hex(12)
        self._entries[snapshot_id] = Entry(snapshot, owner, reply, episode_id, steps)
        self._by_owner.setdefault(owner, set()).add(snapshot_id)
        while len(self._entries) > self.cap:
            oldest = next(iter(self._entries))
            self._drop(oldest, f"was evicted (the server keeps at most {self.cap} snapshots)")
            self.evicted += 1
        return snapshot_id

    def get(self, snapshot_id: Any) -> Entry:
        """The entry of a live id; raises :class:`UnknownSnapshotError` otherwise."""
        if not isinstance(snapshot_id, str):
            raise UnknownSnapshotError(str(snapshot_id), "is not a snapshot id (ids are strings)")
        entry = self._entries.get(snapshot_id)
        if entry is None:
            raise UnknownSnapshotError(snapshot_id, self._gone.get(snapshot_id, "is unknown to this server"))
        return entry

    def release(self, snapshot_id: str) -> None:
        """Free one snapshot now (unknown ids are ignored)."""
        if snapshot_id in self._entries:
            self._drop(snapshot_id, "was released by a client")

    def release_owner(self, owner: str) -> int:
        """Free every snapshot of session ``owner`` (it ended); returns how many."""
        ids = self._by_owner.pop(owner, set())
        for snapshot_id in ids:
            self._drop(snapshot_id, "was freed when the session that took it ended")
        return len(ids)

    def _drop(self, snapshot_id: str, why: str) -> None:
        entry = self._entries.pop(snapshot_id)
        owned = self._by_owner.get(entry.owner)
        if owned is not None:
            owned.discard(snapshot_id)
        self._gone[snapshot_id] = why
        while len(self._gone) > 4 * self.cap:
            self._gone.popitem(last=False)
        self._free(entry.snapshot)

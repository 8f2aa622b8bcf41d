"""The server's snapshots: a bounded table from ids to :class:`~bpo_envs.core.Snapshot` objects.

Every snapshot lives in the server process and is named on the wire by a random id (nothing a
client sends is ever unpickled). Each session (the *owner*) keeps at most ``owner_cap`` of its
own snapshots and the table at most ``cap`` in all; a session that takes one more evicts its
own oldest, never another session's (docs/serving.md). Where the table is full and the session
holds none to evict, the new snapshot is refused (:class:`SnapshotTableFull`). A snapshot is
freed when its owner session ends, when a client releases it, or when it is evicted; asking for
a freed id raises :class:`UnknownSnapshotError`, which says whether the id was evicted
(recently) or never existed here.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bpo_envs.core import Snapshot
from bpo_envs.serve.protocol import MAX_ID_CHARS, shown

DEFAULT_CAP = 10_000
DEFAULT_OWNER_CAP = 1_000
"""Snapshots one session keeps by default (a tree search holds tens to hundreds at a time)."""


class UnknownSnapshotError(KeyError):
    """No live snapshot has this id (never made here, evicted, released or its session ended)."""

    def __init__(self, snapshot_id: str, reason: str) -> None:
        super().__init__(snapshot_id)
        self.snapshot_id = snapshot_id
        self.reason = reason

    def __str__(self) -> str:
        return f"snapshot {shown(self.snapshot_id)} {self.reason}"


class SnapshotTableFull(RuntimeError):
    """The table holds ``cap`` snapshots and the asking session none of them: nothing of its own
    to evict, and another session's snapshots are never evicted."""


@dataclass(slots=True)
class Entry:
    snapshot: Snapshot
    owner: str
    reply: dict[str, Any]
    """The observation message of the state (what ``reset(snapshot_id=...)`` answers)."""
    episode_id: str | None
    steps: int


class SnapshotStore:
    """Id -> snapshot: at most ``owner_cap`` per owner session, ``cap`` in all; an owner's
    oldest is evicted first, and only by that owner.

    ``free(snapshot)`` is called for every snapshot that leaves the table (the server runs the
    release off its event loop where the env's calls may block). Not thread-safe: the server
    uses it from its event loop only.
    """

    def __init__(
        self, cap: int = DEFAULT_CAP, free: Callable[[Snapshot], None] = Snapshot.release, owner_cap: int | None = None
    ) -> None:
        owner_cap = min(DEFAULT_OWNER_CAP, cap) if owner_cap is None else owner_cap
        if cap < 1 or owner_cap < 1:
            raise ValueError(f"snapshot caps must be >= 1, got cap={cap}, owner_cap={owner_cap}")
        self.cap = cap
        self.owner_cap = min(owner_cap, cap)
        self._free = free
        self._entries: dict[str, Entry] = {}
        self._by_owner: dict[str, dict[str, None]] = {}  # owner -> its ids, oldest first
        self._gone: OrderedDict[str, str] = OrderedDict()  # recently freed id -> why
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    def owned(self, owner: str) -> int:
        """How many snapshots session ``owner`` holds."""
        return len(self._by_owner.get(owner, ()))

    def put(self, owner: str, snapshot: Snapshot, reply: dict[str, Any], episode_id: str | None = None, steps: int = 0) -> str:
        """Store ``snapshot`` for session ``owner``; returns its new id. Evicts the owner's own
        oldest snapshots to stay within both caps; raises :class:`SnapshotTableFull` (and frees
        ``snapshot``) where the table is full and the owner holds none."""
        owned = self._by_owner.setdefault(owner, {})
        while owned and (len(owned) >= self.owner_cap or len(self._entries) >= self.cap):
            why = (f"a session keeps at most {self.owner_cap}" if len(owned) >= self.owner_cap
                   else f"the server keeps at most {self.cap}")
            self._drop(next(iter(owned)), f"was evicted ({why} snapshots; this was its session's oldest)")
            self.evicted += 1
        if len(self._entries) >= self.cap:
            self._free(snapshot)
            raise SnapshotTableFull(
                f"the server holds its maximum of {self.cap} snapshots, none of them this session's; "
                "try again after other sessions release theirs"
            )
        snapshot_id = secrets.token_hex(12)
        self._entries[snapshot_id] = Entry(snapshot, owner, reply, episode_id, steps)
        owned[snapshot_id] = None
        return snapshot_id

    def get(self, snapshot_id: Any) -> Entry:
        """The entry of a live id; raises :class:`UnknownSnapshotError` otherwise."""
        if not isinstance(snapshot_id, str) or len(snapshot_id) > MAX_ID_CHARS:
            raise UnknownSnapshotError(
                shown(snapshot_id), f"is not a snapshot id (ids are strings of at most {MAX_ID_CHARS} characters)"
            )
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
        ids = list(self._by_owner.pop(owner, ()))
        for snapshot_id in ids:
            self._drop(snapshot_id, "was freed when the session that took it ended")
        return len(ids)

    def release_all(self) -> int:
        """Free every snapshot (the server shuts down); returns how many."""
        owners = list(self._by_owner)
        return sum(self.release_owner(owner) for owner in owners)

    def _drop(self, snapshot_id: str, why: str) -> None:
        entry = self._entries.pop(snapshot_id)
        owned = self._by_owner.get(entry.owner)
        if owned is not None:
            owned.pop(snapshot_id, None)
        self._gone[snapshot_id] = why
        while len(self._gone) > 4 * self.cap:
            self._gone.popitem(last=False)
        self._free(entry.snapshot)

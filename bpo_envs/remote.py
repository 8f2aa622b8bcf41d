"""``BPO-Remote-v0``: a Gymnasium env whose steps run on a ``bpo-serve`` server (docs/serving.md).

``RemoteEnv(base_url)`` opens one OpenEnv session (a WebSocket to ``base_url/ws``) and behaves as
the served env: ``reset``/``step`` return what the env returned there (``info`` rebuilt from the
observation's fields), and ``snapshot()``/``restore()`` keep the snapshot contract
(docs/snapshots.md) with server-side snapshots named by id: a snapshot of one ``RemoteEnv``
restores into any ``RemoteEnv`` of the same server. ``portable()`` is a small JSON document
naming the server and the id (valid while the server keeps that snapshot); nothing is pickled.
Released snapshots are freed on the server with the next message.
"""

from __future__ import annotations

import json
import urllib.request
from contextlib import ExitStack
from typing import Any

import gymnasium as gym
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from bpo_envs.capabilities import ForwardedCapabilities
from bpo_envs.core import ResetNeeded, Snapshot, SnapshotError, SnapshotKindError, SnapshotSupport
from bpo_envs.serve.protocol import dumps, info_from_observation, loads
from bpo_envs.text import ACTION_MAX_LENGTH, OBSERVATION_MAX_LENGTH, text_space

PORTABLE_FORMAT = "bpo-remote-snapshot/1"
ENV_ID = "BPO-Remote-v0"


def describe_server(base_url: str, timeout: float = 30.0, token: str | None = None) -> dict[str, Any]:
    """The server's ``/health``: ``env_id``, ``env_kwargs``, sessions, snapshots, ... (a server
    with a bearer token shows ``env_kwargs`` only to a request that sends it)."""
    url = _ws_url(base_url).replace("ws://", "http://", 1).replace("wss://", "https://", 1).removesuffix("/ws")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url + "/health", headers=headers), timeout=timeout) as reply:
        return json.loads(reply.read())


class RemoteEnvError(RuntimeError):
    """The server answered with an error message (``code`` is OpenEnv's error code)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(f"{message} (code: {code})")
        self.code = code


class RemoteSnapshotError(RemoteEnvError, SnapshotError):
    """The server does not hold the snapshot (unknown, evicted, or its session ended)."""


class RemoteSnapshot(Snapshot):
    """A snapshot held by the server; ``state`` is its id."""

    __slots__ = ()

    def portable(self) -> bytes:
        owner = self.origin
        server = owner.ws_url if owner is not None else self.kind[1]
        payload = {"format": PORTABLE_FORMAT, "server": server, "snapshot_id": self.state, "wrappers": self.wrapper_states}
        try:
            return json.dumps(payload).encode()
        except TypeError as exc:
            raise SnapshotError(f"a wrapper above the RemoteEnv has state JSON cannot carry: {exc}") from exc


def _ws_url(base_url: str) -> str:
    url = base_url.rstrip("/")
    for http, ws in (("http://", "ws://"), ("https://", "wss://")):
        if url.startswith(http):
            url = ws + url[len(http) :]
    if not url.startswith(("ws://", "wss://")):
        url = "ws://" + url
    return url if url.endswith("/ws") else url + "/ws"


class RemoteEnv(SnapshotSupport, ForwardedCapabilities, gym.Env[str, str]):
    """One session of a served env.

    It forwards the served env's declarations (docs/envs.md): the constant ones and
    ``provenance()`` come with one ``capabilities`` message, sent after the first ``reset`` (or at
    the first read before it); ``task_ids()``
    and ``expert_actions()`` ask the server each time. ``step_may_block`` is its own, True: every
    call waits on the network. ``sample_action`` is not forwarded (the caller's rng stays here):
    None, the default.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000`` (``ws://`` works too).
        token: the server's bearer token (``bpo-serve`` reads it from ``$BPO_SERVE_TOKEN``).
        timeout: seconds to wait for an answer (a SWE-bench step may take minutes).
        connect_timeout: seconds to wait for the connection.
    """

    metadata = {"render_modes": [], "render_fps": 1}

    def __init__(
        self, base_url: str, *, token: str | None = None, timeout: float = 900.0, connect_timeout: float = 30.0
    ) -> None:
        super().__init__()
        self.ws_url = _ws_url(base_url)
        self.observation_space = text_space(OBSERVATION_MAX_LENGTH)
        self.action_space = text_space(ACTION_MAX_LENGTH)
        self._timeout = timeout
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self._connection = ExitStack()  # websockets wants its connection used as a context manager
        self._ws: ClientConnection | None = self._connection.enter_context(connect(
            self.ws_url, additional_headers=headers, open_timeout=connect_timeout,
            max_size=None, compression=None,
        ))
        self._releases: list[str] = []
        self._done = True
        self._started = False
        self._capabilities: dict[str, Any] | None = None

    # ---- wire ----------------------------------------------------------------------------
    def _send(self, message: dict[str, Any]) -> None:
        if self._ws is None:
            raise RuntimeError("this RemoteEnv is closed")
        if self._releases:
            ids, self._releases = self._releases, []
            self._ws.send(dumps({"type": "release", "data": {"snapshot_ids": ids}}))
        self._ws.send(dumps(message))

    def _call(self, message: dict[str, Any]) -> dict[str, Any]:
        self._send(message)
        try:
            reply = loads(self._ws.recv(timeout=self._timeout))
        except TimeoutError:
            raise RemoteEnvError(f"no answer from {self.ws_url} within {self._timeout:g} s", "TIMEOUT") from None
        except ConnectionClosed as exc:
            raise RemoteEnvError(f"the server closed the session: {exc}", "SESSION_CLOSED") from exc
        if reply.get("type") == "error":
            data = reply.get("data") or {}
            kind = RemoteSnapshotError if "snapshot_id" in data else RemoteEnvError
            raise kind(str(data.get("message")), str(data.get("code")))
        return reply["data"]

    def _observe(self, data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        observation = data["observation"]
        self._done = bool(data["done"])
        self._started = True
        return observation["text"], info_from_observation(observation)

    # ---- gymnasium -----------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        unknown = set(options) - {"task_id"}
        if unknown:
            raise ValueError(f"unknown reset option(s) {sorted(unknown)}; supported: ['task_id']")
        data: dict[str, Any] = {}
        if seed is not None:
            data["seed"] = seed
        if options.get("task_id") is not None:
            data["task_id"] = options["task_id"]
        result = self._observe(self._call({"type": "reset", "data": data}))
        self._declared()  # with the first reset, so that a later read never talks over a step in flight
        return result

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not self._started:
            raise ResetNeeded("call reset() before step()")
        if self._done:
            raise ResetNeeded("the episode has ended; call reset() (or restore a snapshot)")
        if isinstance(action, bytes | bytearray):
            action = bytes(action).decode("utf-8", errors="replace")
        if not isinstance(action, str):
            raise TypeError(f"action must be a str, got {type(action).__name__}")
        data = self._call({"type": "step", "data": {"text": action}})
        obs, info = self._observe(data)
        truncated = bool(data["observation"].get("truncated"))
        terminated = self._done and not truncated
        return obs, float(data.get("reward") or 0.0), terminated, truncated, info

    def close(self) -> None:
        if self._ws is not None:
            try:
                self._send({"type": "close"})
                self._connection.close()
            except Exception:  # noqa: BLE001 - the server may be gone already
                pass
            self._ws = None
        super().close()

    # ---- the served env's declarations ---------------------------------------------------
    def _declared(self) -> dict[str, Any]:
        if self._capabilities is None:
            self._capabilities = self._call({"type": "capabilities"})
        return self._capabilities

    def provenance(self) -> dict[str, Any] | None:
        return self._declared()["provenance"]

    def task_ids(self) -> list[Any] | None:
        """The served env's task ids (None where it declares no fixed list)."""
        ids = self._call({"type": "task_ids"})["task_ids"]
        return None if ids is None else list(ids)

    def expert_actions(self) -> list[str]:
        """The served env's expert actions from the current state."""
        return list(self._call({"type": "expert_actions"})["actions"])

    # ---- snapshots -----------------------------------------------------------------------
    def _snapshot_kind(self) -> tuple[str, str]:
        return (ENV_ID, self.ws_url)

    def snapshot(self) -> Snapshot:
        if not self._started:
            raise SnapshotError("call reset() before snapshot()")
        snapshot_id = self._call({"type": "state"})["snapshot_id"]
        return RemoteSnapshot(self, self._snapshot_kind(), snapshot_id)

    @staticmethod
    def _decode_portable(blob: bytes | bytearray | memoryview) -> dict[str, Any]:
        try:
            payload = json.loads(bytes(blob))
        except ValueError as exc:
            raise SnapshotError(f"not a portable remote snapshot: {exc}") from exc
        if not isinstance(payload, dict) or payload.get("format") != PORTABLE_FORMAT:
            raise SnapshotError("not a portable remote snapshot (unknown format)")
        return payload

    def _portable_wrapper_states(self, blob: bytes | bytearray | memoryview) -> tuple[tuple[str, dict[str, Any]], ...]:
        return tuple((name, state) for name, state in self._decode_portable(blob).get("wrappers", ()))

    def restore(self, snapshot: Snapshot | bytes) -> None:
        if isinstance(snapshot, bytes | bytearray | memoryview):
            payload = self._decode_portable(snapshot)
            kind, snapshot_id = (ENV_ID, payload.get("server")), payload.get("snapshot_id")
        elif isinstance(snapshot, Snapshot):
            kind, snapshot_id = snapshot.kind, snapshot.state
        else:
            raise TypeError(f"restore() takes a Snapshot or portable bytes, not {type(snapshot).__name__}")
        if kind != self._snapshot_kind():
            raise SnapshotKindError(f"snapshot of {kind!r} cannot be restored into {self._snapshot_kind()!r}")
        self._observe(self._call({"type": "reset", "data": {"snapshot_id": snapshot_id}}))

    def _release_state(self, state: Any) -> None:
        self._releases.append(state)  # sent with the next message (never from a finaliser)


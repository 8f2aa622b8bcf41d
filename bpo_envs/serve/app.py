"""The ASGI app that serves one registered env over OpenEnv's protocol (docs/serving.md).

Routes: ``/ws`` (one env session per WebSocket, OpenEnv's messages), ``/health``, ``/metadata``
and ``/schema`` (OpenEnv's), and ``/mcp``, which answers every JSON-RPC call with "method not
found" (the env is offered as a simulation over ``/ws``, not as MCP tools). Limits: at most
``max_sessions`` sessions (at capacity a newcomer takes the slot of the session silent longest,
where one has been silent ``evict_idle_after`` seconds; otherwise it is refused with
``CAPACITY_REACHED``), an idle timeout, a per-step deadline, a message-size limit and size limits
on every field, snapshot caps (per session and in all), connection read timeouts and a
connection cap (:mod:`.connections`), and an optional bearer token asked of every WebSocket and
of ``/health``'s env kwargs.

Envs are made lazily in the thread pool and kept for reuse when a session ends cleanly (a
new session must reset before it steps). Every env of the process shares what the env kind
shares per process (WebShop: one catalog and search index).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import gymnasium as gym
from fastapi import FastAPI, Request
from starlette.types import Receive, Send

import bpo_envs
from bpo_envs.core import Snapshot
from bpo_envs.serve.connections import ConnectionGuard, connection_cap
from bpo_envs.serve.protocol import WSErrorCode, dumps, error, json_safe, loads, shown
from bpo_envs.serve.session import DeadlineExceeded, EnvCalls, Session, runs_inline
from bpo_envs.serve.snapshots import (
    DEFAULT_CAP,
    DEFAULT_OWNER_CAP,
    SnapshotStore,
    SnapshotTableFull,
    UnknownSnapshotError,
)

log = logging.getLogger(__name__)
CLOSE_POLICY = 1008  # WebSocket close codes: policy violation (bad token)
CLOSE_TRY_LATER = 1013


@dataclass
class ServeConfig:
    """What ``bpo-serve`` serves and its limits."""

    env_id: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    max_sessions: int = 64
    idle_timeout: float | None = 600.0
    """Seconds a session may stay silent before the server closes it (None: never)."""
    step_deadline: float | None = 600.0
    """Seconds one env call may take before its session is closed (None: no deadline)."""
    max_message_bytes: int = 1 << 20
    snapshot_cap: int = DEFAULT_CAP
    token: str | None = None
    """When set, every WebSocket must send ``Authorization: Bearer <token>``, and ``/health`` shows
    the env kwargs only to a request that sends it."""
    threads: int | None = None
    """Threads running env calls (default: ``max_sessions``)."""
    inline: bool = True
    """Call an env that declares ``step_may_block = False`` on the event loop (no thread hand-off;
    ``bpo_envs.serve.session.runs_inline``); False: every env in the thread pool."""
    session_snapshot_cap: int = DEFAULT_OWNER_CAP
    """Snapshots one session keeps (its own oldest evicted first; never another session's)."""
    evict_idle_after: float | None = 30.0
    """At ``max_sessions``, a newcomer takes the slot of the session silent longest, where that
    one has been silent this many seconds (None: never; the newcomer is refused)."""
    max_connections: int | None = None
    """Open connections at most (default ``max_sessions`` + 256, below the file limit;
    ``bpo_envs.serve.connections.connection_cap``)."""
    header_timeout: float = 10.0
    """Seconds a connection may take to send a request's headers."""
    body_timeout: float = 30.0
    """Seconds a request's body may take to arrive after its headers."""

    def __post_init__(self) -> None:
        if self.env_id not in gym.registry:
            raise ValueError(f"unknown env id {self.env_id!r}; registered: {sorted(bpo_envs.ENV_IDS)}")
        for name in ("max_sessions", "max_message_bytes", "snapshot_cap", "session_snapshot_cap"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("header_timeout", "body_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        self.max_connections = connection_cap(self.max_sessions, self.max_connections)


class EnvServer:
    """Sessions, envs and snapshots of one served env kind (used from its event loop)."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.executor = ThreadPoolExecutor(config.threads or config.max_sessions, thread_name_prefix="bpo-serve")
        self.store = SnapshotStore(config.snapshot_cap, free=self._free_snapshot, owner_cap=config.session_snapshot_cap)
        self.calls = EnvCalls(self.executor, config.step_deadline, inline=False)  # set by the first env made
        self.guard = ConnectionGuard(config.max_connections, config.header_timeout, config.body_timeout)
        self.sessions: dict[str, Session | None] = {}
        self._idle_envs: list[gym.Env] = []
        self._inline_decided = False
        self._closing = False
        self.refused = 0
        self.answered: Counter[str] = Counter()
        """Messages answered, by type (``/health``)."""
        self.sessions_total = 0
        self.closed_idle = 0
        self.evicted_idle = 0
        self.deadline_exceeded = 0

    def make_env(self) -> gym.Env:
        env = gym.make(self.config.env_id, **self.config.env_kwargs)
        if not self._inline_decided:  # the env's declared capability, read from its class
            self.calls.inline = self.config.inline and runs_inline(env)
            self._inline_decided = True
        return env

    def warm(self) -> None:
        """Make one env now (bad kwargs fail here, not in the first session) and keep it."""
        self._idle_envs.append(self.make_env())

    def _free_snapshot(self, snap: Snapshot) -> None:
        if self.calls.inline or self._closing:
            snap.release()
        else:
            self.executor.submit(snap.release)

    async def _acquire(self) -> gym.Env:
        if self._idle_envs:
            return self._idle_envs.pop()
        return await asyncio.get_running_loop().run_in_executor(self.executor, self.make_env)

    async def _end(self, session: Session) -> None:
        """Free the session's snapshots; reuse its env, or close it once its last call returns."""
        self.store.release_owner(session.id)
        self.sessions.pop(session.id, None)
        env = session.env
        if self._closing:  # the server shuts down (its pool too): close the env here
            try:
                env.close()
            except Exception:  # noqa: BLE001 - shutting down: the rest still closes
                log.warning("closing an env at shutdown failed", exc_info=True)
            return
        if session.broken or len(self._idle_envs) >= self.config.max_sessions:
            if session.pending is not None and not session.pending.done():
                await asyncio.wait([session.pending])
            await asyncio.get_running_loop().run_in_executor(self.executor, env.close)
        else:
            self._idle_envs.append(env)

    def close(self) -> None:
        """Shut down: free every snapshot and close every env (the server stops; a SWE-bench env
        removes its sandbox files here)."""
        self._closing = True
        self.store.release_all()
        envs = self._idle_envs + [s.env for s in self.sessions.values() if s is not None]
        self._idle_envs.clear()
        for env in envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - close the rest
                log.warning("closing an env at shutdown failed", exc_info=True)
        self.executor.shutdown(wait=False, cancel_futures=True)

    def health(self, authorized: bool = True) -> dict[str, Any]:
        """``/health``; the env kwargs only where ``authorized`` (the token was sent, or none is set)."""
        report = {
            "status": "healthy",  # OpenEnv's HealthStatus.HEALTHY
            "env_id": self.config.env_id,
            "env_kwargs": json_safe(self.config.env_kwargs),
            "sessions": len(self.sessions),
            "max_sessions": self.config.max_sessions,
            "snapshots": len(self.store),
            "snapshot_cap": self.config.snapshot_cap,
            "session_snapshot_cap": self.store.owner_cap,
            "snapshots_evicted": self.store.evicted,
            "sessions_total": self.sessions_total,
            "answered": dict(self.answered),
            "refused": self.refused,
            "closed_idle": self.closed_idle,
            "evicted_idle": self.evicted_idle,
            "deadline_exceeded": self.deadline_exceeded,
            "env_calls_inline": self.calls.inline,
            "max_connections": self.guard.max_connections,
            **self.guard.counts(),
        }
        if not authorized:
            del report["env_kwargs"]
        return report

    def authorized(self, scope: dict[str, Any]) -> bool:
        """Whether a request or WebSocket sent the bearer token (always, where none is set)."""
        if self.config.token is None:
            return True
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"")
        return hmac.compare_digest(header, f"Bearer {self.config.token}".encode())

    def _evict_idlest(self) -> bool:
        """At capacity: end the session silent longest, where it has been silent
        ``evict_idle_after`` seconds, and free its slot now; False where none qualifies."""
        after = self.config.evict_idle_after
        if after is None:
            return False
        waiting = [s for s in self.sessions.values() if s is not None and s.waiting and s.stop_reason is None]
        if not waiting:
            return False
        victim = min(waiting, key=lambda s: s.idle_since)
        silent = asyncio.get_running_loop().time() - victim.idle_since
        if silent < after or not victim.stop(
            f"closed to make room: the server is at its session limit ({self.config.max_sessions}) "
            f"and this session was the one silent longest ({silent:.0f} s)"
        ):
            return False
        self.sessions.pop(victim.id, None)
        self.evicted_idle += 1
        return True

    def _check_idle(self, session: Session) -> None:
        """The idle timeout, checked lazily: one timer per session, re-armed for the session's
        last message when it fires (no timer work per message)."""
        timeout = self.config.idle_timeout
        session.idle_timer = None
        if timeout is None or session.stop_reason is not None:
            return
        loop = asyncio.get_running_loop()
        if session.waiting and loop.time() - session.idle_since >= timeout:
            if session.stop(f"closed after {timeout:g} s without a message"):
                self.closed_idle += 1
                return
        due = (session.idle_since if session.waiting else loop.time()) + timeout
        session.idle_timer = loop.call_at(due, self._check_idle, session)

    async def serve(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """One WebSocket (raw ASGI: no per-message middleware): one session, messages answered
        in order until close or disconnect."""
        if (await receive())["type"] != "websocket.connect":
            return
        if not self.authorized(scope):
            await send({"type": "websocket.close", "code": CLOSE_POLICY, "reason": "missing or wrong bearer token"})
            return
        await send({"type": "websocket.accept"})
        if len(self.sessions) >= self.config.max_sessions and not self._evict_idlest():
            self.refused += 1
            after = self.config.evict_idle_after
            silent = "" if after is None else f" and no session has been silent {after:g} s"
            message = f"the server is at its session limit ({self.config.max_sessions}){silent}; try again later"
            await _send_text(send, error(
                WSErrorCode.CAPACITY_REACHED, message,
                active_sessions=len(self.sessions), max_sessions=self.config.max_sessions,
            ))
            await send({"type": "websocket.close", "code": CLOSE_TRY_LATER})
            return
        session_id = uuid.uuid4().hex
        self.sessions[session_id] = None  # holds the slot while the env is made
        try:
            env = await self._acquire()
        except Exception as exc:  # noqa: BLE001 - reported to the client, the server goes on
            self.sessions.pop(session_id, None)
            await _send_text(send, error(WSErrorCode.FACTORY_ERROR, f"could not make {self.config.env_id}: {exc}"))
            await send({"type": "websocket.close", "code": 1011})
            return
        session = Session(session_id, env, self.calls, self.store)
        self.sessions[session_id] = session
        self.sessions_total += 1
        closed = False
        try:
            closed = await self._loop(receive, send, session)
        except Exception as exc:  # noqa: BLE001 - a vanished client or a broken frame ends one session only
            log.debug("session %s ended: %r", session_id, exc)
        finally:
            await self._end(session)
            if not closed:
                try:
                    await send({"type": "websocket.close", "code": 1000})
                except Exception:  # noqa: BLE001 - already closed
                    pass

    async def _loop(self, receive: Receive, send: Send, session: Session) -> bool:
        """Answer messages until the session ends; True when the client disconnected."""
        limit = self.config.max_message_bytes
        loop = asyncio.get_running_loop()
        try:
            # one Timeout for the whole session, rescheduled only by Session.stop while it waits
            async with asyncio.timeout(None) as session.stopper:
                self._check_idle(session)
                while True:
                    session.idle_since = loop.time()
                    session.waiting = True
                    message = await receive()
                    session.waiting = False
                    if session.stop_reason is not None:  # a message that came as it was stopped
                        break
                    if message["type"] == "websocket.disconnect":
                        return True
                    raw = message.get("text")
                    if raw is None:
                        raw = message.get("bytes") or b""
                    if len(raw) > limit:
                        reply: dict[str, Any] | None = error(
                            WSErrorCode.VALIDATION_ERROR, f"message of {len(raw)} bytes is over the server's limit of {limit}"
                        )
                    else:
                        reply = await self._answer(session, raw)
                        if reply is _CLOSE:
                            return False
                    if reply is not None:
                        await _send_text(send, reply)
                    if session.broken:
                        return False
        except TimeoutError:
            if session.stop_reason is None:
                raise
        finally:
            session.waiting = False
            if session.idle_timer is not None:
                session.idle_timer.cancel()
        await _send_text(send, error(WSErrorCode.SESSION_ERROR, session.stop_reason))
        return False

    async def _answer(self, session: Session, raw: str | bytes) -> dict[str, Any] | None:
        """The reply to one raw message (None: no reply), counted by message type in ``/health``."""
        try:
            message = loads(raw)
        except ValueError as exc:
            self.answered["error"] += 1
            return error(WSErrorCode.INVALID_JSON, f"Invalid JSON: {exc}")
        if not isinstance(message, dict):
            self.answered["error"] += 1
            return error(WSErrorCode.VALIDATION_ERROR, "a message is a JSON object with a 'type'")
        kind = message.get("type")
        reply = await self._dispatch(session, kind, message.get("data"))
        self.answered["error" if reply is not None and reply["type"] == "error" else str(kind)] += 1
        return reply

    async def _dispatch(self, session: Session, kind: Any, data: Any) -> dict[str, Any] | None:
        try:
            if kind == "step":
                return await session.step(data)
            if kind == "reset":
                return await session.reset(data or {})
            if kind == "state":
                return await session.state()
            if kind == "close":
                return _CLOSE
            if kind == "task_ids":
                return await session.task_ids()
            if kind == "expert_actions":
                return await session.expert_actions()
            if kind == "capabilities":
                return await session.capabilities()
            if kind == "release":
                ids = data.get("snapshot_ids") if isinstance(data, dict) else None
                for snapshot_id in ids if isinstance(ids, list) else []:
                    if isinstance(snapshot_id, str):
                        self.store.release(snapshot_id)
                return None
            return error(WSErrorCode.UNKNOWN_TYPE, f"Unknown message type: {shown(kind)}; the types are reset, step, state, close, "
                         "release, task_ids, expert_actions, capabilities")
        except UnknownSnapshotError as exc:
            return error(WSErrorCode.VALIDATION_ERROR, str(exc), snapshot_id=exc.snapshot_id)
        except SnapshotTableFull as exc:
            return error(WSErrorCode.CAPACITY_REACHED, str(exc))
        except DeadlineExceeded as exc:
            self.deadline_exceeded += 1
            return error(WSErrorCode.EXECUTION_ERROR, str(exc))
        except Exception as exc:  # noqa: BLE001 - the env's error goes back to its client
            return error(WSErrorCode.EXECUTION_ERROR, f"{type(exc).__name__}: {exc}")


_CLOSE: dict[str, Any] = {"type": "close"}


async def _send_text(send: Send, message: dict[str, Any]) -> None:
    await send({"type": "websocket.send", "text": dumps(message)})


class ServedApp:
    """The ASGI app: ``/ws`` goes straight to :meth:`EnvServer.serve`, the rest to FastAPI
    (``http``: ``/health``, ``/metadata``, ``/schema``, ``/mcp``, ``/openapi.json``)."""

    def __init__(self, server: EnvServer, http: FastAPI) -> None:
        self.server = server
        self.http = http

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and scope["path"].rstrip("/") == "/ws":
            await self.server.serve(scope, receive, send)
        else:
            await self.http(scope, receive, send)


def _package_version() -> str:
    try:
        return version("bpo-gym")
    except PackageNotFoundError:  # pragma: no cover - a source checkout without install
        return "0"


def _schemas() -> dict[str, Any]:
    from bpo_envs.serve.models import schemas  # openenv-core: seconds to import, so only when asked

    return schemas()


def create_app(config: ServeConfig, server: EnvServer | None = None, preload_schema: bool = False) -> ServedApp:
    """The ASGI app serving ``config.env_id`` (makes one env now, so bad kwargs fail here).

    ``/schema`` imports openenv-core on its first call, which takes seconds; ``preload_schema``
    does it now (containers, where a validator's first ``/schema`` must answer at once)."""
    server = server or EnvServer(config)
    if not server._idle_envs:
        server.warm()
    schema_cache: list[dict[str, Any]] = [_schemas()] if preload_schema else []
    app = FastAPI(
        title=f"bpo-gym {config.env_id} (OpenEnv)",
        version=_package_version(),
        description="A BPO gym env over OpenEnv's WebSocket protocol at /ws, with snapshots (docs/serving.md).",
        docs_url=None,
        redoc_url=None,
    )

    @app.get("/health")
    async def health(request: Request) -> dict[str, Any]:
        return server.health(authorized=server.authorized(request.scope))

    @app.get("/metadata")
    async def metadata() -> dict[str, Any]:
        return {
            "name": config.env_id,
            "description": f"{config.env_id} from bpo-gym, served with snapshots over the wire",
            "version": _package_version(),
            "documentation_url": "docs/serving.md",
        }

    @app.get("/schema")
    def schema() -> dict[str, Any]:
        if not schema_cache:
            schema_cache.append(_schemas())
        return schema_cache[0]

    @app.post("/mcp")
    async def mcp(request: Request) -> dict[str, Any]:
        try:
            request_id = (await request.json()).get("id")
        except Exception:  # noqa: BLE001 - any body gets the same answer
            request_id = None
        return {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "no MCP tools: use the OpenEnv session at /ws"}}

    app.router.on_shutdown.append(server.close)
    return ServedApp(server, app)

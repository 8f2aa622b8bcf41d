"""The server's connections: read timeouts and a cap on open connections (docs/serving.md).

uvicorn's HTTP protocol (h11) bounds a request's header size but not the time it may take to
arrive, and accepts connections until the process runs out of files. :class:`ConnectionGuard`
makes the protocol class ``bpo-serve`` runs with three bounds:

* a request's headers must arrive within ``header_timeout`` seconds of the connection opening
  (or of the previous response on a kept-alive connection), and its body within
  ``body_timeout`` seconds of its headers; otherwise the connection is answered
  ``408 Request Timeout`` and closed (a half-open connection holds a file for that long at most);
* at most ``max_connections`` connections are open at once, HTTP and WebSocket together, kept
  below the process's file limit (:func:`connection_cap`; the soft limit is first raised toward
  what the cap needs, where the hard limit allows). A connection beyond the cap takes the
  place of the one that has waited longest for its request headers (a slow or half-open client);
  where none is waiting, it is answered ``503 Service Unavailable`` with the reason and closed at
  once, so the server never runs out of files and keeps answering the connections it holds.

A WebSocket leaves these bounds once upgraded: its session has the idle timeout and the
eviction of idle sessions at capacity (:mod:`.app`).
"""

from __future__ import annotations

import asyncio
import resource

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

FILES_RESERVED = 64
"""Files the process keeps for itself: the listening socket, logs, the env's data files."""
FILES_PER_SESSION = 8
"""Files an env of one session may hold (a sandbox's pipes and working files)."""
SPARE_CONNECTIONS = 256
"""Connections beyond one per session in the default cap: ``/health`` and other HTTP requests."""


def file_limit(at_least: int = 0) -> int:
    """The process's soft limit on open files (``RLIMIT_NOFILE``), first raised toward
    ``at_least`` where the hard limit allows (any process may raise its own soft limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < at_least and (hard == resource.RLIM_INFINITY or soft < hard):
        target = at_least if hard == resource.RLIM_INFINITY else min(at_least, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # a platform that refuses: keep the limit there is
            pass
    return soft


def connection_cap(max_sessions: int, requested: int | None = None) -> int:
    """The connection cap: ``requested`` or ``max_sessions + SPARE_CONNECTIONS``, and never above
    the file limit less :data:`FILES_RESERVED` and :data:`FILES_PER_SESSION` per session (the
    soft limit is raised toward what that needs where the hard limit allows; a requested cap
    that still does not fit raises ``ValueError``, naming the limit)."""
    overhead = FILES_RESERVED + FILES_PER_SESSION * max_sessions
    files = file_limit(at_least=overhead + (requested or max_sessions + SPARE_CONNECTIONS))
    room = files - overhead
    if requested is None:
        requested = min(max_sessions + SPARE_CONNECTIONS, room)
        if requested <= max_sessions:
            raise ValueError(
                f"the process's file limit ({files}) leaves room for {max(room, 0)} connections after {overhead} "
                f"files for {max_sessions} sessions' envs: raise `ulimit -n` or lower max_sessions"
            )
    elif requested > room:
        raise ValueError(
            f"max_connections {requested} does not fit under the process's file limit ({files}) less "
            f"{FILES_RESERVED} + {FILES_PER_SESSION} per session: at most {room}; raise `ulimit -n` or lower it"
        )
    if requested <= max_sessions:
        raise ValueError(f"max_connections ({requested}) must be above max_sessions ({max_sessions})")
    return requested


def _plain_response(status: int, reason: str, text: str, retry: bool = False) -> bytes:
    body = text.encode() + b"\n"
    head = [f"HTTP/1.1 {status} {reason}", "content-type: text/plain; charset=utf-8",
            f"content-length: {len(body)}", "connection: close"]
    if retry:
        head.append("retry-after: 1")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class ConnectionGuard:
    """The bounds of one server's connections, and counts of what they did (``/health``)."""

    def __init__(self, max_connections: int, header_timeout: float, body_timeout: float) -> None:
        if max_connections < 1 or header_timeout <= 0 or body_timeout <= 0:
            raise ValueError("max_connections and both timeouts must be positive")
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.waiting: dict[GuardedH11Protocol, None] = {}
        """Connections waiting for request headers, longest-waiting first."""
        self.refused = 0
        self.timed_out = 0
        self.displaced = 0

    def protocol_class(self) -> type[GuardedH11Protocol]:
        """The HTTP protocol class for uvicorn's ``Config(http=...)``, bound to this guard."""
        return type("GuardedH11Protocol", (GuardedH11Protocol,), {"guard": self})

    def counts(self) -> dict[str, int]:
        return {"connections_refused": self.refused, "connections_timed_out": self.timed_out,
                "connections_displaced": self.displaced}


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the read timeouts and the cap of :class:`ConnectionGuard`.

    The phase of a connection is h11's view of the client: ``IDLE`` (waiting for request
    headers), ``SEND_BODY`` (headers read, body not yet), anything else (the app's turn, or
    closing: no timer)."""

    guard: ConnectionGuard
    _phase: str | None = None
    _timer: asyncio.TimerHandle | None = None
    _refused = False
    _upgraded = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        guard = self.guard
        if len(self.connections) >= guard.max_connections and not self._displace_oldest_waiting():
            guard.refused += 1
            self._refused = True
            transport.write(_plain_response(
                503, "Service Unavailable",
                f"the server is at its connection limit ({guard.max_connections}); try again later", retry=True,
            ))
            transport.close()
            return
        super().connection_made(transport)
        self._watch()

    def _displace_oldest_waiting(self) -> bool:
        for victim in self.guard.waiting:
            self.guard.displaced += 1
            victim._close(408, "Request Timeout", "closed to make room: the server is at its connection "
                          "limit and this connection had not sent its request")
            self.connections.discard(victim)  # its file is closed now; connection_lost follows
            return True
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self._set_phase(None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._upgraded:
            self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._upgraded = True
        self._set_phase(None)
        super().handle_websocket_upgrade(event)

    def _watch(self) -> None:
        phase = None
        if not self._upgraded and not self.transport.is_closing():
            state = self.conn.their_state
            phase = "headers" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None
        if phase != self._phase:
            self._set_phase(phase)

    def _set_phase(self, phase: str | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.guard.waiting.pop(self, None)
        self._phase = phase
        if phase == "headers":
            self.guard.waiting[self] = None
            self._timer = self.loop.call_later(self.guard.header_timeout, self._timed_out)
        elif phase == "body":
            self._timer = self.loop.call_later(self.guard.body_timeout, self._timed_out)

    def _timed_out(self) -> None:
        self._timer = None
        self.guard.timed_out += 1
        seconds = self.guard.header_timeout if self._phase == "headers" else self.guard.body_timeout
        self._close(408, "Request Timeout", f"the request's {self._phase} did not arrive within {seconds:g} s")

    def _close(self, status: int, reason: str, text: str) -> None:
        """Answer ``status`` (where no response has started) and close the connection."""
        self._set_phase(None)
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
            self.transport.write(_plain_response(status, reason, text))
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False
        self.transport.close()


__all__ = ["ConnectionGuard", "GuardedH11Protocol", "connection_cap", "file_limit"]

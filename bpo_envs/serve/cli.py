"""``bpo-serve ENV_ID [--host 127.0.0.1] [--port N] [env kwargs]``: serve an env over OpenEnv.

Env kwargs are ``key=value`` words (the value read as JSON when it parses, else as a string),
e.g. ``bpo-serve BPO-WebShop-v0 split=train max_episode_steps=15``. The bearer token, when
wanted, comes from ``$BPO_SERVE_TOKEN`` (not the command line, which other users can read).
Prints ``serving ENV_ID at http://HOST:PORT`` once it listens (``--port 0``: a free port).
SIGTERM (or Ctrl-C) shuts it down cleanly: sessions closed, snapshots freed, every env closed
and the process's exit handlers run (a SWE-bench env's run folder is removed), within
:data:`SHUTDOWN_SECONDS` of open sessions' last calls.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import socket
import sys
from types import FrameType
from typing import Any

from bpo_envs.serve.app import ServeConfig, ServedApp, create_app
from bpo_envs.serve.snapshots import DEFAULT_CAP, DEFAULT_OWNER_CAP

TOKEN_VARIABLE = "BPO_SERVE_TOKEN"
SHUTDOWN_SECONDS = 30
"""How long a shutdown waits for open connections before it cancels them (uvicorn's
``timeout_graceful_shutdown``)."""


def parse_env_kwargs(words: list[str]) -> dict[str, Any]:
    """``["split=train", "max_episode_steps=8"]`` -> ``{"split": "train", "max_episode_steps": 8}``."""
    kwargs: dict[str, Any] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"env kwargs are key=value words, got {word!r}")
        try:
            kwargs[key] = json.loads(value)
        except json.JSONDecodeError:
            kwargs[key] = value
    return kwargs


def app_from_environ(env_id: str) -> ServedApp:
    """The app of ``env_id`` configured from the environment, for a container's
    ``server/app.py`` (deploy/openenv/): ``$BPO_ENV_KWARGS`` (JSON), ``$BPO_MAX_SESSIONS``,
    ``$BPO_SERVE_TOKEN``; ``/schema`` preloaded."""
    config = ServeConfig(
        env_id=env_id,
        env_kwargs=json.loads(os.environ.get("BPO_ENV_KWARGS") or "{}"),
        max_sessions=int(os.environ.get("BPO_MAX_SESSIONS") or 64),
        token=os.environ.get(TOKEN_VARIABLE) or None,
    )
    return create_app(config, preload_schema=True)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def run(app: ServedApp, host: str, port: int, max_message_bytes: int = 1 << 20, log_level: str = "warning") -> None:
    """Serve ``app`` with uvicorn on ``host:port`` (``port`` 0: a free one), printing the URL.

    HTTP runs on :mod:`.connections`' guarded protocol (read timeouts, the connection cap).
    uvicorn answers SIGTERM with a graceful shutdown and then sends the signal again to the
    handler that was there before it; that handler is :func:`_exit_on_sigterm` here, so the
    process ends by ``SystemExit`` and its exit handlers run (the default action would kill it
    before them)."""
    import uvicorn

    sock = socket.create_server((host, port))  # bound before uvicorn: --port 0 works
    host, port = sock.getsockname()[:2]
    uv_config = uvicorn.Config(
        app,
        http=app.server.guard.protocol_class(),
        log_level=log_level,
        ws_max_size=4 * max_message_bytes,  # the hard cap; under it the app answers an error
        ws_per_message_deflate=False,  # compressing small text frames costs more than it saves
        timeout_graceful_shutdown=SHUTDOWN_SECONDS,
    )
    # What start-up made (WebShop's catalog and search index: ~80,000 objects) lives as long as the
    # process; frozen, the garbage collector's full passes skip it (0.2 s each here: a latency spike).
    gc.collect()
    gc.freeze()
    print(f"serving {app.server.config.env_id} at http://{host}:{port}", flush=True)
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        uvicorn.Server(uv_config).run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)


def _positive_or_none(text: str) -> float | None:
    value = float(text)
    return None if value <= 0 else value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bpo-serve", description=__doc__.split("\n\n")[0])
    p.add_argument("env_id", help="a registered env id, e.g. BPO-WebShop-v0")
    p.add_argument("env_kwargs", nargs="*", help="key=value arguments of gym.make")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000, OpenEnv's; 0: a free one)")
    p.add_argument("--max-sessions", type=int, default=64)
    p.add_argument("--idle-timeout", type=_positive_or_none, default=600.0, help="seconds (0: none)")
    p.add_argument("--step-deadline", type=_positive_or_none, default=600.0, help="seconds one env call may take (0: none)")
    p.add_argument("--max-message-bytes", type=int, default=1 << 20)
    p.add_argument("--snapshot-cap", type=int, default=DEFAULT_CAP, help="snapshots kept in all")
    p.add_argument("--session-snapshot-cap", type=int, default=DEFAULT_OWNER_CAP,
                   help="snapshots one session keeps, its own oldest evicted first (never another session's)")
    p.add_argument("--evict-idle-after", type=_positive_or_none, default=30.0,
                   help="at --max-sessions, a new session takes the slot of the one silent longest, "
                        "where it has been silent this many seconds (0: never)")
    p.add_argument("--max-connections", type=int, default=None,
                   help="open connections at most (default: --max-sessions + 256, below the file limit)")
    p.add_argument("--header-timeout", type=float, default=10.0, help="seconds a request's headers may take")
    p.add_argument("--body-timeout", type=float, default=30.0, help="seconds a request's body may take")
    p.add_argument("--threads", type=int, default=None, help="threads running env calls (default: --max-sessions)")
    p.add_argument("--no-inline", dest="inline", action="store_false",
                   help="call every env in the thread pool, even one that declares step_may_block = False")
    p.add_argument("--log-level", default="warning")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_intermixed_args(argv)
    try:
        config = ServeConfig(
            env_id=args.env_id,
            env_kwargs=parse_env_kwargs(args.env_kwargs),
            max_sessions=args.max_sessions,
            idle_timeout=args.idle_timeout,
            step_deadline=args.step_deadline,
            max_message_bytes=args.max_message_bytes,
            snapshot_cap=args.snapshot_cap,
            token=os.environ.get(TOKEN_VARIABLE) or None,
            threads=args.threads,
            inline=args.inline,
            session_snapshot_cap=args.session_snapshot_cap,
            evict_idle_after=args.evict_idle_after,
            max_connections=args.max_connections,
            header_timeout=args.header_timeout,
            body_timeout=args.body_timeout,
        )
    except ValueError as exc:
        sys.exit(f"bpo-serve: {exc}")
    run(create_app(config), args.host, args.port, config.max_message_bytes, args.log_level)


if __name__ == "__main__":
    main()

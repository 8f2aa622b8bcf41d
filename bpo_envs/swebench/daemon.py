"""The Docker daemon as the docker backend sees it: one client, a bound on calls in flight, a
wait for a restarting daemon, and the host's room for more envs.

* :func:`docker_call` runs one docker-py call within the process's bound on calls in flight
  (:func:`set_max_docker_calls`, default ``$BPO_GYM_DOCKER_CALLS`` or 8, for all envs of the
  process together), so an overloaded daemon queues calls instead of timing them out; a call that
  cannot reach the daemon is retried for up to the daemon wait (:func:`set_daemon_wait`, default
  ``$BPO_GYM_DOCKER_WAIT`` or 120 s) once a daemon has answered this process (it is restarting);
  a host that never had one fails at once.
* :func:`docker_client` is a client whose daemon answers, else
  :class:`bpo_envs.system.MissingPartError` saying how to get one.
* :func:`check_capacity` raises, naming the limit, when the host cannot start more envs.
* :func:`exec_output` streams a started exec's output, every byte of it (docker-py's own
  reader loses what arrives with the response's headers: see its docstring);
  :func:`exec_complete` runs a command to its end and returns its exit code and whole output.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bpo_envs.swebench.local import SandboxLimits

log = logging.getLogger("bpo_envs.swebench.docker_backend")
MIN_FREE_DISK_BYTES = 1 << 30
"""An env does not start when the daemon's disk has less free space than this."""


class DaemonUnavailableError(RuntimeError):
    """No Docker daemon answered within ``daemon_wait_s``."""


_limits_lock = threading.Lock()
_max_calls = max(1, int(os.environ.get("BPO_GYM_DOCKER_CALLS", "8")))
_calls = threading.BoundedSemaphore(_max_calls)
_daemon_wait_s = float(os.environ.get("BPO_GYM_DOCKER_WAIT", "120"))
_seen_daemon = False  # a daemon answered this process once: an unreachable one is restarting


def set_max_docker_calls(n: int) -> None:
    """Bound the docker API calls in flight from this process (all envs together) to ``n``."""
    global _max_calls, _calls
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"max docker calls must be an int >= 1, got {n!r}")
    with _limits_lock:
        _max_calls, _calls = n, threading.BoundedSemaphore(n)


def max_docker_calls() -> int:
    return _max_calls


def set_daemon_wait(seconds: float) -> None:
    """How long a docker call waits for an unreachable daemon (restarting) before it raises."""
    global _daemon_wait_s
    if not isinstance(seconds, int | float) or seconds < 0:
        raise ValueError(f"daemon wait must be a number of seconds >= 0, got {seconds!r}")
    _daemon_wait_s = float(seconds)


def _unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the daemon did not answer (as opposed to refusing the call)."""
    import docker
    import requests

    if isinstance(exc, requests.exceptions.ConnectionError | ConnectionError | FileNotFoundError):
        return True
    if isinstance(exc, docker.errors.APIError) and exc.response is not None:
        # the daemon is shutting down or starting: it answers 500/502/503 with these
        text = str(exc).lower()
        return exc.response.status_code >= 500 and any(
            m in text for m in ("shutting down", "connection refused", "is restarting", "context canceled"))
    return False


def docker_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` within the process's bound on calls in flight, retried while the
    daemon cannot be reached, for up to the daemon wait (see the module docstring)."""
    deadline = time.monotonic() + (_daemon_wait_s if _seen_daemon else 0.0)
    delay = 0.2
    while True:
        sem = _calls
        with sem:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - sorted below
                if not _unreachable(exc) or time.monotonic() >= deadline:
                    if _unreachable(exc) and _seen_daemon:
                        raise DaemonUnavailableError(
                            f"the Docker daemon did not answer for {_daemon_wait_s:g} s (the "
                            f"daemon wait, BPO_GYM_DOCKER_WAIT): {type(exc).__name__}: {exc}"
                        ) from exc
                    raise
        log.warning("the Docker daemon does not answer; retrying in %.1f s", delay)
        time.sleep(delay)
        delay = min(delay * 2, 5.0)


def docker_client() -> Any:
    """A docker-py client whose daemon answers (waiting up to the daemon wait for one that is
    restarting, once a daemon answered this process); raise with how to get one otherwise."""
    try:
        import docker
    except ImportError as exc:
        raise RuntimeError("the docker backend needs docker-py: pip install 'bpo-gym[swe]'") from exc
    global _seen_daemon
    try:
        client = docker.from_env(timeout=120)
        docker_call(client.ping)
        _seen_daemon = True
    except Exception as exc:  # noqa: BLE001 - any failure means: no usable daemon
        from bpo_envs.system import MissingPartError

        raise MissingPartError(
            "the docker backend needs a running Docker daemon: apt-get install docker.io and start "
            f"dockerd (bpo-gym-setup swebench does both); waited {_daemon_wait_s:g} s "
            f"(BPO_GYM_DOCKER_WAIT) ({exc})", "swebench"
        ) from exc
    return client


def check_capacity(client: Any, n_envs: int = 1, limits: SandboxLimits | None = None) -> None:
    """Raise, naming the limit, when this host cannot start ``n_envs`` more docker envs: less
    free disk on the daemon's root than :data:`MIN_FREE_DISK_BYTES` plus 64 MiB per env, or more
    processes than the host's ``kernel.pid_max`` room for ``pids_limit`` each."""
    info = docker_call(client.info)
    root = info.get("DockerRootDir") or "/var/lib/docker"
    need = MIN_FREE_DISK_BYTES + n_envs * (64 << 20)
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        free = None  # a remote daemon: its disk is not visible from here
    if free is not None and free < need:
        raise RuntimeError(
            f"out of disk for {n_envs} docker env(s): {free / 2**30:.2f} GiB free on the Docker "
            f"root {root}, the limit is {need / 2**30:.2f} GiB (MIN_FREE_DISK_BYTES "
            f"{MIN_FREE_DISK_BYTES / 2**30:.0f} GiB + 64 MiB per env); free space or remove "
            "images (bpo-gym-setup clean removes what crashed runs left)"
        )
    lim = limits or SandboxLimits()
    try:
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        pid_max = None
    if pid_max is not None and n_envs * lim.max_processes > pid_max:
        raise RuntimeError(
            f"{n_envs} docker env(s) with max_processes={lim.max_processes} each may need "
            f"{n_envs * lim.max_processes} processes, over the host's kernel.pid_max {pid_max}; "
            "lower max_processes or the concurrency"
        )


FRAME_HEADER = struct.Struct(">BxxxL")
"""The header of a frame of the daemon's multiplexed stream (no tty): the stream (1 stdout,
2 stderr), three zero bytes, the payload's length (big-endian)."""


def exec_output(api: Any, exec_id: str) -> Iterator[bytes]:
    """Start the created exec ``exec_id`` (no tty) and yield its output as it arrives: each
    frame's payload, stdout and stderr in the order the daemon sent them, until the daemon
    closes the stream (the exec and every process holding its output ended). The start goes
    through :func:`docker_call`; reading does not (it lasts as long as the command).

    Why not docker-py's ``exec_start(stream=True)``: it reads the frames from the raw socket
    under the response, while http.client read the response's headers through a buffered
    reader that takes up to 8 KiB from the socket at once. When the command has printed before
    the client reads the headers (the client's thread was not scheduled while the daemon
    started the exec: a busy host), the first frames sit in that buffer and are never seen: the
    whole output of a short command, the first 8 KiB of a long one. Here the frames are read
    through that buffered reader. A stream that ends inside a frame raises ConnectionError
    (the daemon went away mid-answer) rather than returning a cut output.
    """
    stream = docker_call(api.exec_start, exec_id, stream=True)  # docker-py's generator stays unread
    # docker-py's and http.client's attributes (third party): the response behind the stream,
    # and http.client's buffered reader over its socket, which may already hold the first frames
    response = stream._response
    reader = response.raw._fp.fp
    # a command may print nothing for longer than the client's timeout: wait for the daemon as
    # long as it takes (the host's deadline for the command is kept by the caller)
    api._disable_socket_timeout(api._get_raw_response_socket(response))
    try:
        while True:
            header = reader.read(FRAME_HEADER.size)
            if not header:
                return
            if len(header) < FRAME_HEADER.size:
                raise ConnectionError("the Docker daemon's exec stream ended inside a frame header")
            _, size = FRAME_HEADER.unpack(header)
            payload = reader.read(size) if size else b""
            if len(payload) < size:
                raise ConnectionError(f"the Docker daemon's exec stream ended inside a frame "
                                      f"({len(payload)} of {size} bytes)")
            if payload:
                yield payload
    finally:
        response.close()


def exec_complete(api: Any, container_id: str, cmd: list[str], environment: dict[str, str] | None = None) -> tuple[int, bytes]:
    """Run ``cmd`` in the running container ``container_id`` (no tty) until it ends: its exit
    code and its whole output (stdout and stderr interleaved as the daemon sent them), read by
    :func:`exec_output` (docker-py's ``exec_run`` reads with the reader that loses what arrives
    with the headers). No deadline: for the library's own set-up commands, never an agent's."""
    exec_id = docker_call(api.exec_create, container_id, cmd, environment=environment)["Id"]
    output = b"".join(exec_output(api, exec_id))
    code = docker_call(api.exec_inspect, exec_id)["ExitCode"]
    return int(code if code is not None else -1), output

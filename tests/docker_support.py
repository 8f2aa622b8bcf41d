"""What the docker-backend tests need: a Docker daemon that answers and the local base image."""

from __future__ import annotations


def docker_problem() -> str | None:
    """Why the docker tests cannot run here (None when they can)."""
    try:
        import docker

        from bpo_envs.swebench.docker_backend import DEFAULT_IMAGE
    except ImportError as exc:
        return f"needs the swe extra: pip install 'bpo-gym[swe]' ({exc.name} is missing)"
    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure to reach the daemon
        return f"no Docker daemon answers ({type(exc).__name__}); bpo-gym-setup swebench starts one"
    try:
        client.images.get(DEFAULT_IMAGE)
    except docker.errors.ImageNotFound:
        return f"the local image {DEFAULT_IMAGE} is missing; bpo-gym-setup swebench builds it"
    return None


def restart_dockerd(down_s: float = 3.0, timeout: float = 90.0) -> float:
    """Stop the running dockerd (SIGTERM: its containers stop), keep it down ``down_s`` seconds,
    start it again with the same command line, detached; return the seconds it was unreachable.

    Raises when no dockerd runs here as a visible process (a remote or socket-activated one).
    """
    import os
    import signal
    import subprocess
    import time
    from pathlib import Path

    import docker

    pid_file = Path("/var/run/docker.pid")
    pid = int(pid_file.read_text().strip())
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    t0 = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    while Path(f"/proc/{pid}").exists() and time.monotonic() - t0 < timeout:
        time.sleep(0.1)
    time.sleep(down_s)
    log = open("/var/log/bpo-dockerd.log", "ab")  # noqa: SIM115 - handed to the daemon
    subprocess.Popen([a.decode() for a in argv], stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                     start_new_session=True, close_fds=True)
    while time.monotonic() - t0 < timeout:
        try:
            docker.from_env(timeout=10).ping()
            return time.monotonic() - t0
        except Exception:  # noqa: BLE001 - still starting
            time.sleep(0.2)
    raise RuntimeError(f"dockerd did not come back within {timeout} s (see /var/log/bpo-dockerd.log)")

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

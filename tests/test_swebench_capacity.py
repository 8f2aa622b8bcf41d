"""A docker concurrency the host cannot start fails before it starts, naming the limit."""

from __future__ import annotations

import shutil
from collections import namedtuple

import pytest

pytest.importorskip("docker", reason="needs docker-py: pip install 'bpo-gym[swe]'")

from bpo_envs.swebench import daemon  # noqa: E402
from bpo_envs.system import MissingPartError  # noqa: E402


class FakeClient:
    """Only ``info()``: what check_capacity asks the daemon."""

    def info(self):
        return {"DockerRootDir": "/"}


def test_out_of_disk_names_the_limit(monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 << 30, (10 << 30) - (300 << 20), 300 << 20))
    with pytest.raises(RuntimeError, match=r"out of disk for 8 docker env\(s\): 0\.29 GiB free .* the limit is 1\.50 GiB"):
        daemon.check_capacity(FakeClient(), 8)


def test_more_processes_than_the_host_has_names_the_limit():
    from pathlib import Path

    from bpo_envs.swebench.local import SandboxLimits

    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    with pytest.raises(RuntimeError, match=r"max_processes=\d+ each .* over the host's kernel.pid_max"):
        daemon.check_capacity(FakeClient(), 2, SandboxLimits(max_processes=pid_max))


def test_no_daemon_fails_at_once_saying_how_to_start_one(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    monkeypatch.setattr(daemon, "_seen_daemon", False)
    with pytest.raises(MissingPartError, match="needs a running Docker daemon") as err:
        daemon.docker_client()
    assert err.value.part == "swebench"


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError, match="max docker calls"):
        daemon.set_max_docker_calls(0)
    with pytest.raises(ValueError, match="daemon wait"):
        daemon.set_daemon_wait(-1)

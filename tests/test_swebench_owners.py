"""Ownership labels and the clean-up of what dead processes left: it removes only resources
whose owner (host, pid, start time, run id) is this host's and gone, never a foreign or a
labelled-alike one, and never an image that is not a snapshot."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import uuid

import pytest

from bpo_envs.swebench import owners
from bpo_envs.system import main as setup_main


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _labels(pid: int, host: str | None = None, start: str = "12345") -> dict[str, str]:
    return {owners.LABEL_KIND: "swebench", owners.LABEL_HOST: host or socket.gethostname(),
            owners.LABEL_PID: str(pid), owners.LABEL_START: start, owners.LABEL_RUN: uuid.uuid4().hex[:12]}


def test_owner_state():
    me = owners.owner_labels()
    assert owners.owner_state(me) == "alive"
    assert owners.owner_state(_labels(_dead_pid())) == "dead"
    # pid 1 runs, but not since that start time: a reused pid is not the owner
    assert owners.owner_state({**me, owners.LABEL_PID: "1", owners.LABEL_START: "1"}) == "dead"
    assert owners.owner_state(_labels(_dead_pid(), host="another-host")) == "foreign"
    assert owners.owner_state({owners.LABEL_PID: str(_dead_pid())}) == "foreign"
    assert owners.owner_state(None) == "foreign"


def test_local_clean_up_removes_only_dead_run_folders(tmp_path, monkeypatch):
    monkeypatch.setattr(owners.tempfile, "gettempdir", lambda: str(tmp_path))
    dead = tmp_path / f"{owners.RUN_DIR_PREFIX}{_dead_pid()}-99-abc"
    (dead / "ws-1" / "testbed").mkdir(parents=True)
    (dead / "owner.json").write_text(json.dumps(_labels(int(dead.name.split("-")[3]))))
    alive = tmp_path / f"{owners.RUN_DIR_PREFIX}{os.getpid()}-x-def"
    alive.mkdir()
    (alive / "owner.json").write_text(json.dumps(owners.owner_labels()))
    elsewhere = tmp_path / f"{owners.RUN_DIR_PREFIX}{_dead_pid()}-98-ghi"
    elsewhere.mkdir()
    (elsewhere / "owner.json").write_text(json.dumps(_labels(_dead_pid(), host="another-host")))
    odd = tmp_path / f"{owners.RUN_DIR_PREFIX}not-a-run"
    odd.mkdir()
    dry = owners.clean_up(docker=False, dry_run=True)
    assert dry.run_dirs == [str(dead)] and dead.exists()
    report = owners.clean_up(docker=False)
    assert report.run_dirs == [str(dead)]
    assert not dead.exists() and alive.exists() and elsewhere.exists() and odd.exists()


def test_docker_clean_up_never_touches_what_it_did_not_make():
    docker = pytest.importorskip("docker", reason="needs docker-py: pip install 'bpo-gym[swe]'")
    from docker_support import docker_problem

    from bpo_envs.swebench.docker_backend import DEFAULT_IMAGE

    problem = docker_problem()
    if problem:
        pytest.skip(problem)

    client = docker.from_env()
    dead_pid = _dead_pid()
    made, images = [], []

    def box(labels):
        c = client.containers.run(DEFAULT_IMAGE, ["sleep", "infinity"], detach=True, init=True,
                                  network_mode="none", labels=labels)
        made.append(c)
        return c

    try:
        dead = box(_labels(dead_pid))
        alike = box({owners.LABEL_KIND: "swebench", owners.LABEL_PID: str(dead_pid)})  # labelled-alike
        other_host = box(_labels(dead_pid, host="another-host"))
        mine = box({owners.LABEL_KIND: "swebench", **owners.owner_labels()})
        tag = uuid.uuid4().hex[:12]
        snap = f"{owners.SNAPSHOT_REPO}:{tag}"
        cache = f"bpo-gym/test-cache:{tag}"
        dead.commit(repository=owners.SNAPSHOT_REPO, tag=tag)
        dead.commit(repository="bpo-gym/test-cache", tag=tag)  # same owner labels, not a snapshot
        foreign_snap = f"{owners.SNAPSHOT_REPO}:{tag}-foreign"
        other_host.commit(repository=owners.SNAPSHOT_REPO, tag=f"{tag}-foreign")
        images += [snap, cache, foreign_snap]

        report = owners.clean_up(local=False)
        assert dead.name in report.containers and snap in report.images
        for c in (alike, other_host, mine):
            c.reload()
            assert c.status == "running", c.name
        with pytest.raises(docker.errors.NotFound):
            dead.reload()
        assert client.images.get(cache) and client.images.get(foreign_snap)
        with pytest.raises(docker.errors.ImageNotFound):
            client.images.get(snap)
        assert {alike.name, other_host.name, mine.name}.isdisjoint(report.containers)
    finally:
        for c in made:
            try:
                c.remove(force=True)
            except docker.errors.NotFound:
                pass
        for name in images:
            try:
                client.images.remove(name)
            except docker.errors.ImageNotFound:
                pass


def test_setup_clean_command_prints_what_it_removed(capsys):
    setup_main(["clean", "--dry-run", "--no-docker"])
    out = json.loads(capsys.readouterr().out)
    assert out["dry_run"] is True and set(out) >= {"containers", "images", "run_dirs", "cgroups", "processes"}

"""Faults the SWE-bench backends survive (slow stage): a process holding envs and snapshots
killed with SIGKILL leaves nothing once a new env starts (docker containers and snapshot
images; the local sandbox's folders, cgroups and processes), and a collection survives a
dockerd restart under it (the lost paths rebuilt from their snapshots, the loss metered)."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import bpo_envs  # noqa: F401 - registers the ids

pytest.importorskip("swebench", reason="needs the swe extra: pip install 'bpo-gym[swe]'")
pytestmark = pytest.mark.slow
HERE = Path(__file__).parent
CHILD = HERE / "swebench_crash_child.py"
START_ENV = ("import gymnasium as gym, bpo_envs, sys; "
             "gym.make('BPO-SWEBench-v0', backend=sys.argv[1]).close()")


def _spawn(backend: str) -> tuple[subprocess.Popen, dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    child = subprocess.Popen([sys.executable, str(CHILD), backend], stdout=subprocess.PIPE, text=True, env=env)
    line = child.stdout.readline()
    assert line, f"the child exited ({child.wait()})"
    return child, json.loads(line)


def _new_env_in_a_new_process(backend: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-c", START_ENV, backend], check=True, env=env, timeout=300)


def _docker():
    docker = pytest.importorskip("docker", reason="needs docker-py: pip install 'bpo-gym[swe]'")
    from docker_support import docker_problem

    problem = docker_problem()
    if problem:
        pytest.skip(problem)
    return docker


def test_sigkill_of_a_docker_env_leaves_nothing_once_a_new_env_starts():
    docker = _docker()
    from bpo_envs.swebench.owners import LABEL_RUN, SNAPSHOT_REPO

    client = docker.from_env()
    child, info = _spawn("docker")
    def label():  # a new dict per call: images.list adds its name filter to the one it gets
        return {"label": f"{LABEL_RUN}={info['run']}"}

    try:
        time.sleep(1.0)  # the warm containers started after the snapshots
        before_kill = (len(client.containers.list(all=True, filters=label())),
                       len(client.images.list(SNAPSHOT_REPO, filters=label())))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    containers = client.containers.list(all=True, filters=label())
    images = client.images.list(SNAPSHOT_REPO, filters=label())
    print(f"\nSIGKILL, docker: before the kill {before_kill[0]} containers, {before_kill[1]} snapshot "
          f"images; after it {len(containers)} containers, {len(images)} snapshot images, run folder "
          f"{'kept' if Path(info['run_dir']).exists() else 'gone'}")
    assert len(images) == 3 and len(containers) >= 1  # what a crash leaves, until the next start
    _new_env_in_a_new_process("docker")
    assert client.containers.list(all=True, filters=label()) == []
    assert client.images.list(SNAPSHOT_REPO, filters=label()) == []
    assert not Path(info["run_dir"]).exists()


def _processes_naming(mark: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if mark.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def test_sigkill_of_a_local_env_leaves_nothing_once_a_new_env_starts():
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (bpo-gym-setup swebench)")
    child, info = _spawn("local")
    try:
        deadline = time.monotonic() + 60
        while not _processes_naming(info["run_dir"]) and time.monotonic() < deadline:
            time.sleep(0.1)  # the `sleep 600` step is running in its sandbox
        running = _processes_naming(info["run_dir"])
        assert running, "the sandboxed step never started"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    time.sleep(1.0)
    cgroup = Path(info["cgroup"]) if info["cgroup"] else None
    left = {"run_dir": Path(info["run_dir"]).exists(), "cgroup": bool(cgroup and cgroup.exists()),
            "processes": len(_processes_naming(info["run_dir"]))}
    print(f"\nSIGKILL, local: {len(running)} sandbox processes before the kill; after it {left}")
    assert left["run_dir"]  # what a crash leaves, until the next start
    _new_env_in_a_new_process("local")
    assert not Path(info["run_dir"]).exists()
    assert not (cgroup and cgroup.exists())
    assert _processes_naming(info["run_dir"]) == []


class ShellPolicy:
    """Uniform over a few deterministic commands (no admissible actions in SWE-bench)."""

    COMMANDS = ("echo a >> notes.txt && wc -l notes.txt", "ls | head -3", "git status --short | head -3")

    def __init__(self, seed: int = 0) -> None:
        from bpo_algos import ComputeMeter

        self.meter = ComputeMeter()
        self.rng = np.random.default_rng(seed)

    def decision_entropy(self, contexts):
        return [math.log(len(self.COMMANDS))] * len(contexts)

    def sample(self, contexts, n):
        from bpo_algos.policy.base import Action

        lp = -math.log(len(self.COMMANDS))
        return [[Action(self.COMMANDS[i], (int(i),), (lp,)) for i in self.rng.integers(len(self.COMMANDS), size=n)]
                for _ in contexts]

    def token_logprobs(self, steps):  # pragma: no cover - never trained
        raise NotImplementedError


def test_a_collection_survives_a_dockerd_restart(caplog):
    docker = _docker()
    from docker_support import restart_dockerd

    from bpo_algos import BPO, EnvPool
    from bpo_envs.swebench.owners import LABEL_RUN, SNAPSHOT_REPO, run_id

    if not Path("/var/run/docker.pid").exists():
        pytest.skip("no local dockerd process to restart (a remote daemon)")
    make = lambda: gym.make("BPO-SWEBench-v0", backend="docker", step_timeout=60, max_episode_steps=5)  # noqa: E731
    pool = EnvPool([make] * 3, workers=3, retries=3)
    algorithm = BPO(backbones=2, branch_factor=2, entropy_threshold=0.0, max_branch_points=2, seed=0)
    ids = [r["instance_id"] for r in bpo_envs.swebench.bundled_instances()]
    tasks = [ids[i % len(ids)] for i in range(4)]
    outage: dict[str, float] = {}

    def restart_soon() -> None:
        time.sleep(8.0)
        outage["s"] = restart_dockerd()

    restarter = threading.Thread(target=restart_soon)
    caplog.set_level(logging.WARNING)
    t0 = time.monotonic()
    try:
        restarter.start()
        batch = algorithm.collect(ShellPolicy(), pool, tasks)
    finally:
        restarter.join()
        pool.close()
    seconds = time.monotonic() - t0
    client = docker.from_env()
    client.ping()  # the daemon runs again
    lost = [r.getMessage() for r in caplog.records if "env failure" in r.getMessage()]
    trees = batch.trees
    print(f"\ndockerd restart under a collection: down {outage.get('s', float('nan')):.1f} s, batch "
          f"{seconds:.1f} s, {len(trees)} trees, failures {batch.compute.failures}, dropped steps "
          f"{batch.compute.dropped_steps}, replayed steps {batch.compute.replay_steps}, restores "
          f"{batch.compute.restores}\n  " + "\n  ".join(lost[:8]))
    assert "s" in outage, "the restart did not happen"
    assert batch.compute.failures >= 1 and lost, "the restart was not seen by the collection"
    assert len(trees) == len(tasks) and all(t.root.children for t in trees)
    assert all(len(t.root.children) >= 2 for t in trees)  # no tree lost to the restart
    def label():
        return {"label": f"{LABEL_RUN}={run_id()}"}

    assert client.containers.list(all=True, filters=label()) == []
    import gc

    del batch, trees
    gc.collect()
    assert client.images.list(SNAPSHOT_REPO, filters=label()) == []

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
from bpo_algos.policy.base import Policy

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


class ShellPolicy(Policy):
    """Uniform over a few deterministic commands (no admissible actions in SWE-bench)."""

    # each takes a moment, so that a fault most likely hits a command in flight
    COMMANDS = ("sleep 0.3; echo a >> notes.txt && wc -l notes.txt", "sleep 0.3; ls | head -3",
                "sleep 0.3; git status --short | head -3")

    def __init__(self, seed: int = 0) -> None:
        from bpo_algos import ComputeMeter

        self.meter = ComputeMeter()
        self.rng = np.random.default_rng(seed)

    def decision_entropy(self, contexts):
        return [math.log(len(self.COMMANDS))] * len(contexts)

    def sample(self, contexts, n, rngs):
        from bpo_algos.policy.base import Action

        lp = -math.log(len(self.COMMANDS))
        self.meter.gen_tokens += n * len(contexts)  # the policy meters what it generates
        return [[Action(self.COMMANDS[i], (int(i),), (lp,)) for i in (self.rng if rngs is None else rng).integers(len(self.COMMANDS), size=n)]
                for rng in (rngs or [None] * len(contexts))]

    def token_logprobs(self, steps):  # pragma: no cover - never trained
        raise NotImplementedError


def _collect_under(fault, caplog, n_tasks: int = 4):
    """A BPO collection on docker envs with ``fault()`` run in a thread 8 s in; what it saw."""
    from bpo_algos import BPO, EnvPool

    make = lambda: gym.make("BPO-SWEBench-v0", backend="docker", step_timeout=60, max_episode_steps=5)  # noqa: E731
    pool = EnvPool([make] * 3, workers=3, retries=3)
    algorithm = BPO(backbones=2, branch_factor=2, entropy_threshold=0.0, max_branch_points=2, seed=0)
    ids = [r["instance_id"] for r in bpo_envs.swebench.bundled_instances()]
    tasks = [ids[i % len(ids)] for i in range(n_tasks)]
    out: dict = {}

    def later() -> None:
        time.sleep(8.0)
        out["fault"] = fault(pool)

    thread = threading.Thread(target=later)
    caplog.set_level(logging.WARNING)
    t0 = time.monotonic()
    try:
        thread.start()
        batch = algorithm.collect(ShellPolicy(), pool, tasks)
    finally:
        thread.join()
        pool.close()
    out["seconds"] = time.monotonic() - t0
    out["engine_failures"] = [r.getMessage()[:300] for r in caplog.records if "env failure" in r.getMessage()]
    out["replaced_unused"] = sum("died before use" in r.getMessage() for r in caplog.records)
    out["daemon_waits"] = sum("does not answer" in r.getMessage() for r in caplog.records)
    c = batch.compute
    print(f"\n{fault.__name__}: {out['fault']}; batch {out['seconds']:.1f} s, {len(batch.trees)} trees, "
          f"engine failures {c.failures} (dropped steps {c.dropped_steps}, replayed steps "
          f"{c.replay_steps}, restores {c.restores}), unused containers replaced "
          f"{out['replaced_unused']}, daemon waits {out['daemon_waits']}\n  " + "\n  ".join(out["engine_failures"][:6]))
    assert len(batch.trees) == len(tasks) and all(len(t.root.children) >= 2 for t in batch.trees)
    assert c.failures == len(out["engine_failures"])
    return batch, out


def _nothing_left(docker) -> None:
    import gc

    from bpo_envs.swebench.owners import LABEL_RUN, SNAPSHOT_REPO, run_id

    gc.collect()
    client = docker.from_env()
    label = lambda: {"label": f"{LABEL_RUN}={run_id()}"}  # noqa: E731
    assert client.containers.list(all=True, filters=label()) == []
    assert client.images.list(SNAPSHOT_REPO, filters=label()) == []


def test_a_collection_survives_a_dockerd_restart(caplog):
    docker = _docker()
    from docker_support import restart_dockerd

    if not Path("/var/run/docker.pid").exists():
        pytest.skip("no local dockerd process to restart (a remote daemon)")

    def dockerd_restart(pool) -> str:
        return f"dockerd unreachable for {restart_dockerd():.1f} s"

    batch, out = _collect_under(dockerd_restart, caplog)
    docker.from_env().ping()  # the daemon runs again
    # the restart was seen: calls waited for the daemon, and the containers it stopped were
    # either unused (started again) or held state (the engine rebuilt those paths)
    assert out["daemon_waits"] >= 1
    assert out["replaced_unused"] + batch.compute.failures >= 1
    del batch
    _nothing_left(docker)


def test_containers_dying_mid_batch_are_rebuilt_from_snapshots(caplog, monkeypatch):
    docker = _docker()
    from bpo_envs.swebench import docker_backend

    # the container of every 4th command is killed just before the command runs, when it holds
    # state (it ran a command since its last reset or restore; a container that ran nothing is
    # replaced without a trace), three times: where the engine meets the loss does not depend on
    # timing (a thread killing containers at fixed times could hit only ones no longer needed)
    real_run, lock, calls, killed = docker_backend.DockerBackend.run, threading.Lock(), [0], []

    def run(self, command, timeout, kill_after_bytes):
        with lock:
            calls[0] += 1
            due = calls[0] % 4 == 0 and len(killed) < 3 and self.container is not None and not self._fresh
            if due:
                killed.append(self.container.id)
        if due:
            self.container.kill()
        return real_run(self, command, timeout, kill_after_bytes)

    monkeypatch.setattr(docker_backend.DockerBackend, "run", run)

    def kill_containers_holding_state(pool) -> str:
        return f"killed {len(killed)} containers holding state (before commands {calls[0]} so far)"

    batch, out = _collect_under(kill_containers_holding_state, caplog)
    # envs mid-episode lost their containers: the engine replaced them and rebuilt the paths
    assert len(killed) == 3 and batch.compute.failures == 3, (killed, batch.compute.failures)
    assert all("SandboxLostError" in m for m in out["engine_failures"])
    assert batch.compute.restores > 0
    del batch
    _nothing_left(docker)

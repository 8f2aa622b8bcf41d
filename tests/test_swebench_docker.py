"""BPO-SWEBench-v0 with the docker backend (docker-py) on the bundled instances.

Needs a Docker daemon and the local base image that bpo-gym-setup swebench builds; the
tests skip, saying why, when either is missing. Every container they start is removed.
"""

from __future__ import annotations

import os
import socket
import time

import gymnasium as gym
import pytest

import bpo_envs

pytest.importorskip("swebench", reason="needs the swe extra: pip install 'bpo-gym[swe]'")
docker = pytest.importorskip("docker", reason="needs docker-py: pip install 'bpo-gym[swe]'")

from docker_support import docker_problem  # noqa: E402

from bpo_envs.swebench import SWEBenchEnv, bundled_instances  # noqa: E402
from bpo_envs.swebench.docker_backend import OWNER_LABEL  # noqa: E402

_PROBLEM = docker_problem()
pytestmark = pytest.mark.skipif(_PROBLEM is not None, reason=_PROBLEM or "")
IDS = [row["instance_id"] for row in bundled_instances()]


def _our_containers():
    # only this process's: other test runs may share the engine
    client = docker.from_env()
    return client.containers.list(all=True, filters={"label": f"{OWNER_LABEL}={os.getpid()}"})


@pytest.fixture(scope="module", autouse=True)
def no_leftover_containers():
    yield
    leftovers = _our_containers()
    for c in leftovers:
        c.remove(force=True)
    assert not leftovers, f"containers left running: {[c.name for c in leftovers]}"
    images = docker.from_env().images.list("bpo-gym/swebench-snapshot",
                                           filters={"label": f"{OWNER_LABEL}={os.getpid()}"})
    assert not images, f"snapshot images left behind: {[i.tags for i in images]}"


@pytest.fixture(scope="module")
def env():
    e = gym.make("BPO-SWEBench-v0", backend="docker", step_timeout=20)
    yield e
    e.close()


def test_gold_patch_resolves(env):
    env.reset(options={"task_id": IDS[0]})
    for action in env.unwrapped.expert_actions():
        obs, reward, terminated, truncated, info = env.step(action)
    assert terminated and reward == 1.0 and info["won"]
    assert info["fail_to_pass"] == 1.0 and info["pass_to_pass"] == 1.0


def test_no_change_and_wrong_patch(env):
    env.reset(options={"task_id": "bpo-gym__inicfg-1"})
    obs, reward, terminated, _, info = env.step("submit")
    assert terminated and reward == 0.0 and info["fail_to_pass"] == 0.0 and info["pass_to_pass"] == 1.0
    env.reset(options={"task_id": "bpo-gym__inicfg-1"})
    env.step(
        "sed -i 's/line.split(\"=\")/line.split(\"=\", 1)/; s/key.strip().lower()/key.strip()/' "
        "inicfg/parser.py"
    )
    obs, reward, terminated, _, info = env.step("submit")
    assert reward == 0.0 and info["fail_to_pass"] == 1.0
    assert info["pass_to_pass"] == pytest.approx(5 / 6)


def test_check_snapshot(env):
    report = bpo_envs.check_snapshot(env, seed=1, steps=4, detour=2,
                                     options={"task_id": "bpo-gym__intervals-1"})
    assert report.portable_checked and report.fresh_env_checked


def test_output_printed_before_the_client_reads_the_headers_is_kept(env, monkeypatch):
    """The race a busy host makes, forced: the client reads the exec's answer 0.5 s late, when
    the command has already printed (it arrives with the headers). Every byte is still there:
    all of a short output, the first 8 KiB of a long one (docs/setup.md, "CI time")."""
    import http.client

    env.reset(options={"task_id": "bpo-gym__intervals-1"})
    commands = ("ls", "printf 'x%.0s' $(seq 1 20000); echo; echo end")
    on_time = [env.step(c)[0] for c in commands]
    begin = http.client.HTTPResponse.begin

    def late_begin(self):
        time.sleep(0.5)
        return begin(self)

    monkeypatch.setattr(http.client.HTTPResponse, "begin", late_begin)
    late = [env.step(c)[0] for c in commands]
    monkeypatch.undo()
    assert "intervals" in on_time[0] and on_time[1].startswith("x" * 5000)
    assert "[... 10005 characters elided ...]" in on_time[1] and "\nend\n" in on_time[1]
    assert late == on_time


def test_snapshot_restores_edits_deletes_and_new_files(env):
    env.reset(options={"task_id": "bpo-gym__textkit-1"})
    env.step("echo hi >> README.md && mkdir -p d && ln -s README.md d/l && chmod +x pyproject.toml")
    probe = "ls -AF; stat -c '%A %n' * | sort; git status --short; md5sum README.md"
    snap = bpo_envs.snapshot(env)
    expected = env.step(probe)[0]
    env.step("rm -rf d textkit && echo x > new.txt && echo y > /etc/outside")
    bpo_envs.restore(env, snap)
    assert env.step(probe)[0] == expected
    assert "No such file" in env.step("cat /etc/outside")[0]
    snap.release()


def test_sandbox_limits(env):
    env.reset(options={"task_id": "bpo-gym__textkit-1"})
    t0 = time.monotonic()
    small = SWEBenchEnv(backend="docker", step_timeout=2, max_output_bytes=4 << 20)
    try:
        small.reset(options={"task_id": "bpo-gym__textkit-1"})
        obs, _, _, _, info = small.step("echo start; sleep 60")
        assert info["timed_out"] and "start" in obs and time.monotonic() - t0 < 30
        obs, _, _, _, info = small.step("python -c \"print('a' * 3_000_000 + 'END')\"")
        assert "characters elided" in obs and "END" in obs and len(obs) < 12_000
        obs, _, _, _, info = small.step("yes | head -c 50000000")
        assert len(obs) < 12_000 and "printed too much" in obs
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        obs, *_ = small.step(
            "python -c \"import socket; s = socket.socket(); s.settimeout(2); "
            f"print('refused' if s.connect_ex(('127.0.0.1', {port})) else 'connected')\"; "
            "ls /sys/class/net"
        )
        server.close()
        assert "connected" not in obs and "refused" in obs
        assert obs.split("refused", 1)[1].split("[exit")[0].split() == ["lo"]
        row = small.instance()
        names = [t.split("::")[1] for t in row["FAIL_TO_PASS"]]
        pattern = " -e ".join(names)
        obs, *_ = small.step(
            f"grep -rl -e {pattern} /testbed /tmp /root /opt /home /var /bpo_eval 2>/dev/null; "
            f"git log --all -p | grep -c -e {pattern}; ls /bpo_eval 2>&1 | head -1"
        )
        assert obs.split("[exit")[0].split("\n")[0] == "0" and "No such file" in obs
    finally:
        small.close()


@pytest.mark.slow
@pytest.mark.parametrize("task_id", IDS[1:])
def test_gold_patch_resolves_every_instance(env, task_id):
    env.reset(options={"task_id": task_id})
    for action in env.unwrapped.expert_actions():
        obs, reward, terminated, truncated, info = env.step(action)
    assert reward == 1.0 and info["won"]

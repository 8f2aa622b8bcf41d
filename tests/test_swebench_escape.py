"""Escape attempts against BPO-SWEBench-v0's local (bubblewrap) sandbox: each fails or is
contained by the limits, and the env keeps working afterwards."""

from __future__ import annotations

import shutil
import subprocess
import time

import gymnasium as gym
import pytest

import bpo_envs  # noqa: F401

pytest.importorskip("swebench", reason="needs the swe extra: pip install 'bpo-gym[swe]'")
pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None,
    reason="bubblewrap is not installed (bpo-gym-setup swebench installs it)",
)

from sandbox_support import step as _step  # noqa: E402
from sandbox_support import still_works as _still_works  # noqa: E402

from bpo_envs.swebench import SWEBenchEnv  # noqa: E402

TASK = "bpo-gym__textkit-1"
LIMITS = dict(cpu_seconds=2, memory_bytes=512 << 20, max_processes=64,
              max_file_bytes=8 << 20, disk_quota_bytes=32 << 20)


@pytest.fixture(scope="module")
def env():
    e = gym.make("BPO-SWEBench-v0", step_timeout=8, **LIMITS)
    yield e
    e.close()


def _host_pids(pattern):
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return out.split()


def test_memory_hog_fails(env):
    env.reset(options={"task_id": TASK})
    obs, info = _step(env, "python -c 'b = bytearray(4 << 30); print(\"ALLOCATED\")'")
    assert "MemoryError" in obs and "ALLOCATED" not in obs and info["exit_code"] != 0
    _still_works(env)


def test_cpu_spinner_is_cut_by_cpu_time(env):
    env.reset(options={"task_id": TASK})
    t0 = time.monotonic()
    obs, info = _step(env, "python -c 'while True: pass'")
    assert time.monotonic() - t0 < 6 and not info["timed_out"]  # CPU limit 2 s, timeout 8 s
    assert info["exit_code"] == 152 and "CPU time limit of 2 s" in obs
    _still_works(env)


def test_fork_bomb_is_bounded(env):
    env.reset(options={"task_id": TASK})
    t0 = time.monotonic()
    obs, info = _step(env, ":(){ :|:& };:; sleep 2; echo survived")
    assert time.monotonic() - t0 < 10
    assert "Resource temporarily unavailable" in obs  # forks past max_processes fail
    cgroup = env.unwrapped._backend.sandbox.cgroup
    if cgroup is not None:
        assert cgroup.pids() == []  # nothing of it is left
    obs, info = _step(env, "ps -e --no-headers | wc -l")
    assert int(obs.split()[0]) <= 4  # bash, ps, wc (and the namespace's init)
    _still_works(env)


def test_many_threads_are_bounded(env):
    if env.unwrapped._backend.sandbox.cgroup is None:
        pytest.skip("no writable pids cgroup on this host")
    env.reset(options={"task_id": TASK})
    obs, _ = _step(env, "python -c \"\nimport threading, time\nn = 0\ntry:\n    for _ in range(500):\n"
                        "        threading.Thread(target=time.sleep, args=(3,), daemon=True).start(); n += 1\n"
                        "except RuntimeError:\n    pass\nprint('threads', n)\"")
    assert int(obs.split("threads")[1].split()[0]) < 64


def test_large_file_is_cut(env):
    env.reset(options={"task_id": TASK})
    obs, info = _step(env, "yes > big; stat -c %s big; head -c 20M /dev/zero > /tmp/x; stat -c %s /tmp/x")
    assert "File size limit exceeded" in obs
    assert obs.count(str(8 << 20)) == 2
    _still_works(env)


def test_filling_the_disk_is_undone(env):
    env.reset(options={"task_id": TASK})
    _step(env, "echo kept > kept.txt")
    obs, info = _step(env, "mkdir fill; for i in $(seq 100); do head -c 4M /dev/zero > fill/f$i; done; "
                           "echo wrote")
    assert "disk quota exceeded" in obs and "changes undone" in obs
    obs, _ = _step(env, "ls; du -s -m . | cut -f1")
    assert "fill" not in obs and "kept.txt" in obs
    assert int(obs.split()[-4]) < 32
    # many files in /tmp: bounded by its tmpfs size
    # (count only the files written: the repo or venv may be bind-mounted below /tmp)
    obs, _ = _step(env, "for i in $(seq 20); do head -c 4M /dev/zero > /tmp/bpo-fill-$i || break; done; "
                        "du -c -m /tmp/bpo-fill-* | tail -n 1 | cut -f1")
    assert "No space left on device" in obs and int(obs.split()[-4]) <= 32
    _still_works(env)


def test_endless_disk_writer_is_killed_during_the_step():
    env = gym.make("BPO-SWEBench-v0", step_timeout=30, **LIMITS)
    try:
        env.reset(options={"task_id": TASK})
        t0 = time.monotonic()
        obs, info = _step(env, "i=0; while true; do i=$((i+1)); head -c 1M /dev/zero > f$i; sleep 0.01; done")
        assert time.monotonic() - t0 < 10 and not info["timed_out"]
        assert "disk quota exceeded" in obs
        _still_works(env)
    finally:
        env.close()


@pytest.mark.parametrize("spawn", [
    "sleep 1000 &",
    "nohup sleep 1001 >/dev/null 2>&1 &",
    "setsid sleep 1002 >/dev/null 2>&1 < /dev/null &",
    "(setsid bash -c 'sleep 1003 &' &)",
])
def test_background_processes_do_not_survive_the_step(env, spawn):
    env.reset(options={"task_id": TASK})
    obs, info = _step(env, f"{spawn} echo started")
    assert "started" in obs
    obs, _ = _step(env, "ps -eo args --no-headers | grep -c '^sleep 10' || true")
    assert obs.split()[0] == "0"
    assert _host_pids("^sleep 100[0-3]$") == []


def test_cannot_see_host_processes_or_write_outside(env):
    env.reset(options={"task_id": TASK})
    obs, _ = _step(env, "ls /proc | grep -c '^[0-9]'; cat /proc/1/cmdline | tr '\\0' ' '; echo; "
                        "echo x > /proc/sys/kernel/hostname 2>&1 || echo RO; "
                        "touch /usr/pwned /x 2>&1 | wc -l; ls /root /home 2>&1 | head -2")
    lines = obs.splitlines()
    assert int(lines[0]) <= 4  # only the sandbox's own processes
    assert "bwrap" in lines[1] or "bash" in lines[1]
    assert "RO" in obs and "pwned" not in subprocess.run(["ls", "/usr"], capture_output=True, text=True).stdout


def test_hidden_test_patch_not_readable():
    # its own env: searching the whole filesystem outlasts the 8 s step of the others on a busy host
    env = gym.make("BPO-SWEBench-v0", step_timeout=120)
    try:
        env.reset(options={"task_id": TASK})
        row = env.unwrapped.instance()
        marker = [t.split("::")[1] for t in row["FAIL_TO_PASS"]][0]
        # every file but the read-only system trees shared with the host (/usr, the Python
        # install: gigabytes of torch to read on a busy host)
        obs, info = _step(env, "p=$(python -c 'import sys; print(sys.base_prefix)'); "
                               "v=$(python -c 'import sys; print(sys.prefix)'); "
                               "find / \\( -path /proc -o -path /sys -o -path /dev -o -path /usr -o -path \"$p\" "
                               "-o -path \"$v\" \\) -prune -o -type f -print0 2>/dev/null "
                               f"| xargs -0 grep -l {marker} 2>/dev/null | head; echo done")
        assert not info["timed_out"] and "done" in obs
        assert marker not in obs.replace(f"grep -l {marker}", "")
    finally:
        env.close()


@pytest.mark.parametrize("kwargs", [
    {"cpu_seconds": 0}, {"cpu_seconds": 1.5}, {"memory_bytes": 1024}, {"max_processes": 2},
    {"max_file_bytes": -1}, {"disk_quota_bytes": "big"}, {"max_processes": True},
])
def test_bad_limits_are_errors(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        SWEBenchEnv(**kwargs)

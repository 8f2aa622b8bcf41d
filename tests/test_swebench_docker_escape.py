"""Escape attempts against BPO-SWEBench-v0's docker backend (the counterpart of
test_swebench_escape.py for the bubblewrap sandbox): each fails or is contained by the
container's limits, and the env keeps working afterwards.

Needs a Docker daemon and the base image bpo-gym-setup swebench builds; skips otherwise.
"""

from __future__ import annotations

import subprocess
import time

import pytest

pytest.importorskip("swebench", reason="needs the swe extra: pip install 'bpo-gym[swe]'")
docker = pytest.importorskip("docker", reason="needs docker-py: pip install 'bpo-gym[swe]'")

from docker_support import docker_problem  # noqa: E402
from sandbox_support import step as _step  # noqa: E402
from sandbox_support import still_works as _still_works  # noqa: E402

from bpo_envs.swebench import SWEBenchEnv  # noqa: E402

_PROBLEM = docker_problem()
pytestmark = pytest.mark.skipif(_PROBLEM is not None, reason=_PROBLEM or "")

TASK = "bpo-gym__textkit-1"
LIMITS = dict(memory_bytes=256 << 20, max_processes=64, max_file_bytes=8 << 20,
              disk_quota_bytes=32 << 20)


@pytest.fixture(scope="module")
def env():
    e = SWEBenchEnv(backend="docker", step_timeout=8, **LIMITS)
    yield e
    e.close()


def _leftovers(env) -> list[str]:
    """Processes other than init, the main ``sleep infinity`` and this probe's own."""
    # (the base image has no ps)
    # (the base image has no ps; shells are skipped: this probe runs in some)
    obs, _ = _step(env, "for p in /proc/[0-9]*; do read -r c < $p/comm || continue; "
                        "[ \"$c\" = bash ] || echo \"$c: $(tr '\\0' ' ' < $p/cmdline)\"; done")
    lines = obs.split("[exit")[0].splitlines()
    probe = ("docker-init:", "sleep: sleep infinity", "timeout: timeout -s KILL", "head: head -c", "tr: tr")
    return [line for line in lines if line.strip() and not line.startswith(probe)]


def test_memory_hog_is_killed(env):
    env.reset(options={"task_id": TASK})
    obs, info = _step(env, "python -c 'b = bytearray(1 << 30); print(\"ALLOCATED\")'")
    assert "ALLOCATED" not in obs and info["exit_code"] in (1, 137)
    assert "MemoryError" in obs or "memory limit" in obs
    _still_works(env)


def test_cpu_spinner_is_cut_by_the_step_timeout(env):
    env.reset(options={"task_id": TASK})
    t0 = time.monotonic()
    obs, info = _step(env, "python -c 'while True: pass' & python -c 'while True: pass'")
    assert info["timed_out"] and time.monotonic() - t0 < 20
    assert _leftovers(env) == []
    _still_works(env)


def test_fork_bomb_is_bounded_and_cleaned_up(env):
    env.reset(options={"task_id": TASK})
    t0 = time.monotonic()
    obs, info = _step(env, ":(){ :|:& };:; sleep 2; echo survived")
    assert time.monotonic() - t0 < 30
    assert "Resource temporarily unavailable" in obs  # forks past pids_limit fail
    assert _leftovers(env) == []
    _still_works(env)


def test_background_processes_do_not_survive_the_step(env):
    env.reset(options={"task_id": TASK})
    obs, _ = _step(env, "sleep 1000 & (setsid sleep 1001 >/dev/null 2>&1 &); nohup sleep 1002 >/dev/null 2>&1 & echo started")
    assert "started" in obs
    assert not [line for line in _leftovers(env) if "sleep 100" in line]


def test_large_file_is_cut(env):
    env.reset(options={"task_id": TASK})
    obs, info = _step(env, "head -c 20M /dev/zero > big; stat -c %s big")
    assert str(8 << 20) in obs and "File size limit exceeded" in obs
    _still_works(env)


def test_filling_the_disk_is_stopped(env):
    env.reset(options={"task_id": TASK})
    t0 = time.monotonic()
    obs, info = _step(env, "mkdir -p fill; i=0; while true; do i=$((i+1)); head -c 4M /dev/zero > fill/f$i; sleep 0.05; done")
    assert time.monotonic() - t0 < 8 and not info["timed_out"]  # killed before the 8 s timeout
    assert "disk quota exceeded (the command was killed)" in obs
    obs, _ = _step(env, "du -s -m fill | cut -f1")
    assert int(obs.split()[0]) < 32 + 4 * 25  # at most ~1 s of writing past the quota
    obs, _ = _step(env, "rm -rf fill && echo freed")
    assert "freed" in obs and "quota" not in obs
    _still_works(env)


def test_writes_outside_testbed_stay_in_the_container(env):
    env.reset(options={"task_id": TASK})
    snap = env.snapshot()
    obs, _ = _step(env, "echo pwned > /usr/bpo_pwned && echo x > /etc/bpo_outside && cat /usr/bpo_pwned; "
                        "ls /sys/class/net; cat /proc/1/cmdline | tr '\\0' ' '")
    assert "pwned" in obs and obs.split("pwned", 1)[1].split()[0] == "lo"  # no network either
    assert "docker-init" in obs or "sleep" in obs  # its own pid namespace
    assert subprocess.run(["ls", "/usr/bpo_pwned"], capture_output=True).returncode != 0
    env.restore(snap)
    obs, _ = _step(env, "cat /usr/bpo_pwned /etc/bpo_outside")
    assert obs.count("No such file") == 2
    snap.release()


def test_hidden_test_patch_not_readable():
    # its own env with a generous step limit: the module env's 8 s is the timeout tests'. A grep
    # of the whole file system takes 0.4-0.7 s on idle cores, and a step cut by the limit under
    # a loaded suite would read as a failure that says nothing about the patch (the message
    # shows the observation's tail)
    env = SWEBenchEnv(backend="docker", step_timeout=120, **LIMITS)
    try:
        env.reset(options={"task_id": TASK})
        row = env.instance()
        marker = [t.split("::")[1] for t in row["FAIL_TO_PASS"]][0]
        obs, _ = _step(env, f"grep -rl {marker} / --exclude-dir=proc --exclude-dir=sys 2>/dev/null | head; "
                            f"git log --all -p | grep -c {marker}; echo done")
    finally:
        env.close()
    listing = obs.replace(f"grep -rl {marker}", "")
    assert marker not in listing and "done" in obs, obs[-500:]
    assert listing.split("done")[0].split()[-1] == "0"


def _cpu_ns(container_id: str) -> int | None:
    """CPU nanoseconds the container used (cgroup v1 cpuacct, or v2 cpu.stat)."""
    from pathlib import Path

    for path, scale in ((f"/sys/fs/cgroup/cpuacct/docker/{container_id}/cpuacct.usage", 1),
                        (f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/cpu.stat", 1000)):
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        if scale == 1:
            return int(text)
        return next(int(line.split()[1]) * scale for line in text.splitlines() if line.startswith("usage_usec"))
    return None


WORK = ("python3 -c \"import time; t = time.perf_counter(); sum(i * i for i in range(1500000)); "
        "print('took', time.perf_counter() - t)\"")


def test_cpu_hog_stays_within_its_quota_beside_a_timed_neighbour():
    import threading

    cpus = 0.5
    hog = SWEBenchEnv(backend="docker", step_timeout=60, cpus=cpus)
    neighbour = SWEBenchEnv(backend="docker", step_timeout=60, cpus=cpus)
    try:
        hog.reset(options={"task_id": TASK})
        neighbour.reset(options={"task_id": TASK})
        box = hog.unwrapped._backend.container
        box.reload()
        assert box.attrs["HostConfig"]["NanoCpus"] == int(cpus * 1e9)
        assert "no-new-privileges" in box.attrs["HostConfig"]["SecurityOpt"]
        assert box.attrs["HostConfig"]["CapDrop"] == ["ALL"] and "NET_RAW" not in box.attrs["HostConfig"]["CapAdd"]

        def timed() -> float:
            return float(_step(neighbour, WORK)[0].split("took", 1)[1].split()[0])

        alone = sorted(timed() for _ in range(3))[1]
        loops = threading.Thread(target=_step, args=(hog, "for i in 1 2 3 4; do (while :; do :; done) & done; sleep 12"))
        loops.start()
        time.sleep(2.0)
        cpu0, t0 = _cpu_ns(box.id), time.monotonic()
        beside = sorted(timed() for _ in range(3))[1]
        time.sleep(max(0.0, 4.0 - (time.monotonic() - t0)))
        cpu1, t1 = _cpu_ns(box.id), time.monotonic()
        loops.join()
        used = None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) / 1e9 / (t1 - t0)
        print(f"\nCPU hog (4 busy loops, quota {cpus} CPUs): neighbour {alone:.3f} s alone, {beside:.3f} s "
              f"beside it (x{beside / alone:.2f}); the hog used {used if used is None else round(used, 3)} CPUs")
        if used is not None:  # the quota holds however loaded the host is (it can only use less)
            assert used <= cpus * 1.15
        _still_works(hog)
    finally:
        hog.close()
        neighbour.close()

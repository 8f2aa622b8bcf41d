"""The local (bubblewrap) sandbox's memory, namespace, inode and snapshot-storage limits, each
attacked as an agent would: many processes that together pass the memory limit, ``unshare -U``,
100,000 empty files, a ``chmod 000`` folder, and a snapshot/release loop."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

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

from bpo_envs.swebench import local  # noqa: E402

TASK = "bpo-gym__textkit-1"
LIMITS = dict(cpu_seconds=20, memory_bytes=384 << 20, max_processes=64, max_file_bytes=64 << 20, disk_quota_bytes=64 << 20)


@pytest.fixture(scope="module")
def env():
    e = gym.make("BPO-SWEBench-v0", step_timeout=30, **LIMITS)
    yield e
    e.close()


# every one of 4 processes stays under the per-process RLIMIT_AS (384 MiB) and touches 250 MB:
# 1 GB together, which only a limit on the whole command stops
_HOGS = ("for i in 1 2 3 4; do python -c 'import time; b = bytearray(250 << 20); b[::4096] = b\"x\" * len(b[::4096]); "
         "time.sleep(3); print(\"HELD\", flush=True)' & done; wait")


def test_processes_together_cannot_pass_the_memory_limit(env):
    sandbox = env.unwrapped._backend.sandbox
    if sandbox.memory is None:
        pytest.skip("no writable memory cgroup here: only the per-process RLIMIT_AS applies (docs/envs.md)")
    env.reset(options={"task_id": TASK})
    obs, info = _step(env, _HOGS)
    assert obs.splitlines().count("HELD") < 4, obs
    assert "passed the memory limit of 402653184 bytes" in obs
    _still_works(env)


def test_the_sandbox_is_the_oom_killers_first_choice(env):
    env.reset(options={"task_id": TASK})
    obs, info = _step(env, "cat /proc/self/oom_score_adj; sh -c 'cat /proc/self/oom_score_adj'")
    assert obs.split()[:2] == ["1000", "1000"]
    if not _host_has_cap_sys_resource():
        pytest.skip("this host runs without CAP_SYS_RESOURCE, so the kernel lets anyone lower oom_score_adj again")
    # the kernel keeps it from going below what a privileged parent set (oom_score_adj_min)
    obs, info = _step(env, "echo 0 > /proc/self/oom_score_adj; cat /proc/self/oom_score_adj")
    assert "1000" in obs.split() and "0" not in obs.splitlines()


def _host_has_cap_sys_resource() -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> 24 & 1)  # CAP_SYS_RESOURCE = 24
    return False


def test_no_new_user_namespaces(env):
    env.reset(options={"task_id": TASK})
    for attempt in ("unshare -U id", "unshare -Ur id",
                    "python -c 'import os; os.unshare(os.CLONE_NEWUSER); print(\"UNSHARED\")'"):
        obs, info = _step(env, attempt)
        assert info["exit_code"] != 0 and "UNSHARED" not in obs and "uid=" not in obs, (attempt, obs)
    _still_works(env)


@pytest.mark.slow
def test_empty_files_count_against_the_quota(env):
    env.reset(options={"task_id": TASK})
    obs, info = _step(env, "mkdir many && cd many && python -c 'import os\nfor i in range(100_000): open(str(i), \"w\").close()'")
    assert "disk quota exceeded" in obs and "at least 4096 bytes each" in obs
    obs, _ = _step(env, "ls many 2>&1 | head -1")
    assert "No such file" in obs  # the command's changes were undone
    _still_works(env)


def test_a_folder_the_host_cannot_read_is_over_quota(tmp_path):
    tree = tmp_path / "testbed"
    (tree / "hidden").mkdir(parents=True)
    (tree / "hidden" / "data.bin").write_bytes(os.urandom(1 << 20))
    readable = local.disk_usage(tree)
    assert (1 << 20) <= readable < local.UNREADABLE
    (tree / "hidden").chmod(0)
    try:
        # as a host user that cannot read it (root reads any folder: the check runs without
        # root's CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH)
        code = f"from bpo_envs.swebench.local import disk_usage; print(disk_usage(__import__('pathlib').Path({str(tree)!r})))"
        argv = [sys.executable, "-c", code]
        if os.getuid() == 0:
            if shutil.which("setpriv") is None:
                pytest.skip("setpriv (util-linux) is needed to drop root's read override")
            argv = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *argv]
        out = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        assert int(out.stdout) == local.UNREADABLE, out.stderr
    finally:
        (tree / "hidden").chmod(0o755)


@pytest.mark.slow
def test_chmod_000_folder_full_of_data_is_still_counted(env):
    env.reset(options={"task_id": TASK})
    obs, info = _step(env, "mkdir vault && head -c 40000000 /dev/urandom > vault/a && head -c 40000000 /dev/urandom > vault/b; "
                           "chmod 000 vault; echo done")
    assert "disk quota exceeded" in obs
    _still_works(env)


def _store_bytes(env) -> int:
    return local.disk_usage(env.unwrapped._backend.store.path / "objects")


@pytest.mark.slow
def test_released_snapshots_free_their_objects(monkeypatch):
    monkeypatch.setattr(local.ObjectStore, "PRUNE_GRACE", "now")  # one thread: nothing is being written meanwhile
    e = gym.make("BPO-SWEBench-v0", step_timeout=30, **LIMITS)
    try:
        e.reset(options={"task_id": TASK})
        kept = e.unwrapped.snapshot()
        start = _store_bytes(e)
        for i in range(48):
            _step(e, f"head -c 1000000 /dev/urandom > blob{i % 3}.bin")
            e.unwrapped.snapshot().release()
        grown = _store_bytes(e) - start
        assert grown < 8_000_000, grown  # 48 MB written, at most the last prune's 16 MB + live files kept
        e.unwrapped.restore(kept)  # a live snapshot is never pruned
        obs, _ = _step(e, "ls blob0.bin")
        assert "No such file" in obs
        _still_works(e)
    finally:
        e.close()

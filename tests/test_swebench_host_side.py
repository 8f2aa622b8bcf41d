"""The host's side of a SWE-bench step against a hostile tree (docs/reliability.md#the-host-side-of-a-step):
sparse files count at their apparent size, any tree shape (3,000 nested folders, FIFOs, sockets,
255-byte names, a 150,000-file folder) is an observation, ``close()`` and ``bpo-gym-setup clean``
never recurse on the agent's depth, crafted portable bytes never reach outside the sandbox, and
the local sandbox sees none of the host's secrets in ``/etc``.

Each attack is sent as the agent would send it, with ``step_timeout=3``; it must be answered
within the step timeout + 15 s, and the next step must work with the files kept.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest
from docker_support import docker_problem  # noqa: E402
from sandbox_support import step, still_works  # noqa: E402

import bpo_envs  # noqa: F401 - registers the env ids
from bpo_envs.core import SnapshotError
from bpo_envs.swebench import owners
from bpo_envs.swebench.tree import (
    MAX_PATH_BYTES,
    SCRUB_DEPTH,
    remove_tree,
    scan_tree,
    scrub_changed,
)

TASK = "bpo-gym__textkit-1"
STEP_TIMEOUT = 3.0
ANSWER_WITHIN = STEP_TIMEOUT + 15.0
NO_BWRAP = pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bubblewrap (bpo-gym-setup swebench)")
_DOCKER = docker_problem()
DOCKER = pytest.mark.skipif(_DOCKER is not None, reason=_DOCKER or "")
BACKENDS = [pytest.param("local", marks=NO_BWRAP), pytest.param("docker", marks=DOCKER)]
BACKENDS_DOCKER_SLOW = [pytest.param("local", marks=NO_BWRAP),
                        pytest.param("docker", marks=[DOCKER, pytest.mark.slow])]  # 12-15 s there
DEEP = "mkdir -p $(printf 'd/%.0s' $(seq 3000)) && echo made"


def _make(backend: str, **kwargs):
    pytest.importorskip("swebench", reason="needs the swe extra: pip install 'bpo-gym[swe]'")
    kwargs.setdefault("step_timeout", STEP_TIMEOUT)
    return gym.make("BPO-SWEBench-v0", backend=backend, instance_ids=[TASK], **kwargs)


@pytest.fixture(scope="module", params=BACKENDS)
def env(request):
    e = _make(request.param)
    yield e
    e.close()


def _attack(env, action: str) -> tuple[str, dict]:
    env.reset(options={"task_id": TASK})
    step(env, "echo kept > kept.txt")
    t0 = time.monotonic()
    obs, info = step(env, action)
    took = time.monotonic() - t0
    print(f"\n{env.unwrapped.backend_name}: {action[:60]!r} answered in {took:.1f} s: {obs[-200:]!r}")
    assert took < ANSWER_WITHIN, (took, obs)
    t0 = time.monotonic()
    after, _ = step(env, "cat kept.txt")
    assert time.monotonic() - t0 < ANSWER_WITHIN
    assert "kept" in after, after
    return obs, info


# ---- sparse files ---------------------------------------------------------------------------------
def test_sparse_files_count_at_their_apparent_size(env):
    # 4 KiB on disk each, 4 GiB to read: over the 2 GiB quota, handled as an exceeded quota
    obs, _ = _attack(env, "truncate -s 1G s1 s2 s3 s4; ls -l s1")
    assert "disk quota exceeded" in obs and "1073741824" in obs
    if env.unwrapped.backend_name == "local":
        assert "changes undone" in obs
        assert "No such file" in step(env, "ls s1")[0]  # undone: nothing left to read
    else:  # docker removes what the command wrote past the quota, largest first, and says so
        assert "the host removed, largest first, /testbed/s" in obs
        left = step(env, "ls s1 s2 s3 s4 2>/dev/null | wc -l")[0].split()[0]
        assert int(left) <= 2  # at most 2 GiB of them kept: a snapshot reads no more
        step(env, "rm -f s1 s2 s3 s4")
    still_works(env)


@DOCKER
def test_the_writable_layer_is_found_without_the_storage_drivers_record():
    # the containerd image store (Docker's default for new installs from 29.0) records no
    # overlay folders: the quota then reads the container's root mount, as its init sees it
    from types import SimpleNamespace

    from bpo_envs.swebench.docker_backend import _layers

    env = _make("docker")
    try:
        env.reset(options={"task_id": TASK})
        box = env.unwrapped._backend.container
        box.reload()
        recorded = _layers(box)
        assert recorded[0] and recorded[1]  # overlay2 here: its record
        unrecorded = SimpleNamespace(id=box.id, attrs={"GraphDriver": {"Name": "overlayfs", "Data": None},
                                                       "State": box.attrs["State"]})
        upper, lowers = _layers(unrecorded)
        assert upper == recorded[0]  # the image layers by overlay2's short links to the same folders
        assert [os.path.realpath(d) for d in lowers] == [os.path.realpath(d) for d in recorded[1]]
        # the broken case: a process whose root is no overlay (this test's own) gives no layer
        host = SimpleNamespace(id="host", attrs={"GraphDriver": {}, "State": {"Pid": os.getpid()}})
        assert _layers(host) == (None, [])
    finally:
        env.close()


@NO_BWRAP
@pytest.mark.slow
def test_what_git_cannot_record_within_the_deadline_is_undone_or_kept_whole():
    # one sparse 1 GiB file is within the quota, but hashing it may take longer than the step's
    # 3 s: either it is recorded (and a restore brings it back whole) or the command is undone
    env = _make("local")
    try:
        obs, _ = _attack(env, "truncate -s 1G big; echo written")
        if "could not record /testbed within the step's timeout" in obs:
            assert "No such file" in step(env, "ls big")[0]
        else:
            snap = env.unwrapped.snapshot()
            step(env, "rm big")
            env.unwrapped.restore(snap)
            assert "1073741824" in step(env, "stat -c %s big")[0]
            snap.release()
        still_works(env)
    finally:
        env.close()


# ---- a snapshot within the deadline (docker: a daemon call) -------------------------------------
def _snapshot_tags() -> set[str]:
    from bpo_envs.swebench.daemon import docker_client

    images = docker_client().images.list(name=owners.SNAPSHOT_REPO,
                                         filters={"label": f"{owners.LABEL_PID}={os.getpid()}"})
    return {tag for image in images for tag in image.tags}


@DOCKER
def test_a_docker_snapshot_past_its_deadline_is_a_clear_error_and_leaves_nothing(monkeypatch):
    from bpo_envs.swebench import docker_backend

    env = _make("docker")
    try:
        env.reset(options={"task_id": TASK})
        step(env, "echo kept > kept.txt")
        before = _snapshot_tags()
        # a 1 ms deadline: no daemon commits a container that fast, so the host stops waiting
        monkeypatch.setattr(docker_backend, "SNAPSHOT_GRACE_S", 0.001 - STEP_TIMEOUT)
        with pytest.raises(SnapshotError, match="could not take a snapshot within") as caught:
            env.unwrapped.snapshot()
        assert isinstance(caught.value, docker_backend.SnapshotTimeoutError)
        assert "kept" in step(env, "cat kept.txt")[0]  # the env goes on, its files unchanged
        backend = env.unwrapped._backend
        assert backend.settle(120)  # the late commit ended ...
        assert _snapshot_tags() == before  # ... and its image was removed
        monkeypatch.undo()
        still_works(env)  # with the deadline back, snapshots and restores work
    finally:
        env.close()


@DOCKER
@pytest.mark.slow
def test_a_docker_snapshot_of_a_large_tree_is_kept_whole_or_refused_in_time():
    # one sparse 1 GiB file is within the quota; its commit reads 1 GiB (10-12 s here), which
    # may be more than the step's 3 s + the grace: either the snapshot restores it whole, or
    # it is refused within the deadline and nothing is kept
    from bpo_envs.swebench import docker_backend

    env = _make("docker")
    try:
        _attack(env, "truncate -s 1G big; echo written")
        before = _snapshot_tags()
        t0 = time.monotonic()
        try:
            snap = env.unwrapped.snapshot()
        except docker_backend.SnapshotTimeoutError:
            assert time.monotonic() - t0 < STEP_TIMEOUT + docker_backend.SNAPSHOT_GRACE_S + 5
            assert env.unwrapped._backend.settle(120)
            assert _snapshot_tags() == before
        else:
            step(env, "rm big")
            env.unwrapped.restore(snap)
            assert "1073741824" in step(env, "stat -c %s big")[0]
            snap.release()
        step(env, "rm -f big")
        still_works(env)
    finally:
        env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_grading_shares_eval_timeout_between_the_diff_and_the_test_run(backend):
    # the host's diff and the test run together answer within eval_timeout (+ the host's grace):
    # a diff that took 2 s leaves the test run 2 s less (the real backend runs both; the spy
    # only delays the diff and records the deadlines it was given)
    from bpo_envs.swebench.local import DIFF_TIMEOUT_S

    env = _make(backend, eval_timeout=40.0)
    try:
        env.reset(options={"task_id": TASK})
        backend_ = env.unwrapped._backend
        given: dict[str, float] = {}
        model_patch, run_eval = backend_.model_patch, backend_.run_eval

        def slow_diff(row, timeout):
            given["diff"] = timeout
            time.sleep(2.0)
            return model_patch(row, timeout)

        def eval_left(row, patch, script, timeout, log_path):
            given["eval"] = timeout
            return run_eval(row, patch, script, timeout, log_path)

        backend_.model_patch, backend_.run_eval = slow_diff, eval_left
        obs, _, terminated, _, info = env.step("submit")
        assert terminated and "Grading:" in obs
        assert given["diff"] == min(DIFF_TIMEOUT_S, 40.0)
        assert given["eval"] <= 40.0 - 2.0
    finally:
        env.close()


# ---- tree shapes ----------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS_DOCKER_SLOW)
def test_three_thousand_nested_folders_are_an_observation(backend):
    env = _make(backend)
    try:
        obs, info = _attack(env, DEEP)
        assert "[exit code:" in obs
        if backend == "local":
            assert f"longer than {MAX_PATH_BYTES} bytes" in obs and "changes undone" in obs
        else:  # too deep to measure: removed from its first folder the image does not have
            assert "the host removed, largest first, /testbed/d" in obs
        assert "No such file" in step(env, "ls d")[0]
        still_works(env)
    finally:
        env.close()


def test_fifos_sockets_and_long_names_are_observations(env):
    name = "n" * 255
    obs, _ = _attack(env, "mkfifo fifo; python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\"; "
                          f"touch {name}; mkdir -p {'m' * 255}/{'k' * 255}; ls -F fifo sock")
    assert "fifo|" in obs and "sock=" in obs
    snap = env.unwrapped.snapshot()  # never opens the FIFO (it would wait for a writer)
    step(env, f"rm {name}")
    env.unwrapped.restore(snap)
    assert name in step(env, "ls")[0]  # files and links are kept; FIFOs and sockets are not recorded
    snap.release()
    still_works(env)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_150000_file_folder_is_an_observation(backend):
    # 150,000 empty files: 600 MB of the quota (4 KiB each), within it. Given 30 s to make them,
    # the step is answered (recorded, or undone when the host cannot record it in time), and
    # the env goes on (the restore contract on such a folder: studies/swebench_attacks.py)
    env = _make(backend, step_timeout=30)
    try:
        env.reset(options={"task_id": TASK})
        t0 = time.monotonic()
        obs, info = step(env, "python3 -c \"import os; os.mkdir('many'); "
                              "[open(f'many/{i}', 'w').close() for i in range(150000)]\" && echo made")
        assert time.monotonic() - t0 < 2 * 30 + 15 and "[exit code:" in obs, obs
        count, _ = step(env, "ls many 2>/dev/null | wc -l")
        assert "made" not in obs or "changes were undone" in obs or "150000" in count, (obs, count)
        step(env, "rm -rf many")
        still_works(env)
    finally:
        env.close()


@pytest.mark.parametrize("backend", BACKENDS_DOCKER_SLOW)
def test_close_after_a_deep_tree_never_raises_and_leaves_nothing(backend):
    env = _make(backend)
    env.reset(options={"task_id": TASK})
    if backend == "local":
        # a tree kept in the working copy (below the path limit) but deeper than Python's recursion limit
        step(env, "mkdir -p $(printf 'e/%.0s' $(seq 1100)) && echo made")
        root = env.unwrapped._backend.ws.root
        assert (root / "testbed" / "e").is_dir()
    else:
        step(env, DEEP)
    env.close()
    if backend == "local":
        assert not root.exists()


# ---- removal and clean-up at any depth ----------------------------------------------------------
def _deep(root: Path, depth: int) -> None:
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(os.open("f", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
    finally:
        os.close(fd)


def test_remove_tree_needs_no_recursion_and_follows_no_link(tmp_path, monkeypatch):
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    tree = tmp_path / "tree"
    tree.mkdir()
    _deep(tree, 700)  # deeper than the recursion limit below (and than MAX_OPEN_DIRS)
    (tree / "link").symlink_to(outside)
    os.mkfifo(tree / "fifo")
    locked = tree / "locked" / "inner"
    locked.mkdir(parents=True)
    (tree / "locked").chmod(0)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(500)
    try:
        with pytest.raises(RecursionError):  # the broken case: what close() used before
            shutil.rmtree(tree / "d")
    finally:
        sys.setrecursionlimit(limit)
        remove_tree(tree)
    assert not tree.exists() and (outside / "keep").is_dir()


def test_scan_counts_apparent_sizes_and_stops_at_the_path_limit(tmp_path):
    with open(tmp_path / "sparse", "wb") as fh:
        fh.truncate(1 << 30)
    os.mkfifo(tmp_path / "fifo")
    scan = scan_tree(tmp_path)
    assert scan.bytes >= 1 << 30 and scan.special == ("fifo",) and scan.too_long is None
    _deep(tmp_path, MAX_PATH_BYTES // 2 + 10)
    try:
        scan = scan_tree(tmp_path)
        assert scan.too_long is not None and len(scan.too_long) > MAX_PATH_BYTES and scan.usage > 1 << 60
    finally:
        remove_tree(tmp_path / "d")  # pytest's own clean-up of tmp_path recurses


def test_scrub_removes_only_what_changed(tmp_path):
    (tmp_path / "old").write_text("old")
    (tmp_path / "sub").mkdir()
    since = time.time() + 0.5
    time.sleep(1.0)
    (tmp_path / "sub" / "new").write_text("new")
    _deep(tmp_path / "sub", 40)
    scrub_changed(tmp_path, since)
    assert (tmp_path / "old").exists() and (tmp_path / "sub").is_dir()
    assert not (tmp_path / "sub" / "new").exists()
    deepest = max(len(p.relative_to(tmp_path).parts) for p in tmp_path.rglob("*"))
    assert deepest <= SCRUB_DEPTH + 1  # the deep chain that changed went, from past the scrub depth


def test_bpo_gym_setup_clean_removes_a_dead_runs_deep_folder(tmp_path, monkeypatch, capsys):
    from bpo_envs.system import main as setup_main

    monkeypatch.setattr(owners.tempfile, "gettempdir", lambda: str(tmp_path))
    proc = __import__("subprocess").Popen(["true"])
    proc.wait()
    dead = tmp_path / f"{owners.RUN_DIR_PREFIX}{proc.pid}-99-abc"
    (dead / "ws-1" / "testbed").mkdir(parents=True)
    labels = {owners.LABEL_HOST: __import__("socket").gethostname(), owners.LABEL_PID: str(proc.pid),
              owners.LABEL_START: "99", owners.LABEL_RUN: "abc"}
    (dead / "owner.json").write_text(json.dumps(labels))
    _deep(dead / "ws-1" / "testbed", 700)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(500)
    try:
        setup_main(["clean", "--no-docker"])
    finally:
        sys.setrecursionlimit(limit)
        remove_tree(dead)  # when the clean-up failed: pytest's own clean-up of tmp_path recurses
    assert json.loads(capsys.readouterr().out)["run_dirs"] == [str(dead)]
    assert not dead.exists()


# ---- crafted portable bytes -------------------------------------------------------------------------
def _plant_empty_dir(blob: bytes, path: str) -> bytes:
    from bpo_envs import portable
    from bpo_envs.core import PORTABLE_FORMAT

    payload = portable.loads(blob, PORTABLE_FORMAT)

    def plant(node) -> bool:
        if isinstance(node, dict) and "empty_dirs" in node:
            node["empty_dirs"] = (*node["empty_dirs"], path)
            return True
        items = node.values() if isinstance(node, dict) else node if isinstance(node, (list, tuple)) else ()
        return any(plant(v) for v in items)

    assert plant(payload)
    return portable.dumps(PORTABLE_FORMAT, payload)


@NO_BWRAP
def test_crafted_portable_bytes_never_create_anything_outside(tmp_path):
    host = tmp_path / "host-folder"
    host.mkdir()
    env = _make("local")
    try:
        env.reset(options={"task_id": TASK})
        step(env, f"echo kept > kept.txt && ln -s {host} escape")
        blob = env.unwrapped.snapshot().portable()
        env.unwrapped.restore(blob)  # the state itself restores
        crafted = _plant_empty_dir(blob, "escape/made-by-restore")
        with pytest.raises(SnapshotError, match="'escape/made-by-restore' lies below 'escape'.*a link"):
            env.unwrapped.restore(crafted)
        assert list(host.iterdir()) == []
        # the control: the same path as an ordinary empty folder restores
        env.unwrapped.restore(_plant_empty_dir(blob, "fine/empty"))
        assert "empty" in step(env, "ls fine && cat kept.txt")[0]
        still_works(env)
    finally:
        env.close()


def test_empty_folders_are_made_without_following_a_link(tmp_path):
    from bpo_envs.swebench.local import make_dirs_inside

    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    (root / "file").write_text("x")
    make_dirs_inside(root, "a/b/c")
    assert (root / "a" / "b" / "c").is_dir()
    for bad in ("link/made", "file/made"):
        with pytest.raises(SnapshotError, match="not a folder of the testbed"):
            make_dirs_inside(root, bad)
    assert list(outside.iterdir()) == []


# ---- /etc ----------------------------------------------------------------------------------------
@NO_BWRAP
def test_the_local_sandbox_sees_no_host_secrets():
    from bpo_envs.swebench.local import host_secrets

    hidden = dict(host_secrets())
    assert "/etc/shadow" in hidden or not os.path.exists("/etc/shadow")
    env = _make("local")
    try:
        env.reset(options={"task_id": TASK})
        obs, _ = step(env, "cat /etc/shadow /etc/gshadow 2>&1 | wc -c; ls -A /etc/ssl/private 2>&1 | wc -l")
        counts = obs.split("[exit code")[0].split()
        assert counts[:2] == ["0", "0"], obs  # masked: empty
        if os.access("/etc/shadow", os.R_OK) and Path("/etc/shadow").stat().st_size:
            assert Path("/etc/shadow").read_text().splitlines()[0] not in obs
        # what the rows' tools need stays: passwd, group, the resolver, the alternatives' links
        obs, info = step(env, "getent passwd root && getent group root && test -e /etc/resolv.conf "
                              "&& ls /etc/alternatives | head -1 && python --version")
        assert info["exit_code"] == 0 and "root:x:0:0" in obs, obs
    finally:
        env.close()

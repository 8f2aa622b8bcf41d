"""Nothing lost on a crash, nothing run from someone else's bytes (docs/snapshots.md#trust,
docs/main-job.md): atomic comparison files, the ``--out`` lock, resume over a truncated file,
one env one thread, and every entry point that takes bytes refusing a pickle."""

from __future__ import annotations

import io
import json
import os
import pickle
import signal
import subprocess
import sys
import tarfile
import threading
import time
import warnings
from pathlib import Path

import pytest

import bpo_envs
from bpo_envs.files import CorruptFileError, FolderLock, atomic_write, read_json, write_json
from bpo_experiments import compare

ROOT = Path(__file__).resolve().parents[1]


# ---- atomic files ---------------------------------------------------------------------------
_WRITER = """
import json, sys
from pathlib import Path
from bpo_envs.files import write_json
path, mode = Path(sys.argv[1]), sys.argv[2]
value = {"rows": ["x" * 100] * 400_000}
if mode == "atomic":
    write_json(path, value)
else:
    path.write_text(json.dumps(value))  # in place: what comparison files were written with
"""


def _killed_mid_write(path: Path, mode: str) -> None:
    """Start a child writing ~40 MB of JSON to ``path`` and SIGKILL it while it writes."""
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), mode], env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        sizes = []
        for p in path.parent.iterdir():
            try:
                sizes.append(p.stat().st_size)
            except FileNotFoundError:
                pass
        if any(1_000_000 < s < 30_000_000 for s in sizes):  # the new content, part written
            break
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_a_write_killed_midway_leaves_the_old_file_whole(tmp_path):
    atomic_dir, inplace_dir = tmp_path / "atomic", tmp_path / "inplace"
    for folder in (atomic_dir, inplace_dir):
        folder.mkdir()
        write_json(folder / "results.json", {"old": True})
    _killed_mid_write(atomic_dir / "results.json", "atomic")
    assert read_json(atomic_dir / "results.json") == {"old": True}
    # the broken case this guards against: the same kill during an in-place write truncates
    _killed_mid_write(inplace_dir / "results.json", "inplace")
    with pytest.raises(CorruptFileError, match="results.json"):
        read_json(inplace_dir / "results.json")


def test_read_json_names_a_corrupt_file(tmp_path):
    path = tmp_path / "run.json"
    path.write_text('{"final_success": 0.')
    with pytest.raises(CorruptFileError, match=str(path)):
        read_json(path)
    atomic_write(path, b"{}")
    assert read_json(path) == {} and [p.name for p in tmp_path.iterdir()] == ["run.json"]


# ---- the --out lock ---------------------------------------------------------------------------
TINY = ["--smoke", "--envs", "treemdp", "--algorithms", "bpo", "rloo", "--seeds", "0", "--updates", "1", "--budget", "100",
        "--grad-batches", "2", "--no-progress", "--jobs", "1"]


def test_a_second_compare_on_the_same_folder_refuses_naming_the_holder(tmp_path):
    out = tmp_path / "cmp"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from bpo_envs.files import FolderLock\n"
         "with FolderLock(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)", str(out)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SystemExit, match=rf"in use by another bpo-compare \(pid {holder.pid}"):
            compare.main(["--out", str(out), *TINY])
        with pytest.raises(SystemExit, match=rf"pid {holder.pid}"):
            compare.main(["--out", str(out), "--resume", *TINY])
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone (killed, not cleaned up): its lock went with it
    compare.main(["--out", str(out), *TINY])
    assert (out / "results.json").exists()
    with FolderLock(out):  # and this run released it
        pass


def test_resume_names_a_truncated_file_and_redoes_that_job(tmp_path, capsys):
    out = tmp_path / "cmp"
    first = compare.main(["--out", str(out), *TINY])
    run_json = out / "runs" / "treemdp" / "rloo" / "seed0" / "run.json"
    initial_json = next(out.rglob("initial.json"))
    for path in (run_json, initial_json, out / "preset.json"):
        path.write_bytes(path.read_bytes()[:20])  # a crash mid-write by an older version
    # and someone else's policy.pt (a pickle that would create a file) beside an intact initial.json
    policy_pt = initial_json.parent / "policy.pt"
    assert policy_pt.exists()
    marker = tmp_path / "pwned"
    capsys.readouterr()
    resumed = compare.main(["--out", str(out), "--resume", *TINY])
    err = capsys.readouterr().err
    for path in (run_json, initial_json, out / "preset.json"):
        assert f"{path} is corrupt" in err
        json.loads(path.read_text())  # rewritten whole
    policy_pt.write_bytes(_payload(marker))
    (out / "results.json").unlink()
    capsys.readouterr()
    compare.main(["--out", str(out), "--resume", *TINY])
    assert f"{policy_pt} is not sealed by bpo_envs" in capsys.readouterr().err and not marker.exists()
    assert resumed["per_env"]["treemdp"]["algorithms"]["rloo"]["curve"] == first["per_env"]["treemdp"]["algorithms"]["rloo"]["curve"]


@pytest.mark.parametrize("name, damage", [
    ("checkpoint.pt", "truncated"), ("reference.pt", "pickle"),
    pytest.param("checkpoint.pt", "pickle", marks=pytest.mark.slow),
    pytest.param("reference.pt", "truncated", marks=pytest.mark.slow),
])
def test_resume_redoes_a_checkpoint_or_reference_that_does_not_load(tmp_path, capsys, name, damage):
    out = tmp_path / "cmp"
    first = compare.main(["--out", str(out), *TINY])
    run = out / "runs" / "treemdp" / "rloo" / "seed0"
    path = run / name if name == "checkpoint.pt" else next(out.rglob(name))
    assert path.exists()
    marker = tmp_path / "pwned"
    path.write_bytes(_payload(marker) if damage == "pickle" else path.read_bytes()[: path.stat().st_size // 2])
    (run / "run.json").unlink()  # the run is unfinished: a resume loads its checkpoint and the reference
    (out / "results.json").unlink()
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = compare.main(["--out", str(out), "--resume", *TINY])
    said = capsys.readouterr().err + "".join(str(w.message) for w in caught)
    assert f"{path} does not load" in said and "redoing" in said, said
    assert not marker.exists()
    # the run (and for reference.pt the initial job) was redone to the same result
    assert resumed["per_env"]["treemdp"]["algorithms"]["rloo"]["curve"] == first["per_env"]["treemdp"]["algorithms"]["rloo"]["curve"]
    assert (run / "run.json").exists()


# ---- one env, one thread ----------------------------------------------------------------------
class _SlowTree(bpo_envs.TreeMDPEnv):
    """A TreeMDP whose steps take a while, so that two threads overlap in it."""

    def __init__(self, entered: threading.Event, **kwargs):
        super().__init__(**kwargs)
        self.entered = entered

    def _step(self, action):
        self.entered.set()
        time.sleep(0.3)
        return super()._step(action)


@pytest.mark.parametrize("second", ["step", "snapshot", "restore", "reset"])
def test_a_second_thread_inside_an_env_raises(second):
    entered = threading.Event()
    env = _SlowTree(entered, depth=4, n_actions=2, seed=0)
    env.reset(seed=0)
    snap = env.snapshot()
    worker = threading.Thread(target=env.step, args=("a0",))
    worker.start()
    assert entered.wait(10)
    call = {"step": lambda: env.step("a1"), "snapshot": env.snapshot, "restore": lambda: env.restore(snap),
            "reset": lambda: env.reset(seed=1)}[second]
    with pytest.raises(bpo_envs.ConcurrentUseError, match=rf"{second}\(\) called on _SlowTree"):
        call()
    worker.join()
    assert env.elapsed_steps == 1  # the first thread's step ran whole
    env.restore(snap)  # and the env serves the next caller
    assert env.elapsed_steps == 0


def test_replay_wrapper_is_guarded_too():
    entered = threading.Event()
    env = bpo_envs.ReplaySnapshot(_SlowTree(entered, depth=4, n_actions=2, seed=0))
    env.reset(seed=0)
    worker = threading.Thread(target=env.step, args=("a0",))
    worker.start()
    assert entered.wait(10)
    with pytest.raises(bpo_envs.ConcurrentUseError):
        env.step("a1")
    worker.join()


# ---- no code from someone else's bytes ------------------------------------------------------
class _Payload:
    """Unpickling this creates ``path``: the attack every entry point must refuse."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _payload(marker: Path) -> bytes:
    return pickle.dumps(_Payload(marker))


def _check_refused(call, marker: Path, error=Exception, match: str = "pickle") -> None:
    with pytest.raises(error, match=match):
        call()
    assert not marker.exists(), "the pickle's payload ran"


@pytest.mark.parametrize("name", ["treemdp", "webshop", "alfworld", "swebench", "replay"])
def test_a_pickle_handed_to_restore_never_runs(name, tmp_path):
    from env_zoo import make_or_skip

    if name == "replay":
        env = bpo_envs.ReplaySnapshot(bpo_envs.TreeMDPEnv(depth=3, n_actions=2, seed=0))
    else:
        env = make_or_skip(name)()
    try:
        env.reset(seed=0)
        marker = tmp_path / "pwned"
        for protocol in (0, 2, pickle.HIGHEST_PROTOCOL):
            blob = pickle.dumps(_Payload(marker), protocol=protocol)
            _check_refused(lambda blob=blob: bpo_envs.restore(env, blob), marker, bpo_envs.SnapshotError)
            _check_refused(lambda blob=blob: env.unwrapped.restore(blob), marker, bpo_envs.SnapshotError)
        # the env's own portable bytes still restore
        snap = bpo_envs.snapshot(env)
        bpo_envs.restore(env, snap.portable())
    finally:
        env.close()


def test_portable_bytes_are_checked_field_by_field():
    env = bpo_envs.TreeMDPEnv(depth=3, n_actions=2, seed=0)
    env.reset(seed=0)
    env.step("a1")
    blob = env.snapshot().portable()
    other = bpo_envs.TreeMDPEnv(depth=3, n_actions=2, seed=0)
    other.restore(blob)
    assert other.elapsed_steps == 1
    from bpo_envs import portable

    bad = [
        blob[:-3],  # truncated
        blob[:8] + b"\x00\x09" + blob[10:],  # another version
        b"garbage",
        portable.dumps("bpo-snapshot/1", {"kind": 3, "state": (), "wrappers": ()}),
        portable.dumps("bpo-snapshot/1", {"kind": repr(env._snapshot_kind()), "state": ("t", "x", 1, "", {}, ()), "wrappers": ()}),
        portable.dumps("bpo-trl-episode-v1", {"env_id": "x"}),
        portable.MAGIC + b"\x00\x01\x00\x00\x10\x00" + b"[" * 4096,  # nested past any bound
    ]
    for data in bad:
        with pytest.raises(bpo_envs.SnapshotError):
            other.restore(data)
    with pytest.raises(bpo_envs.SnapshotKindError):
        bpo_envs.TreeMDPEnv(depth=3, n_actions=2, seed=1).restore(blob)


def test_trl_and_skyrl_state_inputs_refuse_a_pickle(tmp_path):
    from bpo_envs.integrations import trl as trl_env

    marker = tmp_path / "pwned"
    tool = trl_env.environment_factory("BPO-WebShop-v0")()
    _check_refused(lambda: tool.reset(state=_payload(marker)), marker, ValueError)
    tool.reset(task_id=3)
    saved = trl_env.portable_state(tool)
    other = trl_env.environment_factory("BPO-WebShop-v0")()
    other.reset(state=saved)
    assert other.episode.resumed and other.episode.context == tool.episode.context

    skyrl = pytest.importorskip("bpo_envs.integrations.skyrl")
    env = skyrl.SkyRLEnv({"env_id": "BPO-WebShop-v0"}, {"state": _payload(marker)})
    _check_refused(lambda: env.init([]), marker, ValueError)
    good = skyrl.SkyRLEnv({"env_id": "BPO-WebShop-v0"}, {"task_id": 3})
    good.init([])
    _check_refused(lambda: good.restore(_payload(marker)), marker, ValueError)
    again = skyrl.SkyRLEnv({"env_id": "BPO-WebShop-v0"}, {"state": good.portable_state()})
    assert again.init([])[1]["task_id"] == 3


def test_checkpoints_and_sealed_files_refuse_a_pickle(tmp_path, monkeypatch):
    from bpo_algos.checkpoints import CheckpointUnreadableError, load_checkpoint
    from bpo_envs import sealed

    marker = tmp_path / "pwned"
    ckpt = tmp_path / "checkpoint.pt"
    ckpt.write_bytes(_payload(marker))
    _check_refused(lambda: load_checkpoint(None, ckpt), marker, CheckpointUnreadableError,
                   match=f"{ckpt} does not load as a checkpoint .*Weights only load failed")

    monkeypatch.setenv("BPO_GYM_KEY_FILE", str(tmp_path / "key"))
    data = sealed.seal(b"policy bytes", "p")
    assert sealed.unseal(data, "p") == b"policy bytes"
    assert (tmp_path / "key").stat().st_mode & 0o777 == 0o600
    for forged in (_payload(marker), data[:-1] + b"X", sealed.seal(b"policy bytes", "other purpose")):
        with pytest.raises(sealed.SealError):
            sealed.unseal(forged, "p")
    monkeypatch.setenv("BPO_GYM_KEY_FILE", str(tmp_path / "another-users-key"))
    with pytest.raises(sealed.SealError, match="not sealed with this user's key"):
        sealed.unseal(data, "p")  # sealed by someone holding another key
    (tmp_path / "another-users-key").chmod(0o644)
    with pytest.raises(sealed.SealError, match="chmod 600"):
        sealed.seal(b"x", "p")


def _make_key(key_file: str, slow: bool, created, go_on, start_after: float, results) -> None:
    """One process asking for the user's key (``sealed.user_key``). ``slow``: it stalls right
    after it creates a file (a descheduled writer), until the test lets it go on, having set
    ``created`` so the others ask while it stalls."""
    os.environ["BPO_GYM_KEY_FILE"] = key_file
    from bpo_envs import sealed

    if slow:
        real_open = os.open

        def open_then_stall(file, flags, *args, **kwargs):
            fd = real_open(file, flags, *args, **kwargs)
            if flags & os.O_CREAT and not created.is_set():
                created.set()
                go_on.wait(timeout=30)
            return fd

        os.open = open_then_stall
    else:
        created.wait(timeout=30)
        time.sleep(start_after)
    try:
        results.put(sealed.user_key().hex())
    except Exception as error:  # what the test reports: a process that could not get the key
        results.put(f"{type(error).__name__}: {error}")


def test_processes_creating_the_key_at_once_all_get_one_whole_key(tmp_path):
    """A process that reads the key while another is creating it never sees a partial key file,
    and processes that create it at once all end up with the same key (the first to link it).
    Real processes: in each round one stalls right after creating its file, and the others,
    started at seeded jitters within 5 ms, ask for the key meanwhile. Deterministic apart from
    the jitter: on the code that wrote the key file in place the others read 0 bytes every round."""
    import multiprocessing

    import numpy as np

    context = multiprocessing.get_context("fork")
    rng = np.random.default_rng(np.random.SeedSequence(2026))
    for round_ in range(3):
        key_file = tmp_path / f"round-{round_}" / "user.key"
        created, go_on, results = context.Event(), context.Event(), context.Queue()
        jitters = rng.uniform(0.0, 0.005, size=3)
        others = [context.Process(target=_make_key, args=(str(key_file), False, created, go_on, float(j), results))
                  for j in jitters]
        slow = context.Process(target=_make_key, args=(str(key_file), True, created, go_on, 0.0, results))
        for process in [slow, *others]:
            process.start()
        keys = [results.get(timeout=60) for _ in others]  # asked while the slow one stalls
        go_on.set()
        keys.append(results.get(timeout=60))
        for process in [slow, *others]:
            process.join(timeout=60)
            assert process.exitcode == 0
        assert len(set(keys)) == 1, keys
        assert bytes.fromhex(keys[0]) == key_file.read_bytes() and len(keys[0]) == 64
        assert key_file.stat().st_mode & 0o777 == 0o600
        assert [p.name for p in key_file.parent.iterdir()] == ["user.key"]  # no temporary files left


def test_alfworld_translation_caches_from_elsewhere_are_never_unpickled(tmp_path):
    from env_zoo import make_or_skip

    env = make_or_skip("alfworld")()
    from bpo_envs.alfworld import _upstream

    marker = tmp_path / "pwned"
    try:
        task = env.unwrapped.task_ids()[0]
        game, game_path = env.unwrapped.games.game(task), env.unwrapped.games.game_path(task)
        beside = Path(str(game_path) + ".translated.pkl")  # where a shared data folder would carry one
        cached = _upstream.translation_path(game)
        cached.parent.mkdir(parents=True, exist_ok=True)
        for path in (beside, cached):
            path.write_bytes(_payload(marker))
        _upstream.clear_translation_cache()
        env.reset(options={"task_id": task})
        assert not marker.exists()
        assert cached.read_bytes().startswith(b"BPO\x00SEAL")  # rewritten, sealed
    finally:
        beside.unlink(missing_ok=True)
        env.close()


def test_docker_portable_archives_hold_testbed_only():
    pytest.importorskip("docker")
    from bpo_envs.swebench.docker_backend import check_testbed_archive

    def tar(*members: tarfile.TarInfo) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            for m in members:
                t.addfile(m, io.BytesIO(b"x" * m.size) if m.isfile() else None)
        return buf.getvalue()

    def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.size = kind, link, 1 if kind == tarfile.REGTYPE else 0
        return info

    check_testbed_archive(tar(member("testbed", tarfile.DIRTYPE), member("testbed/a.py"), member("testbed/l", tarfile.SYMTYPE, "a.py")))
    for bad in (member("usr/lib/python3/sitecustomize.py"), member("testbed/../etc/x"), member("/etc/x"),
                member("testbed/h", tarfile.LNKTYPE, "etc/passwd"), member("testbed/dev", tarfile.CHRTYPE)):
        with pytest.raises(bpo_envs.SnapshotError):
            check_testbed_archive(tar(bad))
    with pytest.raises(bpo_envs.SnapshotError):
        check_testbed_archive(_payload(Path("/nonexistent/x")))


@pytest.mark.slow
def test_the_ray_pool_refuses_a_pickle_before_it_moves(tmp_path):
    ray = pytest.importorskip("ray")
    import functools

    import gymnasium as gym

    from bpo_envs.ray_pool import RayEnvPool

    marker = tmp_path / "pwned"
    if ray.is_initialized():  # an earlier test's pool may have started Ray in this process
        ray.shutdown()
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        with RayEnvPool(functools.partial(gym.make, "BPO-TreeMDP-v0", depth=3, n_actions=2, seed=0), actors=1) as pool:
            env = pool.acquire()
            env.reset(seed=0)
            _check_refused(lambda: env.restore(_payload(marker)), marker, bpo_envs.SnapshotError)
    finally:
        ray.shutdown()

"""Nothing lost on a crash, nothing run from someone else's bytes (docs/snapshots.md#trust,
docs/main-job.md): atomic comparison files, the ``--out`` lock, resume over a truncated file,
one env one thread, and every entry point that takes bytes refusing a pickle."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import bpo_envs
from bpo_algos.experiments import compare
from bpo_envs.files import CorruptFileError, FolderLock, atomic_write, read_json, write_json

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
    capsys.readouterr()
    resumed = compare.main(["--out", str(out), "--resume", *TINY])
    err = capsys.readouterr().err
    for path in (run_json, initial_json, out / "preset.json"):
        assert f"{path} is corrupt" in err
        json.loads(path.read_text())  # rewritten whole
    assert resumed["per_env"]["treemdp"]["algorithms"]["rloo"]["curve"] == first["per_env"]["treemdp"]["algorithms"]["rloo"]["curve"]


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

"""A training run killed with SIGKILL resumes losing at most the update in progress and ends
with the same metrics as a run that was never interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import torch

RUN = textwrap.dedent(
    """
    import sys
    import gymnasium as gym
    import bpo_envs  # noqa: F401
    from bpo_algos import BPO, EnvPool, TabularPolicy, Trainer, TrainerConfig

    def make():
        return gym.make("BPO-TreeMDP-v0", depth=4, n_actions=3, seed=1, n_tasks=4)

    def trainer(out_dir, updates):
        config = TrainerConfig(updates=updates, tasks_per_update=4, budget=("env_steps", 64), out_dir=out_dir, seed=3)
        # steps in this thread (no per-step deadline: a TreeMDP step is microseconds, a handoff
        # to a worker thread is not); the batches are those of any pool of two envs
        pool = EnvPool([make, make], step_timeout_s=None)
        return Trainer(BPO(entropy_threshold=None, entropy_quantile=0.6), TabularPolicy(), pool, [0, 1, 2, 3], config)

    if __name__ == "__main__":
        trainer(sys.argv[1], int(sys.argv[2])).train()
    """
)
UPDATES = 120


def _key(rows):
    return [(r["update"], r["success"], r["loss"], r["grad_norm"], r["compute"]["env_steps"], r.get("entropy_threshold")) for r in rows]


def _complete_rows(path):
    if not path.exists():
        return []
    rows = []
    for line in path.read_bytes().split(b"\n"):
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass  # a line cut by the kill
    return rows


def _start(script, out_dir):
    return subprocess.Popen([sys.executable, str(script), str(out_dir), str(UPDATES)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _kill_after(proc, metrics, lines):
    while len(_complete_rows(metrics)) < lines:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before it was killed: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.001)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL


def test_sigkill_mid_run_resumes_to_the_same_metrics(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(RUN)
    out = tmp_path / "killed"
    metrics = out / "metrics.jsonl"
    for at in (3, 30, 31, 90):  # several kills, wherever they land within an update
        proc = _start(script, out)
        _kill_after(proc, metrics, at)
        logged = len(_complete_rows(metrics))
        checkpoint = torch.load(out / "checkpoint.pt", weights_only=False)
        # at most the update in progress is lost: its row may be logged, its checkpoint not yet
        assert logged - checkpoint["update"] in (0, 1), (logged, checkpoint["update"])
        assert not (out / "checkpoint.pt.tmp").exists() or checkpoint["update"] >= at - 1
    proc = _start(script, out)
    assert proc.wait(timeout=600) == 0, proc.stderr.read().decode()[-2000:]

    sys.path.insert(0, str(tmp_path))
    try:
        import run as straight_run  # the same code, never interrupted
    finally:
        sys.path.remove(str(tmp_path))
    straight = straight_run.trainer(tmp_path / "straight", UPDATES).train()
    resumed = _complete_rows(metrics)
    assert len(metrics.read_text().splitlines()) == UPDATES
    assert _key(resumed) == _key(straight)


def test_a_run_killed_before_its_first_checkpoint_starts_clean(tmp_path):
    """Killed after logging update 1 but before checkpointing it: the restart redoes update 1
    and the log holds each update once."""
    script = tmp_path / "run.py"
    script.write_text(RUN)
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text(json.dumps({"update": 1, "loss": 0.5}) + "\n")
    proc = subprocess.run([sys.executable, str(script), str(out), "3"], capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    rows = _complete_rows(out / "metrics.jsonl")
    assert [r["update"] for r in rows] == [1, 2, 3]

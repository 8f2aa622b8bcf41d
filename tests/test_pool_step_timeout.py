"""EnvPool's per-step deadline: a stuck env becomes a StepTimeoutError in its place, which the
engine's recovery handles like any failure; healthy steps are untouched."""

from __future__ import annotations

import inspect
import subprocess
import sys
import threading
import time

import gymnasium as gym
import pytest

import bpo_envs
from bpo_algos import BPO, TabularPolicy
from bpo_envs import pool as pool_module
from bpo_envs.pool import DEFAULT_STEP_TIMEOUT_S, EnvPool, StepTimeoutError

TREE = {"depth": 3, "n_actions": 3, "seed": 7}


class BlockingTreeMDP(bpo_envs.TreeMDPEnv):
    """A TreeMDP that declares its step may block (the wrappers below make it stall): the pool
    reads the declaration from the unwrapped env's class, so a bounded env stepped inline could
    not be stalled by a wrapper and timed out."""

    step_may_block = True


class Stalling(gym.Wrapper):
    """A TreeMDP whose step sleeps ``delay`` s when ``stall(self)`` says so; records closes."""

    def __init__(self, stall, delay: float = 30.0) -> None:
        super().__init__(BlockingTreeMDP(**TREE))
        self.stall, self.delay = stall, delay
        self.closed = threading.Event()
        self.step_threads: list[str] = []

    def step(self, action):
        self.step_threads.append(threading.current_thread().name)
        if self.stall(self):
            time.sleep(self.delay)
        return self.env.step(action)

    def close(self):
        self.closed.set()
        super().close()


def test_defaults_are_an_hour_on_both_pools_and_bad_values_are_errors():
    assert DEFAULT_STEP_TIMEOUT_S == 3600.0
    assert EnvPool([lambda: gym.make("BPO-TreeMDP-v0", **TREE)]).step_timeout_s == 3600.0
    from bpo_envs.ray_pool import RayEnvPool

    assert inspect.signature(RayEnvPool).parameters["timeout_s"].default == DEFAULT_STEP_TIMEOUT_S
    for bad in (0, -1.0, "60", True):
        with pytest.raises(ValueError, match="step_timeout_s"):
            EnvPool([lambda: gym.make("BPO-TreeMDP-v0", **TREE)], step_timeout_s=bad)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_stuck_step_gives_a_timeout_error_in_its_place_and_the_others_their_results(workers):
    envs_made: list[Stalling] = []

    def make(stall):
        def fn():
            envs_made.append(Stalling(stall))
            return envs_made[-1]
        return fn

    pool = EnvPool([make(lambda e: e is envs_made[0]), make(lambda e: False)], workers=workers, step_timeout_s=0.5)
    try:
        stuck, healthy = pool.acquire(), pool.acquire()
        for env in (stuck, healthy):
            env.reset(options={"task_id": 0})
        t0 = time.monotonic()
        out = pool.step_many([stuck, healthy], ["a0", "a1"])
        assert time.monotonic() - t0 < 3.0
        assert isinstance(out[0], StepTimeoutError) and "step_timeout_s=0.5" in str(out[0])
        assert isinstance(out[1], tuple)  # the healthy env's step, in its place
        # the stuck env is closed beside its thread (release does not wait for the step)
        t0 = time.monotonic()
        pool.release(stuck, failed=True)
        assert time.monotonic() - t0 < 1.0 and envs_made[0].closed.wait(2.0)
        # the pool goes on: a new env in the stuck one's slot steps normally
        pool.release(healthy)
        env = pool.acquire()
        env.reset(options={"task_id": 0})
        assert isinstance(pool.step_many([env], ["a0"])[0], tuple)
    finally:
        pool.close()


def test_the_deadline_counts_from_each_steps_start_not_the_batch():
    # stepped in turn (workers=1): three 0.4 s steps take 1.2 s, each within its 1 s deadline;
    # a deadline for the batch as a whole would time the third one out
    pool = EnvPool([lambda: Stalling(lambda e: True, delay=0.4)] * 3, workers=1, step_timeout_s=1.0)
    try:
        envs = [pool.acquire() for _ in range(3)]
        for env in envs:
            env.reset(options={"task_id": 0})
        t0 = time.monotonic()
        out = pool.step_many(envs, ["a0", "a0", "a0"])
        assert time.monotonic() - t0 >= 1.1 and all(isinstance(r, tuple) for r in out), out
        assert all(name == "bpo-env" for env in envs for name in env.step_threads)
    finally:
        pool.close()


def _stuck_mid_batch(n_envs: int = 4, stuck: int = 1) -> tuple[list, list[int], list]:
    """One ``step_many`` call (workers=1, so its steps go to the worker as one job) whose step
    ``stuck`` stalls 1 s past a 0.3 s deadline; the outputs, each env's step count once the
    stalled step has returned and its job had time to go on, and a fresh env's steps to compare."""
    counts = [0] * n_envs
    returned = threading.Event()
    lock = threading.Lock()

    class Counting(gym.Wrapper):
        def __init__(self, k: int) -> None:
            super().__init__(BlockingTreeMDP(**TREE))
            self.k = k

        def step(self, action):
            with lock:
                counts[self.k] += 1
                first = counts[self.k] == 1
            if self.k == stuck and first:
                time.sleep(1.0)
                out = self.env.step(action)
                returned.set()
                return out
            return self.env.step(action)

    made = iter(range(n_envs))
    pool = EnvPool([lambda: Counting(next(made))] * n_envs, workers=1, step_timeout_s=0.3)
    try:
        envs = [pool.acquire() for _ in range(n_envs)]
        for env in envs:
            env.reset(options={"task_id": 0})
        actions = [f"a{k % 3}" for k in range(n_envs)]
        out = pool.step_many(envs, actions)
        assert returned.wait(5.0)
        time.sleep(0.3)  # room for a job that went on past the stalled step
        reference = []
        for action in actions:
            env = BlockingTreeMDP(**TREE)
            env.reset(options={"task_id": 0})
            reference.append(env.step(action))
        return out, list(counts), reference
    finally:
        pool.close()


def test_a_step_stuck_mid_batch_times_out_and_the_later_steps_run_once_in_order():
    out, counts, reference = _stuck_mid_batch()
    assert isinstance(out[1], StepTimeoutError)
    for k in (0, 2, 3):  # each result in its own env's place
        assert isinstance(out[k], tuple) and out[k][:4] == reference[k][:4], (k, out[k])
    assert counts == [1, 1, 1, 1]  # the steps after the stuck one ran elsewhere, once


def test_a_batch_job_that_ignores_the_cancel_runs_the_later_steps_twice(monkeypatch):
    # the broken case the test above catches: the stuck job, once its step returns, goes on
    # with the steps that were handed to another thread
    monkeypatch.setattr(pool_module._StepBatch, "_cancelled", property(lambda self: False, lambda self, value: None), raising=False)
    out, counts, _ = _stuck_mid_batch()
    assert isinstance(out[1], StepTimeoutError) and counts == [1, 1, 2, 2]


def test_a_step_stuck_last_in_its_batch_leaves_nothing_to_resubmit():
    out, counts, _ = _stuck_mid_batch(n_envs=3, stuck=2)
    assert [type(r).__name__ for r in out] == ["tuple", "tuple", "StepTimeoutError"] and counts == [1, 1, 1]


def test_the_engine_replaces_a_stuck_env_and_finishes_the_batch():
    calls = {"n": 0}
    lock = threading.Lock()

    def stall_once(env):
        with lock:
            calls["n"] += 1
            return calls["n"] == 3  # the third step of the collection hangs

    pool = EnvPool([lambda: Stalling(stall_once)] * 2, workers=2, step_timeout_s=0.5)
    try:
        algorithm = BPO(backbones=2, branch_factor=2, entropy_threshold=0.0, max_branch_points=2, seed=0)
        batch = algorithm.collect(TabularPolicy(seed=0), pool, [0, 0])
        assert batch.n_trees == 2 and batch.compute.failures == 1
        assert batch.compute.dropped_steps == 0  # the path was retried, not dropped
    finally:
        pool.close()


def test_a_stuck_step_does_not_keep_the_process_from_exiting():
    code = (
        "import time, gymnasium as gym, bpo_envs\n"
        "from bpo_envs.pool import EnvPool, StepTimeoutError\n"
        "class Blocking(bpo_envs.TreeMDPEnv):\n"
        "    step_may_block = True\n"
        "class Hang(gym.Wrapper):\n"
        "    def step(self, a):\n"
        "        time.sleep(3600)\n"
        "pool = EnvPool([lambda: Hang(Blocking())], step_timeout_s=0.2)\n"
        "env = pool.acquire(); env.reset(options={'task_id': 0})\n"
        "print(type(pool.step_many([env], ['a0'])[0]).__name__)\n"
    )
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "StepTimeoutError", out.stderr
    assert time.monotonic() - t0 < 30


assert bpo_envs  # the env ids are registered

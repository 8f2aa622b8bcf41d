"""Slow BPO-ALFWorld-v0 sweeps: the planner expert on many generated games of every type."""

from __future__ import annotations

import pytest

pytest.importorskip("fast_downward", reason="run bpo-gym-setup alfworld")

import bpo_envs  # noqa: E402
from bpo_envs.alfworld import TASK_TYPES, ALFWorldEnv  # noqa: E402

GAMES_PER_TYPE = 8


@pytest.mark.slow
@pytest.mark.parametrize("split", ["train", "valid_unseen"])
@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_planner_sweep(task_type: str, split: str) -> None:
    env = ALFWorldEnv(split=split, task_types=[task_type], games_per_type=GAMES_PER_TYPE)
    for task_id in env.task_ids():
        obs, info = env.reset(options={"task_id": task_id})
        assert not info["won"] and "Your task is to: " in obs
        plan = env.expert_actions()
        assert plan, task_id
        for action in plan:
            obs, reward, terminated, truncated, info = env.step(action)
        assert terminated and info["won"] and reward == 1.0, (task_id, plan)
    env.close()


@pytest.mark.slow
@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_check_snapshot_sweep(task_type: str) -> None:
    env = ALFWorldEnv(task_types=[task_type], games_per_type=4)
    for seed, task_id in enumerate(env.task_ids()):
        bpo_envs.check_snapshot(env, seed=seed, steps=20, options={"task_id": task_id}, fresh_env=False)
    env.close()

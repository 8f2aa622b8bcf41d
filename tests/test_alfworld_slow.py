"""Slow BPO-ALFWorld-v0 sweep: the snapshot contract on generated games of every type (the games' plans
winning in the env: tests/test_alfworld_generator_v3.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("fast_downward", reason="run bpo-gym-setup alfworld")

import bpo_envs  # noqa: E402
from bpo_envs.alfworld import TASK_TYPES, ALFWorldEnv  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_check_snapshot_sweep(task_type: str) -> None:
    env = ALFWorldEnv(task_types=[task_type], games_per_type=4)
    for seed, task_id in enumerate(env.task_ids()):
        bpo_envs.check_snapshot(env, seed=seed, steps=20, options={"task_id": task_id}, fresh_env=False)
    env.close()

"""Evaluate one policy on TreeMDP with the main job's ``evaluate_episodes`` and save the
per-episode successes: run by ``torchrun --nproc_per_node=2`` (each rank plays every other
task) and by one process in ``tests/test_data_parallel.py``."""

from __future__ import annotations

import json
import sys

import gymnasium as gym
import torch

import bpo_envs  # noqa: F401
from bpo_algos import EnvPool
from bpo_algos import data_parallel as dp
from bpo_algos.policy.scorer import TextScorerPolicy
from bpo_experiments.evaluation import evaluate_episodes


def main() -> None:
    dp.init_from_env()
    torch.set_num_threads(1)
    policy = TextScorerPolicy(buckets=128, dim=4, hidden=8, seed=3)
    pool = EnvPool([lambda: gym.make("BPO-TreeMDP-v0", depth=3, n_actions=2, seed=4, n_tasks=7)] * 2)
    try:
        wins = evaluate_episodes(policy, pool, list(range(7)), 3, seed=11)
    finally:
        pool.close()
    if dp.rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump({"wins": wins, "world": dp.world_size()}, f)


if __name__ == "__main__":
    main()

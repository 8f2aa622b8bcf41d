"""Evaluating a policy: sampled episodes on the fixed evaluation tasks, on common random numbers.

The episodes run on the evaluation streams of :mod:`bpo_experiments.streams`; a run is evaluated
after the updates of its env's :attr:`~bpo_experiments.run_config.EnvConfig.eval_points`.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

import bpo_envs  # noqa: F401 - registers the ids
from bpo_algos import data_parallel as dp
from bpo_algos.policy.base import evaluation_sampling
from bpo_algos.rollout import EnvPool, RolloutEngine, Topology
from bpo_experiments.presets import EnvSetup
from bpo_experiments.streams import (
    EVALUATION,
    stream_seed,
)
from bpo_experiments.tasks import extra_eval_tasks


def evaluate(policy: Any, pool: EnvPool, tasks: list[Any], episodes: int, seed: int, split: int = 0) -> float:
    """See :func:`evaluate_episodes`: the mean success."""
    wins = evaluate_episodes(policy, pool, tasks, episodes, seed, split)
    return float(np.mean(wins)) if wins else 0.0


def evaluate_episodes(policy: Any, pool: EnvPool, tasks: list[Any], episodes: int, seed: int, split: int = 0) -> list[float]:
    """Mean success of ``episodes`` sampled rollouts per eval task, on common random numbers.

    Episode ``j`` of task ``i`` resets with the env seed of the stream ``(seed, EVALUATION, i,
    j)`` (``split`` > 0: a further evaluation split's own streams, ``(seed, EVALUATION, i, j,
    split)``) and runs the policy's sampler from it, for every algorithm and at every evaluation point
    (the policy's own RNG state is put back afterwards), so two policies' successes differ by the
    policies, not by their luck; another ``seed`` shares no episode. Returns each episode's
    success (0 or 1), task by task.

    All episodes advance together (one policy pass per engine step over every episode under
    way, as many at once as ``pool`` has envs); each draws from its own streams, so the
    result is the one-episode-at-a-time result. A policy that samples from a seed of its own
    (:attr:`~bpo_algos.policy.base.Policy.samples_from_rngs` False: vLLM) runs them one at a
    time, seeded with the episode's seed.
    """
    if not tasks:
        raise ValueError("no evaluation tasks")
    state = policy.rng_state()
    # under torchrun each rank plays every world-size-th task (an episode depends only on its
    # seeds, so which rank plays it changes nothing), then the ranks share them
    per_task: dict[int, list[float]] = {i: [] for i in dp.shard_indices(len(tasks))}
    episodes_of = [(i, j) for i in per_task for j in range(max(episodes, 1))]
    seeds = [stream_seed(seed, EVALUATION, i, j, split) for i, j in episodes_of]
    try:
        with evaluation_sampling(policy):  # the preset's evaluation temperature (0: greedy)
            if policy.samples_from_rngs:
                # every episode at once, one policy pass per step over all that are under way;
                # episode k is tree 0 of an engine seeded seeds[k], as if it ran alone
                result = RolloutEngine(pool, seed=0).run(policy, Topology(), [tasks[i] for i, _ in episodes_of], seeds=seeds)
                for tree in result.trees:
                    per_task[episodes_of[tree.index][0]] += [float(e.won) for e in tree.leaf_edges()]
            else:  # the policy samples from its own seed: one episode at a time, each seeded
                for (i, _), episode_seed in zip(episodes_of, seeds, strict=True):
                    policy.seed(episode_seed)
                    result = RolloutEngine(pool, max_parallel_trees=1, seed=episode_seed).run(policy, Topology(), [tasks[i]])
                    per_task[i] += [float(e.won) for t in result.trees for e in t.leaf_edges()]
    finally:
        policy.set_rng_state(state)
    if dp.is_distributed():
        for part in dp.all_gather_objects(per_task):
            per_task.update(part)
    missing = [tasks[i] for i in sorted(per_task) if not per_task[i]]
    if missing:
        raise ValueError(f"evaluation tasks {missing[:5]} gave no episode (not tasks of the evaluation env?)")
    return [w for i in range(len(tasks)) for w in per_task[i]]


def evaluate_extra(policy: Any, setup: EnvSetup, episodes: int, pool_size: int, seed: int) -> dict[str, Any]:
    """``policy`` on every further evaluation split (:attr:`EnvSetup.extra_eval`), split ``k``
    (from 1) on its own evaluation streams, ``episodes`` per task over ``pool_size`` envs:
    ``{split: {"success", "episodes", "wins"}}``."""
    out: dict[str, Any] = {}
    for k, (split, tasks) in enumerate(extra_eval_tasks(setup).items(), start=1):
        kwargs = {**setup.kwargs, **setup.eval_kwargs, "split": split}
        pool = EnvPool([lambda kwargs=kwargs: gym.make(setup.env_id, **kwargs)] * pool_size, workers=setup.workers)
        try:
            wins = evaluate_episodes(policy, pool, tasks, episodes, seed, split=k)
        finally:
            pool.close()
        out[split] = {"success": float(np.mean(wins)), "episodes": len(wins), "wins": wins}
    return out

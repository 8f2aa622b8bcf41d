"""Shared helpers for the exact-gradient tests: a fixed random tabular policy on a TreeMDP and
the exact gradient by enumeration (the estimators come from ``bpo_algos.diagnostics``)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

import bpo_envs  # noqa: F401 - registers the ids
from bpo_algos import EnvPool, TabularPolicy
from bpo_algos.diagnostics import GradientSamples, flat_gradient, gradient_samples


def tree_env(**kwargs) -> gym.Env:
    return gym.make("BPO-TreeMDP-v0", **kwargs)


def random_policy(env: gym.Env, scale: float = 1.0, seed: int = 0) -> TabularPolicy:
    """A tabular policy with N(0, scale^2) logits at every inner node of tree 0."""
    tree = env.unwrapped
    rng = np.random.default_rng(seed)
    policy = TabularPolicy(seed=seed)
    for depth in range(tree.depth):
        for prefix in np.ndindex(*([tree.n_actions] * depth)):
            policy.set_logits(tree.observation_of(0, tuple(prefix)), rng.normal(0.0, scale, tree.n_actions))
    return policy


def exact_gradient(env: gym.Env, policy: TabularPolicy) -> torch.Tensor:
    """Gradient of the expected return, by enumerating the tree."""
    policy.zero_grad()
    env.unwrapped.expected_return(policy.log_probs).backward()
    grad = flat_gradient(list(policy.parameters())).clone()
    policy.zero_grad()
    return grad


def tree_samples(algorithm, policy, tree_kwargs: dict, batches: int, sampler=None) -> GradientSamples:
    """``batches`` gradient estimates of ``algorithm`` at ``policy`` on task 0 of the TreeMDP
    ``tree_kwargs``, collected through a pool of two envs stepped in the calling thread.

    Why inline (``step_timeout_s=None``): a TreeMDP step is microseconds of Python, while the
    pools' default per-step deadline hands every step to a worker thread; on a loaded machine
    each handoff waits milliseconds for the scheduler, most of these tests' time. The samples are
    the same: which env a path gets depends only on the pool's size (``bpo_envs/pool.py``).
    """
    pool = EnvPool([lambda: tree_env(**tree_kwargs)] * 2, step_timeout_s=None)
    try:
        return gradient_samples(algorithm, policy, pool, [0], batches, sampler=sampler)
    finally:
        pool.close()

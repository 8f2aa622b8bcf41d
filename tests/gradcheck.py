"""Shared helpers for the exact-gradient tests: a fixed random tabular policy on a TreeMDP, the
exact gradient by enumeration, and z-scores of an estimator's mean against it."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch

import bpo_envs  # noqa: F401 - registers the ids
from bpo_algos import EnvPool, TabularPolicy
from bpo_algos.algorithm import Algorithm


def tree_env(**kwargs) -> gym.Env:
    return gym.make("BPO-TreeMDP-v0", **kwargs)


def random_policy(env: gym.Env, scale: float = 1.0, seed: int = 0) -> TabularPolicy:
    """A tabular policy with N(0, scale^2) logits at every inner node of tree 0."""
    tree = env.unwrapped
    rng = np.random.default_rng(seed)
    policy = TabularPolicy(seed=seed)
    for depth in range(tree.depth):
        for prefix in np.ndindex(*([tree.n_actions] * depth)):
            obs = tree.observation_of(0, tuple(prefix))
            policy.set_logits(obs, rng.normal(0.0, scale, tree.n_actions))
    return policy


def flat_grad(policy: TabularPolicy) -> torch.Tensor:
    return torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros_like(p).flatten() for p in policy.parameters()])


def exact_gradient(env: gym.Env, policy: TabularPolicy) -> torch.Tensor:
    """Gradient of the expected return, by enumerating the tree."""
    policy.zero_grad()
    value = env.unwrapped.expected_return(policy.log_probs)
    value.backward()
    grad = flat_grad(policy).clone()
    policy.zero_grad()
    return grad


def estimates(
    algorithm: Algorithm,
    policy: TabularPolicy,
    make_env: Callable[[], gym.Env],
    batches: int,
    trees_per_batch: int = 1,
    sampler: object | None = None,
) -> tuple[torch.Tensor, float]:
    """``batches`` policy-gradient estimates (minus the gradient of the step-sum loss) and the
    mean env steps per batch. ``sampler`` (default: ``policy``) is what collects."""
    n_params = sum(p.numel() for p in policy.parameters())
    pool = EnvPool([make_env, make_env])
    out = torch.empty(batches, n_params)
    steps = 0
    for i in range(batches):
        batch = algorithm.collect(sampler or policy, pool, [0] * trees_per_batch)
        policy.zero_grad()
        algorithm.loss(policy, batch).backward()
        out[i] = -flat_grad(policy)
        steps += batch.compute.env_steps
    policy.zero_grad()
    pool.close()
    if sum(p.numel() for p in policy.parameters()) != n_params:
        raise AssertionError("the policy grew during estimation: pre-populate every node")
    return out, steps / batches


def projection_z_scores(samples: torch.Tensor, truth: torch.Tensor, n_random: int = 3, seed: int = 0) -> list[float]:
    """z-scores of the sample mean against ``truth`` along the true gradient's direction and
    ``n_random`` random unit directions (coordinates alone are too skewed)."""
    gen = torch.Generator().manual_seed(seed)
    directions = [truth / truth.norm()]
    for _ in range(n_random):
        d = torch.randn(truth.shape[0], generator=gen, dtype=truth.dtype)
        directions.append(d / d.norm())
    zs = []
    for d in directions:
        x = (samples.double() @ d.double()).numpy()
        se = x.std(ddof=1) / np.sqrt(len(x))
        zs.append(float((x.mean() - float(truth.double() @ d.double())) / se))
    return zs

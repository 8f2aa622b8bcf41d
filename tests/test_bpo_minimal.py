"""examples/bpo_minimal.py computes what the library computes: for the same seeds it builds the
same trees as ``bpo_algos.BPO`` through the rollout engine, with the same advantages and weights
(docs/unbiasedness.md, rules 3 and 4) and the same gradient of the step-sum loss."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import bpo_envs  # noqa: F401 - registers the ids
from bpo_algos import BPO, TabularPolicy

ROOT = Path(__file__).resolve().parents[1]
ENV = {"depth": 4, "n_actions": 3, "seed": 1, "n_tasks": 3}


@functools.cache
def _minimal():
    spec = importlib.util.spec_from_file_location("bpo_minimal", ROOT / "examples" / "bpo_minimal.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _random_logits(env: gym.Env, seed: int) -> dict[str, np.ndarray]:
    tree = env.unwrapped
    rng = np.random.default_rng(seed)
    return {
        tree.observation_of(task, prefix): rng.normal(0.0, 1.0, tree.n_actions).astype(np.float32)
        for task in range(ENV["n_tasks"])
        for depth in range(tree.depth)
        for prefix in np.ndindex(*([tree.n_actions] * depth))
    }


def _steps_of_engine(batch) -> list[tuple]:
    return sorted((e.context.observation, e.action.token_ids[0], e.weight, round(e.advantage, 12)) for e in batch.steps)


def _steps_of_minimal(m, trees) -> list[tuple]:
    return sorted((e.obs, e.action, e.weight, round(e.advantage, 12)) for root in trees for e in m.edges(root))


@pytest.mark.parametrize("seed", [3, 11])
def test_minimal_bpo_equals_the_engine(seed):
    m = _minimal()
    args = m.Args(depth=ENV["depth"], n_actions=ENV["n_actions"], env_seed=ENV["seed"], n_tasks=ENV["n_tasks"],
                  backbones=3, branch_factor=3, entropy_threshold=0.9, max_branch_points=2)
    make = lambda: gym.make("BPO-TreeMDP-v0", **ENV)  # noqa: E731
    logits = _random_logits(make(), seed)
    tasks = list(range(ENV["n_tasks"]))

    # the engine
    policy = TabularPolicy.from_logits(logits)
    bpo = BPO(backbones=3, branch_factor=3, entropy_threshold=0.9, max_branch_points=2, aggregation="step-sum")
    batch = bpo.collect(policy, [make, make], tasks, seed=seed)
    bpo.loss(policy, batch).backward()

    # the one file
    table = {obs: torch.tensor(row, requires_grad=True) for obs, row in logits.items()}
    env = make()
    trees = [m.collect_tree(env, table, args, task, seed, i) for i, task in enumerate(tasks)]
    for root in trees:
        m.finalize(root)
        m.advantages(root)
    m.loss(trees, table).backward()

    engine_steps, minimal_steps = _steps_of_engine(batch), _steps_of_minimal(m, trees)
    assert len(engine_steps) > 3 * 3 * ENV["depth"]  # it branched below the root
    assert engine_steps == minimal_steps
    assert any(abs(s[3]) > 1e-6 for s in minimal_steps)
    for obs, row in table.items():
        expected = policy.logits(obs, ENV["n_actions"]).grad
        if row.grad is None:
            assert expected is None or not expected.any()
        else:
            torch.testing.assert_close(row.grad, expected, rtol=1e-5, atol=1e-7)


def test_a_changed_advantage_is_caught():
    """The broken case: the equivalence above fails when the minimal estimator drops its
    leave-one-out baseline (REINFORCE's advantage instead of rule 4's)."""
    m = _minimal()
    args = m.Args(depth=3, n_actions=3, env_seed=1, n_tasks=1, backbones=2, branch_factor=2, entropy_threshold=0.0)
    make = lambda: gym.make("BPO-TreeMDP-v0", depth=3, n_actions=3, seed=1, n_tasks=1)  # noqa: E731
    bpo = BPO(backbones=2, branch_factor=2, entropy_threshold=0.0, aggregation="step-sum")
    batch = bpo.collect(TabularPolicy(), [make], [0], seed=5)
    root = m.collect_tree(make(), {}, args, 0, 5, 0)
    m.finalize(root)
    m.advantages(root)
    assert _steps_of_engine(batch) == _steps_of_minimal(m, [root])
    for e in m.edges(root):
        e.advantage = e.q
    assert _steps_of_engine(batch) != _steps_of_minimal(m, [root])


def test_minimal_bpo_learns():
    m = _minimal()
    curve = m.main(m.Args(updates=6))
    assert curve[-1] > curve[0] + 0.05  # the exact expected return (0.49 -> 0.6 here)

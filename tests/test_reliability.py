"""Engine reliability: envs that raise mid-tree (step, snapshot, restore, reset) cost only
their path, which is retried by restore + replay or dropped with its compute recorded; the
batch completes, the weights stay consistent and the estimator stays unbiased when failures are
independent of the actions (and is caught being biased when they are not)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gradcheck import exact_gradient, random_policy, tree_env

import bpo_envs
from baselines import RLOO
from bpo_algos import BPO, EnvPool, TabularPolicy
from bpo_algos.diagnostics import flat_gradient, projection_z_scores
from bpo_algos.rollout import EnvFailureError

TREE = {"depth": 3, "n_actions": 3, "seed": 7}


class EnvCrash(RuntimeError):
    """What a crashed sandbox looks like to the engine."""


class Faults:
    """A seeded failure schedule shared by every env of a pool.

    ``rates[op]`` is the chance that ``op`` (step, snapshot, restore, reset) raises; ``at``
    forces failures at given call numbers of an op; ``when(action, env)`` decides step
    failures from the action (to make failures depend on it).
    """

    def __init__(self, seed=0, rates=None, at=None, when=None):
        self.rng = np.random.default_rng(seed)
        self.rates = rates or {}
        self.at = {op: set(v) for op, v in (at or {}).items()}
        self.when = when
        self.calls = {"step": 0, "snapshot": 0, "restore": 0, "reset": 0}
        self.raised = {"step": 0, "snapshot": 0, "restore": 0, "reset": 0}

    def check(self, op, action=None):
        n = self.calls[op]
        self.calls[op] += 1
        fail = n in self.at.get(op, ()) or self.rng.random() < self.rates.get(op, 0.0)
        if op == "step" and self.when is not None and self.when(action):
            fail = True
        if fail:
            self.raised[op] += 1
            raise EnvCrash(f"injected {op} failure #{self.raised[op]}")


class FlakyEnv(gym.Wrapper):
    """Raises per the shared ``Faults`` before delegating (the env below stays intact)."""

    def __init__(self, env, faults):
        super().__init__(env)
        self.faults = faults

    def reset(self, **kwargs):
        self.faults.check("reset")
        return self.env.reset(**kwargs)

    def step(self, action):
        self.faults.check("step", (self.env.unwrapped.elapsed_steps, action))
        return self.env.step(action)

    def snapshot(self):
        self.faults.check("snapshot")
        return bpo_envs.snapshot(self.env)

    def restore(self, snap):
        self.faults.check("restore")
        bpo_envs.restore(self.env, snap)


def flaky_pool(faults, n=2, retries=2, **tree):
    kwargs = {**TREE, **tree}
    return EnvPool([lambda: FlakyEnv(tree_env(**kwargs), faults)] * n, retries=retries)


def check_tree(tree, env, k0, k):
    """Every edge is the transition the env gives on that path; weights follow rule 3 over
    the children that are left; no node has more children than it sampled."""
    u = env.unwrapped
    for edge in tree.edges():
        path = [u.actions.index(e.action.command) for e in tree.path_to(edge)]
        assert edge.child.observation == u.observation_of(tree.task_id, path)
    for node in tree.nodes():
        if node.children:
            assert node.branch_factor == len(node.children)
        above = node.parent.weight if node.parent is not None else 1.0
        for edge in node.children:
            assert edge.weight == pytest.approx(above / len(node.children))
    assert sum(e.weight for e in tree.leaf_edges()) == pytest.approx(1.0)
    assert all(len(tree.path_to(e)) == u.depth for e in tree.leaf_edges())
    assert 2 <= len(tree.root.children) <= k0
    assert all(len(n.children) <= k for n in tree.nodes() if n is not tree.root)


def bpo():
    return BPO(backbones=2, branch_factor=3, entropy_threshold=0.0, max_branch_points=2, seed=1)


def test_failures_are_retried_and_the_trees_are_exact():
    faults = Faults(seed=1, rates={"step": 0.08, "snapshot": 0.1, "restore": 0.1})
    pool = flaky_pool(faults, n=3, retries=3)
    batch = bpo().collect(TabularPolicy(seed=2), pool, [0, 0, 0, 0])
    raised = sum(faults.raised.values())
    assert raised >= 5, faults.raised
    assert batch.compute.failures == raised
    assert batch.n_trees == 4
    env = tree_env(**TREE)
    for tree in batch.trees:
        check_tree(tree, env, 2, 3)
        # nothing dropped: every branch node kept all its samples
        assert len(tree.root.children) == 2
        assert all(len(n.children) == 3 for n in tree.branch_nodes() if n is not tree.root)
    assert batch.compute.dropped_steps == 0
    # replays after failures are real env steps, so the meter counts more than the tree has
    assert batch.compute.env_steps >= sum(len(t.edges()) for t in batch.trees)
    batch_loss = bpo().loss(TabularPolicy(seed=2), batch)
    assert torch.isfinite(batch_loss)


def test_without_retries_failed_lines_are_dropped_and_weights_renormalised():
    faults = Faults(seed=3, rates={"step": 0.1})
    pool = flaky_pool(faults, n=2, retries=0)
    algorithm = bpo()
    batch = algorithm.collect(TabularPolicy(seed=4), pool, [0] * 8)
    assert faults.raised["step"] >= 3
    assert batch.compute.failures == faults.raised["step"]
    assert batch.compute.dropped_steps > 0
    assert 1 <= batch.n_trees <= 8
    env = tree_env(**TREE)
    shrunk = 0
    for tree in batch.trees:
        check_tree(tree, env, 2, 3)
        for node in tree.branch_nodes():
            shrunk += node is not tree.root and len(node.children) == 2
            qs = [e.q for e in node.children]  # leave-one-out baselines over the survivors
            for i, e in enumerate(node.children):
                assert e.advantage == pytest.approx(qs[i] - (sum(qs) - qs[i]) / (len(qs) - 1))
    assert shrunk >= 1
    assert torch.isfinite(algorithm.loss(TabularPolicy(seed=4), batch))


def test_reset_failures_are_retried():
    faults = Faults(at={"reset": {0, 1, 3}})
    batch = RLOO(group_size=3).collect(TabularPolicy(), flaky_pool(faults, retries=2), [0, 0, 0])
    assert batch.n_trees == 3 and batch.compute.failures == 3


def test_a_task_whose_reset_always_fails_is_skipped():
    faults = Faults(rates={"reset": 1.0})
    pool = flaky_pool(faults, retries=1)
    pool.max_failures = 100
    result = RLOO(group_size=2).collect(TabularPolicy(), pool, [0, 0])
    assert result.n_trees == 0 and result.compute.failures == 4


def test_a_systematically_broken_env_stops_the_batch_with_its_error():
    faults = Faults(rates={"step": 1.0})
    pool = flaky_pool(faults, retries=2)
    pool.max_failures = 10
    with pytest.raises(EnvFailureError, match="injected step failure"):
        RLOO(group_size=2).collect(TabularPolicy(), pool, [0] * 20)


def test_local_pool_replaces_a_failed_env():
    made = []

    def factory():
        made.append(tree_env(**TREE))
        return made[-1]

    pool = EnvPool([factory])
    env = pool.acquire()
    pool.release(env, failed=True)
    assert pool.n_free == 1 and pool.acquire() is not env and len(made) == 2


def test_step_many_returns_errors_in_place():
    faults = Faults(at={"step": {1}})
    pool = flaky_pool(faults, n=3)
    envs = [pool.acquire() for _ in range(3)]
    for env in envs:
        env.reset(seed=0)
    out = pool.step_many(envs, ["a0", "a1", "a2"])
    assert isinstance(out[1], EnvCrash) and out[0][0] != out[2][0]


def _gradient_z_scores(algorithm, faults, batches, retries=0):
    env = tree_env(**TREE)
    policy = random_policy(env, seed=0)
    truth = exact_gradient(env, policy)
    # stepped in this thread (no per-step deadline): a TreeMDP step is microseconds, a handoff to
    # a worker thread is not; failures reach the engine the same way
    pool = EnvPool([lambda: FlakyEnv(tree_env(**TREE), faults)] * 2, retries=retries, step_timeout_s=None)
    rows, empty = [], 0
    params = list(policy.parameters())
    for _ in range(batches):
        batch = algorithm.collect(policy, pool, [0])
        if not batch.trees:  # dropped whole; the kept batches are still unbiased
            empty += 1
            continue
        for p in params:
            p.grad = None
        algorithm.loss(policy, batch).backward()
        rows.append(-flat_gradient(params))
    assert empty < batches // 4
    return projection_z_scores(torch.stack(rows), truth)


def _unbiased_bpo(seed):
    return BPO(backbones=3, branch_factor=3, entropy_threshold=0.0, aggregation="step-sum", seed=seed)


@pytest.mark.slow
def test_dropping_lines_that_fail_independently_of_the_action_keeps_bpo_unbiased():
    faults = Faults(seed=11, rates={"step": 0.04, "restore": 0.04, "snapshot": 0.04})
    zs = _gradient_z_scores(_unbiased_bpo(12), faults, 2000)
    assert faults.raised["step"] > 100
    assert max(abs(z) for z in zs) < 4.0, zs


@pytest.mark.slow
def test_dropping_lines_that_fail_because_of_the_action_is_biased():
    # 'a0' at depth 1 always crashes the sandbox: its outcomes go unseen, and the dropped paths
    # bias the gradient. (When it crashed half of the time the bias was about 3 standard errors
    # at 2000 batches, so whether it was seen depended on the draw; now it is 6-7 there, 3 draws.)
    faults = Faults(seed=13)
    faults.when = lambda step: step[0] == 1 and step[1] == "a0"
    zs = _gradient_z_scores(_unbiased_bpo(15), faults, 3000)
    assert max(abs(z) for z in zs) > 4.0, zs

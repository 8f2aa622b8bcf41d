"""The rollout engine: tree shapes, the compute meter, budgets, rules 1 and 2."""

from __future__ import annotations

import gymnasium as gym
import pytest

import bpo_envs  # noqa: F401
from baselines import GRPO, RLOO
from bpo_algos import BPO, Budget, ComputeMeter, EnvPool, Policy, TabularPolicy


def make(depth=3, n_actions=3):
    return lambda: gym.make("BPO-TreeMDP-v0", depth=depth, n_actions=n_actions, seed=1)


def test_grpo_tree_shape_and_meter():
    batch = GRPO(group_size=4).collect(TabularPolicy(), [make()], [0])
    tree = batch.trees[0]
    assert tree.root.branch_factor == 4 and len(tree.root.children) == 4
    assert all(not n.is_branch for n in tree.nodes() if n is not tree.root)
    c = batch.compute
    assert (c.env_steps, c.leaves, c.snapshots, c.restores, c.resets, c.gen_tokens) == (12, 4, 1, 3, 1, 12)
    # one env: the root call samples 4; then each path takes 2 more decisions, one call each;
    # each call's forward pass scores the context and its 3 candidates
    assert c.policy_calls == 1 + 4 * 2 and c.prefill_tokens == (1 + 4 * 2) * (1 + 3)
    assert c.train_tokens == 12 * (1 + 3)  # the learner scores each step's context and candidates
    assert tree.compute.env_steps == 12 and tree.compute.leaves == 4
    assert sum(e.weight for e in tree.leaf_edges()) == pytest.approx(1.0)


def test_bpo_tree_shape_and_meter():
    algorithm = BPO(backbones=2, branch_factor=3, entropy_threshold=0.0, max_branch_points=1)
    batch = algorithm.collect(TabularPolicy(), [make()], [0])
    tree = batch.trees[0]
    # each backbone branches at its first inner decision (depth 1) into 3
    branch_depths = sorted(n.depth for n in tree.branch_nodes())
    assert branch_depths == [0, 1, 1]
    c = batch.compute
    # backbones: 3 steps each; 2 fresh siblings per backbone: 2 steps each
    assert (c.env_steps, c.leaves, c.snapshots, c.restores) == (2 * 3 + 2 * 2 * 2, 2 * 3, 3, 1 + 2 * 2)
    assert c.gen_tokens == 2 + 2 * 3 + 2 * 3  # root 2, branch points 3 each, then 1 per remaining step
    assert sum(e.weight for e in tree.leaf_edges()) == pytest.approx(1.0)
    assert {round(e.weight, 6) for e in tree.leaf_edges()} == {round(1 / 6, 6)}


def test_budget_stops_collection_and_is_matched_across_algorithms():
    budget = Budget("leaves", 8)
    batch = GRPO(group_size=4).collect(TabularPolicy(), [make()], [0], budget)
    assert batch.n_trees == 2 and batch.compute.leaves == 8
    for algorithm in (GRPO(group_size=4), RLOO(group_size=4), BPO(entropy_threshold=0.0)):
        batch = algorithm.collect(TabularPolicy(), [make(), make()], [0], Budget("env_steps", 200))
        assert 0.85 * 200 <= batch.compute.env_steps <= 1.15 * 200, algorithm.name


def test_without_budget_one_tree_per_task():
    batch = RLOO(group_size=2).collect(TabularPolicy(), [make()], [0, 0, 0])
    assert batch.n_trees == 3


class RecordingPolicy(Policy):
    """Logs every policy call with the context objects it served (kept alive: ids stay unique)."""

    def __init__(self):
        self.inner = TabularPolicy(seed=3)
        self.meter = self.inner.meter
        self.log = []
        self.contexts = []

    def decision_entropy(self, contexts):
        self.contexts += contexts
        self.log += [("entropy", id(c)) for c in contexts]
        return self.inner.decision_entropy(contexts)

    def sample(self, contexts, n, rngs):
        self.contexts += contexts
        self.log += [("sample", id(c)) for c in contexts]
        return self.inner.sample(contexts, n, rngs)

    def token_logprobs(self, steps):
        return self.inner.token_logprobs(steps)


def test_rule1_entropy_before_any_sample_at_that_decision():
    policy = RecordingPolicy()
    BPO(backbones=2, branch_factor=2, entropy_threshold=0.0, max_branch_points=2).collect(policy, [make(4)], [0])
    entropy_at = {c: i for i, (kind, c) in enumerate(policy.log) if kind == "entropy"}
    sample_at = {}
    for i, (kind, c) in enumerate(policy.log):
        if kind == "sample":
            assert c not in sample_at, "a decision point was sampled twice"
            sample_at[c] = i
    assert entropy_at, "BPO asked for no entropy"
    for c, i in entropy_at.items():
        assert sample_at[c] > i


def test_rule2_siblings_are_not_deduplicated():
    policy = TabularPolicy()
    env = make(depth=2, n_actions=2)()
    for obs_path in [(), (0,), (1,)]:
        policy.set_logits(env.unwrapped.observation_of(0, obs_path), [8.0, -8.0])
    algorithm = BPO(backbones=3, branch_factor=3, entropy_threshold=0.0)
    tree = algorithm.collect(policy, [make(2, 2)], [0]).trees[0]
    assert [e.action.text for e in tree.root.children] == ["a0", "a0", "a0"]
    assert len({id(e.child) for e in tree.root.children}) == 3
    assert all(len(e.child.children) == 3 for e in tree.root.children)  # each forks again


def test_env_pool_reuses_envs_and_prefers_the_snapshot_origin():
    made = []

    def factory():
        env = make()()
        made.append(env)
        return env

    pool = EnvPool([factory, factory, factory])
    BPO(backbones=2, branch_factor=3, entropy_threshold=0.0).collect(TabularPolicy(), pool, [0, 0])
    BPO(backbones=2, branch_factor=3, entropy_threshold=0.0).collect(TabularPolicy(), pool, [0])
    assert len(made) == 3
    pool.close()


def test_meter_arithmetic():
    a = ComputeMeter(env_steps=3, leaves=1, seconds=0.5)
    b = ComputeMeter(env_steps=2, restores=4)
    assert (a + b).env_steps == 5 and (a + b).restores == 4 and (a - b).env_steps == 1
    with pytest.raises(ValueError, match="unit"):
        a.get("furlongs")


def test_siblings_wait_for_their_origin_env_when_the_env_prefers_it():
    from bpo_envs import TreeMDPEnv

    moved = []

    class PinnedTree(TreeMDPEnv):
        restore_prefers_origin = True

        def restore(self, snapshot):
            moved.append(snapshot.origin is not self)
            super().restore(snapshot)

    factory = lambda: PinnedTree(depth=4, n_actions=3, seed=1)  # noqa: E731
    batch = BPO(backbones=2, branch_factor=3, entropy_threshold=0.0).collect(TabularPolicy(), [factory] * 3, [0, 0, 0])
    assert batch.n_trees == 3 and moved and not any(moved)
    assert all(sum(e.weight for e in t.leaf_edges()) == pytest.approx(1.0) for t in batch.trees)


def _signature(tree):
    """Everything a tree holds that training reads, in the tree's own order."""
    return [
        (e.parent.depth, e.action.command, e.action.logprobs, e.reward, e.terminated, round(e.weight, 12), round(e.advantage, 12))
        for e in tree.edges()
    ], tree.seed, tree.index


@pytest.mark.parametrize("algorithm", [
    lambda: BPO(backbones=2, branch_factor=3, entropy_quantile=0.5, max_branch_points=2, max_depth=2, seed=3),
    lambda: RLOO(group_size=4, seed=3),
])
def test_a_tree_is_its_own_whatever_else_is_in_flight(algorithm):
    # one seeding rule: max_parallel_trees 1 vs 16, pools of 1 vs 16 envs, alone or in a batch
    tasks = list(range(6)) * 2
    policy = TabularPolicy(seed=0)
    def env():
        return gym.make("BPO-TreeMDP-v0", depth=5, n_actions=3, seed=1, n_tasks=6)

    def batch(parallel, envs, indices=None):
        algo = algorithm()
        algo.shared = type(algo.shared)(max_parallel_trees=parallel)
        return algo.collect(policy, EnvPool([env] * envs), tasks, seed=11, tree_indices=indices)

    one, many = batch(1, 1), batch(16, 16)
    assert len(one.trees) == len(many.trees) == 12
    assert [_signature(t) for t in one.trees] == [_signature(t) for t in many.trees]
    assert one.compute.env_steps == many.compute.env_steps and sorted(one.entropies) == sorted(many.entropies)
    assert len({t.seed for t in one.trees}) == 12  # tasks met twice are two trees of their own
    alone = batch(4, 4, indices=[7]).trees[0]  # tree 7 built alone, as another rank would
    assert _signature(alone) == _signature(one.trees[7])

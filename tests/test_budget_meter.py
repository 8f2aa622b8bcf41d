"""The compute meter (replayed steps, scoring tokens, policy tokens, time) and budgets that
hold however many trees are in flight."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import pytest

import bpo_envs
from baselines import GRPO, RLOO
from bpo_algos import BPO, COMPUTE_UNITS, Budget, ComputeMeter, EnvPool, TabularPolicy, Trainer
from bpo_algos.compute import should_start


def tree(depth=6, **kwargs):
    return lambda: gym.make("BPO-TreeMDP-v0", depth=depth, n_actions=3, seed=1, n_tasks=16, **kwargs)


ALGORITHMS = {
    "grpo": lambda p: GRPO(group_size=8, max_parallel_trees=p, seed=1),
    "rloo": lambda p: RLOO(group_size=8, max_parallel_trees=p, seed=1),
    "bpo": lambda p: BPO(backbones=2, branch_factor=4, max_parallel_trees=p, seed=1),
}


@pytest.mark.parametrize("parallel", [1, 4, 16])
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_budget_holds_whatever_the_trees_in_flight(name, parallel):
    """Five GRPO(8) trees of depth 6 = 240 env steps: every batch ends within 5% of the budget
    or within one tree's cost of it (the engine's schedule is seeded: no false alarms)."""
    amount = 240
    algorithm = ALGORITHMS[name](parallel)
    pool = EnvPool([tree()] * parallel)
    policy = TabularPolicy(seed=0)
    try:
        for _ in range(4):
            batch = algorithm.collect(policy, pool, list(range(16)), Budget("env_steps", amount))
            used = batch.compute.env_steps
            one_tree = max(t.compute.env_steps for t in batch.trees)
            assert abs(used - amount) <= max(0.05 * amount, one_tree), (name, parallel, used, one_tree)
            assert sum(t.compute.env_steps for t in batch.trees) == used
    finally:
        pool.close()


class _Clock:
    """A deterministic stand-in for ``time``: 10 ms pass per env step, nothing else takes time."""

    now = 0.0

    @classmethod
    def perf_counter(cls) -> float:
        return cls.now


class _TimedStep(gym.Wrapper):
    def step(self, action):
        _Clock.now += 0.01
        return self.env.step(action)


@pytest.mark.parametrize("parallel", [1, 8])
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_a_budget_in_seconds_holds(monkeypatch, name, parallel):
    """A 2.4 s budget at 10 ms a step (on a clock that only env steps advance, so the test
    cannot fail by the machine's load): the batch ends within 5% of it or within one tree."""
    import bpo_algos.rollout

    monkeypatch.setattr(bpo_algos.rollout, "time", _Clock)
    algorithm = ALGORITHMS[name](parallel)
    pool = EnvPool([lambda: _TimedStep(tree()())] * parallel)
    try:
        for _ in range(3):
            batch = algorithm.collect(TabularPolicy(seed=0), pool, list(range(16)), Budget("seconds", 2.4))
            used = batch.compute.seconds
            one_tree = max(t.compute.seconds for t in batch.trees)
            assert abs(used - 2.4) <= max(0.05 * 2.4, one_tree) + 1e-9, (name, parallel, used, one_tree)
            assert used == pytest.approx(0.01 * batch.compute.env_steps)
    finally:
        pool.close()


def test_start_rule_counts_open_trees_at_their_expected_cost():
    # ten trees of 24 fit a budget of 240 only if none is running yet
    assert should_start(240, 0, [], [24, 24])
    assert not should_start(240, 0, [0] * 10, [24, 24])
    # an open tree that has already cost more than any known tree is expected to end now
    assert should_start(240, 100, [90], [24, 24])
    # spread holds budget back: the same mean with a wide spread starts fewer trees
    narrow = sum(should_start(240, 0, [0] * n, [24, 24, 24, 24]) for n in range(12))
    wide = sum(should_start(240, 0, [0] * n, [4, 44, 4, 44]) for n in range(12))
    assert wide < narrow


def test_policy_tokens_budget_and_meter_fields():
    assert {"replay_steps", "score_tokens", "policy_tokens"} <= set(COMPUTE_UNITS)
    batch = BPO(backbones=2, branch_factor=3, entropy_threshold=0.0, seed=0).collect(
        TabularPolicy(), [tree(4)] * 2, [0], Budget("policy_tokens", 200)
    )
    c = batch.compute
    assert c.score_tokens > 0 and c.policy_tokens == c.gen_tokens + c.prefill_tokens + c.score_tokens
    # a choice policy scores the context and its 3 candidates: 4 tokens per decision entropy
    assert c.score_tokens == 4 * len(batch.entropies)
    assert abs(c.policy_tokens - 200) <= max(10, max(t.compute.policy_tokens for t in batch.trees))
    assert sum(t.compute.score_tokens for t in batch.trees) == c.score_tokens
    d = c.to_dict()
    assert d["policy_tokens"] == c.policy_tokens and ComputeMeter.from_dict(d) == c
    with pytest.raises(ValueError, match="unknown compute meter field"):
        ComputeMeter.from_dict({"furlongs": 1})
    # GRPO never scores
    g = GRPO(group_size=4).collect(TabularPolicy(), [tree(4)], [0]).compute
    assert g.score_tokens == 0 and g.policy_tokens == g.gen_tokens + g.prefill_tokens


def test_tree_seconds_add_up_to_about_the_batch():
    batch = BPO(backbones=2, branch_factor=3, entropy_threshold=0.0, max_parallel_trees=4).collect(
        TabularPolicy(), [tree(4)] * 4, [0, 1, 2, 3]
    )
    total = sum(t.compute.seconds for t in batch.trees)
    assert 0 < total <= batch.compute.seconds * 1.01


def test_replayed_steps_are_metered_as_env_steps():
    def make():
        return bpo_envs.ReplaySnapshot(bpo_envs.TreeMDPEnv(depth=4, n_actions=3, seed=1))

    envs = []

    def factory():
        envs.append(make())
        return envs[-1]

    algorithm = BPO(backbones=2, branch_factor=3, entropy_threshold=0.0, max_branch_points=2)
    batch = algorithm.collect(TabularPolicy(), [factory] * 2, [0])
    c = batch.compute
    replayed = sum(e.replayed_steps for e in envs)
    taken = sum(len(t.edges()) for t in batch.trees)
    assert replayed > 0 and c.replay_steps == replayed
    assert c.env_steps == taken + replayed  # every env.step the collection caused
    assert bpo_envs.replayed_steps(gym.wrappers.OrderEnforcing(envs[0])) == envs[0].replayed_steps


def test_trainer_logs_every_meter_field_and_the_tree_shape(tmp_path):
    trainer = Trainer(
        BPO(backbones=2, branch_factor=3, entropy_threshold=0.0), TabularPolicy(), [tree(4)], [0, 1], updates=1, tasks_per_update=2
    )
    row = trainer.step()
    assert set(row["compute"]) >= set(COMPUTE_UNITS)
    assert row["branch_points_per_tree"] == 2  # each backbone branches once (M = 1)
    assert row["leaves_per_tree"] == 2 * 3
    assert row["branch_depth_mean"] == 1.0
    assert row["steps_scored"] == row["compute"]["score_tokens"] // 4 > 0


def test_env_layer_does_not_import_the_algorithm_layer():
    code = "import sys, bpo_envs, bpo_envs.pool; assert not [m for m in sys.modules if m.startswith('bpo_algos')]"
    subprocess.run([sys.executable, "-c", code], check=True)
    import bpo_algos
    from bpo_algos import rollout as engine

    assert bpo_algos.EnvPool is engine.EnvPool is bpo_envs.pool.EnvPool
    assert engine.EnvFailureError is bpo_algos.recovery.EnvFailureError


def test_eligible_scoring_stops_scoring_a_path_after_its_branch_points():
    def run(scoring):
        algorithm = BPO(backbones=2, branch_factor=3, entropy_threshold=0.0, max_branch_points=1, scoring=scoring, seed=0)
        return algorithm.collect(TabularPolicy(), [tree(5)] * 2, [0])

    every, eligible = run("all"), run("eligible")
    # both branch at depth 1 on each backbone; "all" then scores the backbones' later steps too
    assert every.shape_stats()["branch_points_per_tree"] == eligible.shape_stats()["branch_points_per_tree"] == 2
    assert len(eligible.entropies) == 2 and len(every.entropies) == 2 * 4
    assert eligible.compute.score_tokens < every.compute.score_tokens
    with pytest.raises(ValueError, match="scoring"):
        BPO(scoring="some")

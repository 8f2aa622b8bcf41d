"""The mechanism measurements (bpo_algos.mechanism, docs/mechanism.md) against exact values.

eta of :func:`measure` on BPO batches of a TreeMDP is checked against
:func:`exact_prefix_explained` (enumeration) at the depths BPO branched at; the wrong depth
(a measurement that looked at the wrong nodes) is the broken case the check must catch. Seeded:
the interval check has a 5% error rate per draw, fixed by the seeds below.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import bpo_envs  # noqa: F401 - registers the ids
from baselines import RLOO
from bpo_algos import BPO, TabularPolicy
from bpo_algos.mechanism import Mechanism, exact_prefix_explained, measure, predict_variance_ratio
from bpo_algos.rollout import EnvPool

ENV = {"depth": 5, "n_actions": 3, "seed": 1, "decisive_levels": (1, 3), "routine_weight": 0.05}


def setup(seed: int = 0) -> tuple[object, TabularPolicy, EnvPool]:
    def make() -> gym.Env:
        return gym.make("BPO-TreeMDP-v0", **ENV)

    tree = make().unwrapped
    rng = np.random.default_rng(seed)
    policy = TabularPolicy(seed=seed)
    for depth in range(tree.depth):
        for prefix in np.ndindex(*([tree.n_actions] * depth)):
            policy.set_logits(tree.observation_of(0, tuple(prefix)), rng.normal(0.0, 1.0, tree.n_actions))
    return tree, policy, EnvPool([make, make])


def collect(algorithm, policy, pool, n: int) -> list:
    return [algorithm.collect(policy, pool, [0], None) for _ in range(n)]


@pytest.mark.parametrize("max_branch_points,depths", [(1, (1,)), (2, (1, 2))])
def test_eta_matches_exact_at_the_branch_depths(max_branch_points: int, depths: tuple[int, ...]) -> None:
    tree, policy, pool = setup()
    bpo = BPO(backbones=2, branch_factor=4, entropy_threshold=0.0, max_branch_points=max_branch_points, seed=0)
    m = measure(collect(bpo, policy, pool, 150), seed=0)
    assert set(m.branch_depths) == set(depths)
    exact = exact_prefix_explained(tree, policy, depths)
    lo, hi = m.prefix_explained_ci95
    assert lo <= exact <= hi, (m.prefix_explained, exact)
    assert abs(m.prefix_explained - exact) < 0.1
    # the broken case: eta at another depth is far from what was measured here
    wrong = exact_prefix_explained(tree, policy, (3,))
    assert abs(wrong - exact) > 0.2 and not lo <= wrong <= hi


def test_counts_and_costs_of_a_known_shape() -> None:
    tree, policy, pool = setup()
    bpo = BPO(backbones=2, branch_factor=4, entropy_threshold=0.0, max_branch_points=1, seed=0)
    m = measure(collect(bpo, policy, pool, 20))
    # every backbone (2 per tree) forks 4 siblings at depth 1: 2 * (5 + 3 * 4) steps, 8 leaves
    assert m.branch_nodes == 40 and m.branch_depths == {1: 40}
    assert m.fork_steps_per_leaf == pytest.approx(34 / 8)
    assert m.independent_steps_per_trajectory == pytest.approx(5.0)
    assert m.fork_cost_ratio == pytest.approx(34 / 40)
    assert m.branching_share == 1.0 and m.steps_per_backbone == pytest.approx(17.0)
    assert m.tasks_per_update == 1.0
    assert 1.0 <= m.distinct_siblings <= 3.0
    assert set(m.entropy_by_depth) == {1, 2, 3, 4}
    assert set(m.to_json()) >= {
        "prefix_explained", "prefix_explained_ci95", "branch_depths", "fork_steps_per_leaf",
        "zero_variance_groups", "tasks_per_update",
    }


def test_independent_batches_have_no_eta_and_count_zero_variance_groups() -> None:
    tree, policy, pool = setup()
    m = measure(collect(RLOO(group_size=4), policy, pool, 30))
    assert m.prefix_explained is None and m.branch_nodes == 0
    assert m.fork_steps_per_leaf == pytest.approx(5.0) and m.fork_cost_ratio == pytest.approx(1.0)
    assert m.zero_variance_groups == 0.0  # continuous rewards: four equal returns never happen
    assert m.branching_share == 0.0 and m.steps_per_backbone == pytest.approx(5.0)


def test_prediction_follows_its_formula() -> None:
    m = Mechanism(0.5, (0.4, 0.6), 10, {2: 10}, 6.0, 8.0, 0.0, 2.0, 4.0, {d: 1.0 for d in range(8)})
    # f_pre = 2/8, f_post = 6/8, c = 0.75; K0 = 2, K = 4, N = 4
    expected = 0.75 * ((1 + 3 * 0.5) * 2 * 0.25 + 0.5 * 4 / 3 * 0.75) / (4 / 3)
    assert predict_variance_ratio(m, backbones=2, branch_factor=4, group_size=4) == pytest.approx(expected)
    # a shared prefix carries K correlated leaves: more eta costs variance before the branch
    # point and saves it after; with all the score mass after it, more eta only helps
    late = [Mechanism(eta, None, 10, {2: 10}, 6.0, 8.0, 0.0, 2.0, 4.0, {0: 0.0, 1: 0.0, 2: 1.0}) for eta in (0.2, 0.8)]
    ratios = [predict_variance_ratio(x, backbones=2, branch_factor=4, group_size=4, horizon=3) for x in late]
    assert ratios[1] < ratios[0]
    assert ratios[0] == pytest.approx(0.75 * 0.8 * 4 / 3 / (4 / 3))
    # backbones that never branch are RLOO-K0 trajectories: RLOO-2 against RLOO-4 is 2 / (4/3)
    never = Mechanism(None, None, 0, {}, 8.0, 8.0, 0.0, None, 4.0, {}, branching_share=0.0, steps_per_backbone=8.0)
    assert predict_variance_ratio(never, backbones=2, branch_factor=4, group_size=4) == pytest.approx(1.5)

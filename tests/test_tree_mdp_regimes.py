"""TreeMDP's regime options: binary reward, slip, deep state-observed trees, the agent prior.

Every option keeps the snapshot contract (``check_snapshot``) and an exact ``expected_return``:
checked against brute-force enumeration where the tree is small, and against the Monte Carlo
mean of real episodes (seeded; a 4.5-standard-error band, a false-alarm rate below 1e-5 per
check) where it is not. The broken control: the slip-free value of the same tree, which the
Monte Carlo mean of the slipping tree must reject.
"""

from __future__ import annotations

import itertools

import gymnasium as gym
import numpy as np
import pytest
import torch

import bpo_envs
from bpo_algos import TabularPolicy
from bpo_envs import TreeMDPEnv, check_snapshot


def prior_policy(env: TreeMDPEnv, **kwargs) -> TabularPolicy:
    return TabularPolicy.from_logits(env.agent_prior(**kwargs))


def random_policy(env: TreeMDPEnv, seed: int = 0) -> TabularPolicy:
    """N(0, 1) logits on every node (any observe mode)."""
    rng = np.random.default_rng(seed)
    policy = TabularPolicy()
    for level in range(env.depth):
        for path in itertools.product(range(env.n_actions), repeat=level):
            obs = env.observation_of(0, path)
            policy.set_logits(obs, rng.normal(0.0, 1.0, env.n_actions))
    return policy


def monte_carlo(env: TreeMDPEnv, policy: TabularPolicy, episodes: int, seed: int) -> tuple[float, float, float]:
    """Mean return, its standard error, and the share of slipped steps over real episodes."""
    rng = np.random.default_rng(seed)
    returns, slips, steps = [], 0, 0
    for _ in range(episodes):
        obs, info = env.reset(seed=int(rng.integers(2**31)), options={"task_id": 0})
        total, done = 0.0, False
        while not done:
            with torch.no_grad():
                p = policy.log_probs(obs, env.actions).exp().double().numpy()
            obs, reward, terminated, truncated, info = env.step(env.actions[rng.choice(env.n_actions, p=p / p.sum())])
            total += reward
            slips += bool(info.get("slipped"))
            steps += 1
            done = terminated or truncated
        returns.append(total)
    r = np.asarray(returns)
    return float(r.mean()), float(r.std(ddof=1) / np.sqrt(len(r))), slips / steps


def brute_force(env: TreeMDPEnv, policy: TabularPolicy, task: int = 0) -> tuple[float, float]:
    """E[R] and Var(R) by enumerating every (chosen -> executed) leaf path."""
    m1 = m2 = 0.0
    for path in itertools.product(range(env.n_actions), repeat=env.depth):
        prob = 1.0
        for level in range(env.depth):
            with torch.no_grad():
                p = policy.log_probs(env.observation_of(task, path[:level]), env.actions).exp().double().numpy()
            prob *= float(env.transition_probs(p)[path[level]])
        r = env.reward_of(task, path)
        m1 += prob * r
        m2 += prob * r * r
    return m1, m2 - m1 * m1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"depth": 5, "reward": "binary", "success_rate": 0.2, "slip": 0.3},
        {"depth": 6, "decisive_levels": (1, 4), "reward": "binary", "success_rate": 0.25, "slip": 0.2},
        {"depth": 6, "decisive_levels": (0, 3), "observe": "state", "slip": 0.25},
        {"depth": 32, "decisive_levels": (7, 20, 31), "observe": "state", "reward": "binary", "success_rate": 0.1, "slip": 0.1},
    ],
)
def test_snapshot_contract(kwargs):
    check_snapshot(gym.make("BPO-TreeMDP-v0", n_actions=3, seed=2, **kwargs), seed=0, steps=2 * kwargs["depth"])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"depth": 4, "reward": "binary", "success_rate": 0.3, "slip": 0.3},
        {"depth": 5, "decisive_levels": (1, 3), "reward": "binary", "success_rate": 0.3, "slip": 0.2},
        {"depth": 5, "decisive_levels": (2,), "observe": "state", "slip": 0.4},
        {"depth": 5, "decisive_levels": (0, 4), "observe": "state", "reward": "binary", "success_rate": 0.5, "slip": 0.1},
    ],
)
def test_expected_return_and_variance_match_enumeration(kwargs):
    env = TreeMDPEnv(n_actions=3, seed=3, **kwargs)
    policy = random_policy(env)
    mean, var = brute_force(env, policy)
    with torch.no_grad():
        assert float(env.expected_return(policy.log_probs)) == pytest.approx(mean, abs=1e-6)  # float32 policy
    v = env.variance_by_depth(policy.log_probs)
    assert v[0] == pytest.approx(var, abs=1e-6)
    assert len(v) == env.depth + 1 and all(a >= b - 1e-12 for a, b in zip(v, v[1:], strict=False))
    assert v[-1] == pytest.approx(0.0, abs=1e-12)  # the leaf settles everything


@pytest.mark.parametrize(
    "kwargs, prior, control",
    [
        ({"depth": 8, "decisive_levels": (2, 6), "reward": "binary", "success_rate": 0.2, "slip": 0.2}, {"decisive_confidence": 3.0}, True),
        ({"depth": 32, "decisive_levels": (3, 29), "reward": "binary", "success_rate": 0.3, "slip": 0.3},
         {"early_confidence": 0.0, "decisive_confidence": 3.0}, True),
        # dense: slip moves the value by less than the band here, so no control
        ({"depth": 24, "decisive_levels": (10,), "slip": 0.3}, {"decisive_confidence": 2.0}, False),
    ],
)
def test_monte_carlo_mean_return_matches_expected_return_with_slip(kwargs, prior, control):
    env = TreeMDPEnv(n_actions=3, seed=5, observe="state", **kwargs)
    policy = prior_policy(env, **prior)
    with torch.no_grad():
        exact = float(env.expected_return(policy.log_probs))
        slip_free = float(TreeMDPEnv(n_actions=3, seed=5, observe="state", **{**kwargs, "slip": 0.0}).expected_return(policy.log_probs))
    mean, se, slipped = monte_carlo(env, policy, 1200, seed=11)
    assert abs(mean - exact) < 4.5 * se, (mean, exact, se)
    # the broken control: the same tree's value without slip is far outside the band (the
    # prior commits at decisive levels; slip spreads those decisions)
    assert not control or abs(mean - slip_free) > 4.5 * se, (mean, slip_free, se)
    # slip executes a uniform action: the executed one differs from the chosen with p (A-1)/A
    assert slipped == pytest.approx(kwargs["slip"] * 2 / 3, abs=0.02)


def test_binary_success_rate_sets_the_share_of_winning_decisions():
    for rate, n_decisive in ((0.1, 3), (0.25, 2), (0.5, 2)):
        env = TreeMDPEnv(depth=8, n_actions=3, seed=1, decisive_levels=tuple(range(1, 1 + n_decisive)), observe="state",
                         reward="binary", success_rate=rate, n_tasks=4)
        uniform = TabularPolicy()  # zero logits everywhere: uniform decisions
        for task in range(4):
            with torch.no_grad():
                value = float(env.expected_return(uniform.log_probs, task))
            assert value == pytest.approx(max(1, round(rate * 3**n_decisive)) / 3**n_decisive)
    random_tree = TreeMDPEnv(depth=6, n_actions=3, seed=1, reward="binary", success_rate=0.2)
    share = np.mean([random_tree.reward_of(0, p) for p in random_tree.leaves()])
    assert share == pytest.approx(0.2, abs=0.03)  # 729 independent uniform draws


def test_won_and_expert_under_binary_reward():
    env = TreeMDPEnv(depth=10, n_actions=3, seed=4, decisive_levels=(2, 7), observe="state", reward="binary", success_rate=0.2)
    env.reset(seed=0)
    total, info = 0.0, {}
    for action in env.expert_actions():
        _, reward, terminated, _, info = env.step(action)
        total += reward
    assert total == 1.0 and info["won"] and terminated
    env.reset(seed=0)
    rewards = set()
    for path in itertools.product(range(3), repeat=2):
        rewards.add(env.reward_of(0, tuple(path[0] if d == 2 else path[1] if d == 7 else 0 for d in range(10))))
    assert rewards == {0.0, 1.0}


def test_slip_outcome_lives_in_the_snapshot_and_siblings_draw_independently():
    env = TreeMDPEnv(depth=20, n_actions=3, seed=0, decisive_levels=(5,), observe="state", slip=0.5)
    env.reset(seed=3)
    snap = env.snapshot()
    runs = []
    for _ in range(2):
        env.restore(snap)
        runs.append([env.step("a0")[4].get("slipped", False) for _ in range(20)])
    assert runs[0] == runs[1] and 3 <= sum(runs[0]) <= 17  # replayed exactly; slips happen
    # siblings choosing different actions at one snapshot get their own draws
    outcomes = []
    for action in ("a0", "a1", "a2"):
        env.restore(snap)
        outcomes.append(tuple(env.step(action)[4].get("slipped", False) for _ in range(20)))
    assert len(set(outcomes)) > 1


def test_deep_state_tree_is_exact_and_fast():
    env = TreeMDPEnv(depth=32, n_actions=3, seed=0, decisive_levels=(4, 16, 28), observe="state", slip=0.1)
    policy = prior_policy(env)
    for p in policy.parameters():
        p.requires_grad_(True)
    value = env.expected_return(policy.log_probs)
    value.backward()
    assert 0.0 < float(value.detach()) < 1.0 and any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.parameters())
    v = env.variance_by_depth(policy.log_probs)
    # the decisive levels settle most of the return variance
    settled = -np.diff(v)
    assert set(np.argsort(settled)[-3:]) == {4, 16, 28}


def test_bad_regime_arguments():
    for kwargs, name in (({"reward": "sparse"}, "reward"), ({"slip": 1.5}, "slip"),
                         ({"success_rate": 0.3}, "success_rate")):
        with pytest.raises(ValueError, match=name):
            TreeMDPEnv(**{"depth": 4, **kwargs})
    # a deep path tree plays (and draws) but is not solved exactly: a clear error, not a hang
    deep = TreeMDPEnv(depth=20)
    deep.reset(seed=0)
    deep.step(deep.actions[0])
    with pytest.raises(ValueError, match="observe='state'"):
        deep.expected_return(lambda obs, actions: np.full(len(actions), -np.log(len(actions))))
    assert bpo_envs.TreeMDPEnv is TreeMDPEnv

"""Exact-gradient checks: on TreeMDP with a fixed TabularPolicy, the mean of RLOO's and BPO's
``step-sum`` estimates matches the gradient of the expected return computed by enumeration.

Each check is a z-test of the sample mean along the true gradient and 3 random directions
(2,000 seeded batches; |z| < 4 per direction, so a correct estimator fails one check with
probability about 4 x 6.3e-5 = 2.5e-4). A deliberately broken BPO that violates rule 1 is run
through the same test and must be caught, so the test is known to be able to fail.
"""

from __future__ import annotations

import pytest
import torch
from gradcheck import exact_gradient, random_policy, tree_env, tree_samples

from baselines import RLOO
from bpo_algos import BPO
from bpo_algos.diagnostics import projection_z_scores
from bpo_algos.policy.base import Policy

BATCHES = 2000
Z_MAX = 4.0

RANDOM_TREE = {"depth": 3, "n_actions": 3, "seed": 7}
AGENT_TREE = {"depth": 4, "n_actions": 2, "seed": 3, "decisive_levels": (2,)}


class PeekingPolicy(Policy):
    """Breaks rule 1: reports a high entropy exactly where the backbone's action (sampled in
    advance) is not the policy's most likely one, so branching depends on that action."""

    def __init__(self, inner):
        self.inner = inner
        self.meter = inner.meter
        self._stash = {}

    def decision_entropy(self, contexts):
        out = []
        for context in contexts:
            action = self.inner.sample([context], 1, None)[0][0]
            self._stash[id(context)] = action
            logp = self.inner.log_probs(context.observation, context.admissible_actions).detach()
            out.append(0.0 if action.token_ids[0] == int(logp.argmax()) else 10.0)
        return out

    def sample(self, contexts, n, rngs):  # the inner policy's own generator: the stash needs it
        out = []
        for context in contexts:
            first = self._stash.pop(id(context), None)
            if first is None:
                out.append(self.inner.sample([context], n, None)[0])
            else:
                out.append([first, *(self.inner.sample([context], n - 1, None)[0] if n > 1 else [])])
        return out

    def token_logprobs(self, steps):
        return self.inner.token_logprobs(steps)


def _z_scores(algorithm, tree_kwargs, sampler_wrapper=None, policy_seed=0):
    env = tree_env(**tree_kwargs)
    policy = random_policy(env, scale=1.0, seed=policy_seed)
    truth = exact_gradient(env, policy)
    sampler = sampler_wrapper(policy) if sampler_wrapper else None
    samples = tree_samples(algorithm, policy, tree_kwargs, BATCHES, sampler=sampler)
    return projection_z_scores(samples.grads, truth)


CONFIGS = {
    "rloo-4": lambda: RLOO(group_size=4, aggregation="step-sum", seed=1),
    "bpo-K0=2-K=2": lambda: BPO(backbones=2, branch_factor=2, entropy_threshold=0.0, aggregation="step-sum", seed=2),
    "bpo-K0=4-K=3-M=2": lambda: BPO(backbones=4, branch_factor=3, entropy_threshold=0.0, max_branch_points=2, aggregation="step-sum", seed=3),
    "bpo-nested-depth2": lambda: BPO(backbones=2, branch_factor=2, entropy_threshold=0.0, max_branch_points=2, max_depth=2, aggregation="step-sum", seed=4),
    "bpo-adaptive-quantile": lambda: BPO(backbones=2, branch_factor=3, entropy_threshold=None, entropy_quantile=0.5, aggregation="step-sum", seed=5),
    "bpo-adaptive-eligible-scoring": lambda: BPO(
        backbones=2, branch_factor=3, entropy_threshold=None, entropy_quantile=0.5, scoring="eligible", aggregation="step-sum", seed=11
    ),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_estimator_is_unbiased_on_random_tree(name):
    zs = _z_scores(CONFIGS[name](), RANDOM_TREE)
    assert max(abs(z) for z in zs) < Z_MAX, f"{name}: z-scores {zs}"


def test_bpo_is_unbiased_on_agent_like_tree():
    algorithm = BPO(backbones=2, branch_factor=4, entropy_threshold=0.3, aggregation="step-sum", seed=6)
    zs = _z_scores(algorithm, AGENT_TREE, policy_seed=1)
    assert max(abs(z) for z in zs) < Z_MAX, f"z-scores {zs}"


def test_bpo_is_unbiased_when_paths_share_states():
    """``observe="state"``: many paths reach the same observation, so a tabular entry collects
    terms from several places of one tree (as an LLM's shared parameters do)."""
    algorithm = BPO(backbones=2, branch_factor=3, entropy_threshold=None, entropy_quantile=0.6, max_branch_points=2, aggregation="step-sum", seed=9)
    zs = _z_scores(algorithm, {**AGENT_TREE, "observe": "state"}, policy_seed=2)
    assert max(abs(z) for z in zs) < Z_MAX, f"z-scores {zs}"


def test_rule1_violation_is_detected():
    algorithm = BPO(backbones=2, branch_factor=2, entropy_threshold=1.0, aggregation="step-sum", seed=7)
    zs = _z_scores(algorithm, RANDOM_TREE, sampler_wrapper=PeekingPolicy)
    assert max(abs(z) for z in zs) > Z_MAX, f"the broken variant went undetected: z-scores {zs}"


def test_grpo_std_scaling_is_not_the_exact_gradient_but_dr_grpo_is_proportional():
    """GRPO's std division biases it (as published); Dr. GRPO's ``R - mean`` has expectation
    ``(1 - 1/N)`` times the gradient (the mean includes the sample itself)."""
    from baselines import GRPO

    env = tree_env(**RANDOM_TREE)
    policy = random_policy(env, seed=0)
    truth = exact_gradient(env, policy)
    n = 4
    algorithm = GRPO(group_size=n, scale="none", aggregation="step-sum", seed=8)
    samples = tree_samples(algorithm, policy, RANDOM_TREE, BATCHES).grads
    zs = projection_z_scores(samples, truth * (1 - 1 / n))
    assert max(abs(z) for z in zs) < Z_MAX, zs
    assert torch.isfinite(samples).all()


def test_bpo_with_ties_at_the_adaptive_threshold_is_unbiased_and_branches():
    """A uniform policy: every decision entropy equals the adaptive threshold. Ties branch with
    independent randomness (probability 1 - q), so BPO keeps branching (a strict ``>`` would
    never branch after the first batch) and stays unbiased."""
    env = tree_env(**RANDOM_TREE)
    policy = random_policy(env, scale=0.0)
    truth = exact_gradient(env, policy)
    algorithm = BPO(backbones=2, branch_factor=3, entropy_threshold=None, entropy_quantile=0.5, aggregation="step-sum", seed=10)
    samples = tree_samples(algorithm, policy, RANDOM_TREE, BATCHES)
    zs = projection_z_scores(samples.grads, truth)
    assert max(abs(z) for z in zs) < Z_MAX, f"z-scores {zs}"
    assert algorithm.tie_probability == pytest.approx(0.5)
    make = lambda: tree_env(**RANDOM_TREE)  # noqa: E731
    shapes = [algorithm.collect(policy, [make], [0]).shape_stats()["branch_points_per_tree"] for _ in range(50)]
    assert 0 < sum(shapes) / len(shapes) < 2  # some backbones branch, not all

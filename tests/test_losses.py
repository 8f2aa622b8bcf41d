"""The shared loss: step-sum is minus the policy-gradient estimate; clipping; k3 KL."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

import bpo_envs  # noqa: F401
from baselines import RLOO
from bpo_algos import BPO, TabularPolicy
from bpo_algos.losses import aggregate, k3_kl, policy_loss


def test_step_sum_backward_is_minus_the_weighted_score_sum():
    policy = TabularPolicy(seed=0)
    make = lambda: gym.make("BPO-TreeMDP-v0", depth=3, n_actions=3, seed=2)  # noqa: E731
    algorithm = BPO(backbones=2, branch_factor=3, entropy_threshold=0.0, aggregation="step-sum")
    batch = algorithm.collect(policy, [make], [0, 0, 0])
    algorithm.loss(policy, batch).backward()
    got = {n: p.grad.clone() for n, p in policy.named_parameters()}
    policy.zero_grad()
    manual = sum(
        e.weight * e.advantage * policy.log_probs(e.context.observation, e.context.admissible_actions)[e.action.token_ids[0]]
        for e in batch.steps
    ) / batch.n_trees
    (-manual).backward()
    for name, p in policy.named_parameters():
        torch.testing.assert_close(got[name], p.grad)


def test_token_mean_and_seq_mean_weighting():
    per_token = torch.tensor([[1.0, 3.0], [2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    w = torch.tensor([0.5, 1.0])
    assert aggregate(per_token, mask, w, "token-mean", 1) == pytest.approx((0.5 + 1.5 + 2.0) / 2.0)
    assert aggregate(per_token, mask, w, "seq-mean-token-mean", 1) == pytest.approx((0.5 * 2 + 1.0 * 2) / 1.5)
    assert aggregate(per_token, mask, w, "step-sum", 2) == pytest.approx((0.5 * 4 + 2.0) / 2)
    with pytest.raises(ValueError, match="aggregation"):
        aggregate(per_token, mask, w, "mean", 1)


def test_clipping_stops_the_gradient_outside_the_trust_region():
    old = torch.zeros(1, 1)
    logp = torch.full((1, 1), 0.5, requires_grad=True)  # ratio e^0.5 > 1.2
    loss, stats = policy_loss(logp, old, torch.tensor([1.0]), torch.ones(1), torch.ones(1, 1), n_trees=1)
    loss.backward()
    assert logp.grad.abs().sum() == 0 and stats["clip_frac"] == 1.0
    logp2 = torch.full((1, 1), 0.5, requires_grad=True)
    loss, _ = policy_loss(logp2, old, torch.tensor([-1.0]), torch.ones(1), torch.ones(1, 1), n_trees=1)
    loss.backward()  # negative advantage, ratio above the range: the unclipped term is the min
    assert logp2.grad.abs().sum() > 0


def test_k3_kl_is_clamped_as_verls_low_var_kl():
    logp = torch.tensor([-1.0, -1.0, -1.0, -30.0], requires_grad=True)
    ref = torch.tensor([-1.0, 1.0, -13.0, -1.0])  # r = ref - logp: 0, 2 (k3 4.39), -12 (k3 11), 29 (clipped to 20)
    kl = k3_kl(logp, ref)
    assert torch.allclose(kl.detach(), torch.tensor([0.0, float(torch.exp(torch.tensor(2.0))) - 3.0, 10.0, 10.0]))
    kl.sum().backward()
    assert logp.grad[1] != 0 and logp.grad[2] == 0 and logp.grad[3] == 0  # no gradient where clamped


def test_k3_kl_is_zero_at_equality_and_positive_otherwise():
    a = torch.tensor([-1.0, -2.0, -0.3])
    assert torch.allclose(k3_kl(a, a), torch.zeros(3))
    assert (k3_kl(a, a + 0.4) > 0).all() and (k3_kl(a, a - 0.4) > 0).all()


def test_kl_to_reference_enters_the_loss():
    policy = TabularPolicy(seed=0)
    make = lambda: gym.make("BPO-TreeMDP-v0", depth=2, n_actions=2, seed=2)  # noqa: E731
    algorithm = RLOO(group_size=2, kl_coef=0.5)
    batch = algorithm.collect(policy, [make], [0])
    policy.set_reference()
    for p in policy.parameters():
        with torch.no_grad():
            p.add_(torch.randn_like(p))
    algorithm.loss(policy, batch)
    assert algorithm.last_loss_stats["kl_ref"] > 0

"""The paper-scale path on a CPU: device-correct loss, micro-batched backward, precision."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

import bpo_envs  # noqa: F401
from baselines import GRPO
from bpo_algos import BPO, Trainer, TrainerConfig
from bpo_algos.losses import AGGREGATIONS
from bpo_algos.policy.scorer import TextScorerPolicy


def make():
    return gym.make("BPO-TreeMDP-v0", depth=3, n_actions=3, seed=2, n_tasks=4)


class MetaScorer(TextScorerPolicy):
    """Log-probs on the ``meta`` device: a stand-in for a policy on another device than the
    CPU-built batch tensors (meta tensors refuse to meet CPU tensors, like CUDA ones)."""

    def token_logprobs(self, steps):
        return super().token_logprobs(steps).detach().to("meta").requires_grad_()

    def reference_token_logprobs(self, steps):
        return super().reference_token_logprobs(steps)  # on the CPU, like a frozen copy elsewhere


def _batch(policy, algorithm):
    return algorithm.collect(policy, [make], [0, 1, 2])


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_loss_follows_the_policy_device(kl_coef):
    policy = MetaScorer(buckets=256, dim=4, hidden=8, seed=0)
    policy.set_reference()
    algorithm = BPO(backbones=2, branch_factor=2, entropy_threshold=0.0, kl_coef=kl_coef)
    batch = _batch(policy, algorithm)
    loss = algorithm.loss(policy, batch)
    assert loss.device.type == "meta"
    algorithm.backward(policy, batch, micro_batch_tokens=4)


def _grads(policy):
    return [p.grad.clone() for p in policy.parameters() if p.requires_grad]


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("kl_coef", [0.0, 0.2])
def test_micro_batches_give_the_one_batch_gradient(aggregation, kl_coef):
    policy = TextScorerPolicy(buckets=256, dim=4, hidden=8, seed=1)
    policy.set_reference()
    algorithm = BPO(backbones=3, branch_factor=2, entropy_threshold=0.0, aggregation=aggregation, kl_coef=kl_coef, clip_eps=0.05)
    batch = _batch(policy, algorithm)
    with torch.no_grad():  # move off the sampling policy: ratios != 1, some clipped
        for p in policy.parameters():
            p.add_(0.3 * torch.randn_like(p))
    loss = algorithm.loss(policy, batch)
    loss.backward()
    whole, stats = _grads(policy), dict(algorithm.last_loss_stats)
    assert stats["clip_frac"] > 0
    groups = batch.micro_batches(6)
    assert len(groups) > 3 and sorted(i for g in groups for i in g) == list(range(len(batch.steps)))
    policy.zero_grad()
    value = algorithm.backward(policy, batch, micro_batch_tokens=6)
    assert value == pytest.approx(float(loss.detach()), rel=1e-5, abs=1e-7)
    for a, b in zip(whole, _grads(policy), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert algorithm.last_loss_stats["clip_frac"] == pytest.approx(stats["clip_frac"])


def test_trainer_micro_batched_equals_one_backward():
    def run(**kw):
        policy = TextScorerPolicy(buckets=256, dim=4, hidden=8, seed=2)
        cfg = TrainerConfig(updates=2, tasks_per_update=3, learning_rate=0.3, optimizer="sgd", seed=5, **kw)
        Trainer(GRPO(group_size=3), policy, [make], [0, 1, 2, 3], cfg).train()
        return [p.detach() for p in policy.parameters()]

    for a, b in zip(run(), run(micro_batch_tokens=5), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_trainer_config_rejects_bad_scale_options():
    with pytest.raises(ValueError, match="device"):
        TrainerConfig(device="tpu")
    with pytest.raises(ValueError, match="precision"):
        TrainerConfig(precision="fp8")
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        TrainerConfig(micro_batch_tokens=0)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            Trainer(GRPO(group_size=2), TextScorerPolicy(buckets=64, dim=2, hidden=2), [make], [0], device="cuda")

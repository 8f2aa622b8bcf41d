"""SFT warm start from expert_actions() and end-to-end BPO / GRPO with HFPolicy on TreeMDP."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

pytest.importorskip("transformers")

import bpo_envs  # noqa: E402,F401
from baselines import GRPO  # noqa: E402
from bpo_algos import BPO  # noqa: E402
from bpo_algos.policy import HFPolicy  # noqa: E402
from bpo_algos.policy.sft import behaviour_cloning, demo_steps, expert_demos  # noqa: E402
from bpo_algos.policy.tiny import tiny_model_path  # noqa: E402

ENV_KWARGS = {"depth": 2, "n_actions": 3, "seed": 4, "n_tasks": 4}


def make_env():
    return gym.make("BPO-TreeMDP-v0", **ENV_KWARGS)


@pytest.fixture(scope="module")
def warm_policy():
    """The tiny model after a short behaviour cloning on TreeMDP expert trajectories.

    One thread and a fixed torch seed (peft draws LoRA's initial weights from it): multithreaded
    CPU reductions are not bit-reproducible, and 5 epochs at lr 1e-2 amplify that noise.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    try:
        policy = HFPolicy(tiny_model_path(), max_new_tokens=8, seed=0, lora={"r": 16, "lora_alpha": 32})
        demos = expert_demos(make_env, list(range(4)))
        before = _expert_logprob(policy, demos)
        losses = behaviour_cloning(policy, demos * 4, epochs=8, lr=1e-2, batch_size=8, seed=0)
    finally:
        torch.set_num_threads(threads)
    return policy, demos, losses, before


def _expert_logprob(policy, demos) -> float:
    with torch.no_grad():
        return float(policy.token_logprobs(demo_steps(policy, demos)).sum()) / len(demos)


def test_expert_demos_follow_the_expert_with_engine_contexts():
    demos = expert_demos(make_env, [0, 1])
    assert len(demos) == 2 * ENV_KWARGS["depth"]
    env = make_env().unwrapped
    for task in (0, 1):
        first, second = [d for d in demos if d.context.task_id == task]
        env.reset(options={"task_id": task})
        assert [first.action, second.action] == env.expert_actions()
        assert first.context.history == () and first.context.admissible_actions == ("a0", "a1", "a2")
        assert second.context.history[0].action == first.action
        assert second.context.initial_observation == first.context.observation


def test_behaviour_cloning_teaches_the_format_and_the_expert(warm_policy):
    policy, demos, losses, before = warm_policy
    assert sum(losses[-3:]) / 3 < 0.2 * sum(losses[:3]) / 3
    # the expert's answers became far more likely (per answer: ~1e-10 -> ~1/3 or more)
    assert _expert_logprob(policy, demos) > before + 10
    greedy = policy.generate([d.context for d in demos], 1, greedy=True)
    well_formed = [
        row[0].text == f"<action>{row[0].env_action}</action>" and row[0].env_action in demo.context.admissible_actions
        for row, demo in zip(greedy, demos, strict=True)
    ]
    # the untrained model answers none in the format; float noise across thread schedules can
    # flip a greedy token or two after so short a warm start, hence 3 in 4 rather than all
    assert sum(well_formed) >= 0.75 * len(well_formed), well_formed


@pytest.mark.parametrize("algorithm", ["bpo", "grpo"])
def test_collect_loss_backward_end_to_end(warm_policy, algorithm):
    policy = warm_policy[0]
    algo = (
        BPO(backbones=2, branch_factor=2, entropy_threshold=0.0, kl_coef=0.05, seed=0)
        if algorithm == "bpo"
        else GRPO(group_size=3, seed=0)
    )
    before = policy.meter.copy()
    batch = algo.collect(policy, [make_env] * 3, tasks=[0, 1])
    assert batch.n_trees == 2 and batch.steps
    steps = batch.steps
    assert all(s.action.prompt_token_ids == policy.prompt_ids(s.context) for s in steps)
    assert batch.compute.gen_tokens == sum(len(s.action.token_ids) for s in steps)
    assert batch.compute.prefill_tokens == policy.meter.prefill_tokens - before.prefill_tokens > 0
    assert batch.compute.score_tokens == policy.meter.score_tokens - before.score_tokens
    assert (batch.compute.score_tokens > 0) == (algorithm == "bpo")
    assert batch.compute.policy_calls == policy.meter.policy_calls - before.policy_calls
    if algorithm == "bpo":
        assert any(n.is_branch for t in batch.trees for n in _nodes(t.root) if n is not t.root)
        assert batch.ref_logprobs is not None and batch.ref_logprobs.shape[0] == len(steps)
    # fresh samples: the policy ratio is exactly 1
    logp = policy.token_logprobs(steps)
    assert torch.allclose(logp.detach() * batch.mask(), batch.old_logprobs(), atol=1e-3)
    loss = algo.loss(policy, batch)
    assert torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in policy.trainable_parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    # the surrogate's gradient is zero exactly when every advantage is (e.g. a group whose
    # episodes all ended the same way); otherwise it must reach the parameters
    if any(s.advantage != 0.0 for s in steps):
        assert sum(float(g.abs().sum()) for g in grads) > 0
    policy.model.zero_grad(set_to_none=True)


def _nodes(node):
    yield node
    for edge in node.children:
        yield from _nodes(edge.child)



def test_behaviour_cloning_creates_a_table_policy_s_entries_before_its_optimizer(monkeypatch):
    """A table policy's entries appear on first sight: ``prepare_parameters`` must create them
    before the optimizer is built (an LLM's parameters are all there and skip that pass)."""
    from bpo_algos import TabularPolicy
    from bpo_algos.policy.base import Policy

    demos = expert_demos(make_env, list(range(4)))
    policy = TabularPolicy(seed=0)
    behaviour_cloning(policy, demos, epochs=30, lr=0.3, batch_size=4, seed=0)
    for demo in demos:
        assert policy.action_distribution(demo.context)[demo.action] > 0.9
    # broken: the default (no pass) leaves the optimizer with no parameters to train
    monkeypatch.setattr(TabularPolicy, "prepare_parameters", Policy.prepare_parameters)
    with pytest.raises(ValueError, match="empty parameter list"):
        behaviour_cloning(TabularPolicy(seed=0), demos, epochs=1, lr=0.3, seed=0)

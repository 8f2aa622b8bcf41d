"""Behaviour cloning warm start from the envs' expert trajectories.

:func:`expert_demos` walks ``env.unwrapped.expert_actions()`` on each task and records every
decision point as a :class:`~bpo_algos.policy.base.Context` (exactly what the rollout engine
would build: same history, same admissible actions). :func:`behaviour_cloning` maximises the
log-likelihood of the formatted expert answer (``<action>a</action>`` + stop token) under the
policy's own prompt, through the policy's ``token_logprobs``, so the warm-started model is
trained on the very prompts RL will show it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from bpo_algos.optimizers import TouchedRowsAdam
from bpo_algos.policy.base import Action, Context, admissible_of
from bpo_envs.seeding import key_seed


@dataclass(frozen=True)
class Demo:
    """One expert decision: the context and the action the expert took there."""

    context: Context
    action: str




def expert_demos(env_fn: Callable[[], gym.Env], tasks: Sequence[Any], *, seed: int = 0) -> list[Demo]:
    """Every decision point of the expert's trajectory on each task of ``tasks``.

    The expert's plan is followed until it runs out; the env is then asked again (an env may
    plan in stages). A task whose expert has no action at the reset state gives no demo.
    """
    env = env_fn()
    demos: list[Demo] = []
    try:
        for i, task in enumerate(tasks):
            obs, info = env.reset(seed=key_seed(seed, i), options={"task_id": task})
            context = Context(info.get("task_id", task), obs, admissible_of(info), initial_observation=obs)
            done = False
            while not done:
                plan = list(env.unwrapped.expert_actions())
                if not plan:
                    break
                for action in plan:
                    demos.append(Demo(context, action))
                    obs, _, terminated, truncated, info = env.step(action)
                    context = context.child(action, obs, admissible_of(info))
                    done = terminated or truncated
                    if done:
                        break
    finally:
        env.close()
    return demos


@dataclass
class _Step:
    context: Context
    action: Action


def demo_steps(policy: Any, demos: Sequence[Demo]) -> list[_Step]:
    """``demos`` as recorded steps for ``policy.token_logprobs`` (``policy.recorded_action``).

    Demos the policy cannot express are left out: a choice policy picks among the admissible
    actions, and an expert may act outside them (WebShop's expert types its own search query).
    """
    steps = []
    for demo in demos:
        action = policy.recorded_action(demo.context, demo.action)
        if action is not None:
            steps.append(_Step(demo.context, action))
    return steps


def behaviour_cloning(
    policy: Any,
    demos: Sequence[Demo],
    *,
    epochs: int = 1,
    lr: float = 1e-3,
    batch_size: int = 16,
    optimizer: torch.optim.Optimizer | None = None,
    seed: int = 0,
) -> list[float]:
    """Train ``policy`` (an ``HFPolicy`` or a ``ChoicePolicy``) to imitate ``demos``.

    Minimises the mean negative log-likelihood per answer token, ``epochs`` passes over the
    demos in a seeded shuffled order, with Adam (:class:`~bpo_algos.optimizers.TouchedRowsAdam`)
    unless ``optimizer`` is given. Returns the loss of every batch. A ``VLLMPolicy`` has
    its weights pushed to the generator afterwards.
    """
    if not demos:
        raise ValueError("no demos to clone: did the env's expert_actions() return anything?")
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be >= 1, got {epochs}, {batch_size}")
    steps = demo_steps(policy, demos)
    if not steps:
        raise ValueError(f"none of the {len(demos)} demos is an action {type(policy).__name__} can take")
    rng = np.random.default_rng(seed)
    losses: list[float] = []
    # every epoch scores the same demo contexts: what a policy derives from their text alone
    # is derived once (Policy.inputs_kept), the weights' part every batch
    with policy.inputs_kept():
        policy.prepare_parameters(steps)  # a table policy's entries, before the optimizer sees its parameters
        # Adam without weight decay, computed only on the rows a gradient has reached: a text
        # scorer's batch reaches a few hundred of its 32,768 embedding rows, and the others'
        # step is exactly the identity (the numbers of AdamW(weight_decay=0), bit for bit)
        optimizer = optimizer or TouchedRowsAdam(policy.trainable_parameters(), lr=lr)
        for _ in range(epochs):
            order = rng.permutation(len(steps))
            for start in range(0, len(order), batch_size):
                chunk = [steps[i] for i in order[start : start + batch_size]]
                logp = policy.token_logprobs(chunk)
                n_tokens = sum(len(s.action.token_ids) for s in chunk)
                loss = -logp.sum() / n_tokens
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                losses.append(float(loss.detach()))
    policy.clear_cache()
    policy.sync_weights()
    return losses

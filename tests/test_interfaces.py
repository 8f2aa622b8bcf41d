"""The engine's doors are explicit: a policy is a ``Policy`` subclass and a topology a
``Topology`` (each hook with a default there), the engine counts no token the policy metered,
and a choice action carries its index with its text to the loss."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import bpo_envs  # noqa: F401 - registers the ids
from bpo_algos import (
    BPO,
    Action,
    EnvPool,
    Policy,
    RolloutEngine,
    TabularPolicy,
    Topology,
    make_algorithm,
)
from bpo_algos.controls import Frozen
from bpo_algos.policy.base import as_context

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Step:
    context: object
    action: Action


def _tree():
    return gym.make("BPO-TreeMDP-v0", depth=3, n_actions=3, seed=1, n_tasks=2)


class Uniform(Policy):
    """Only the three binding methods; every other hook is the base class's default."""

    def __init__(self, meter_generation: bool = True) -> None:
        super().__init__()
        self.meter_generation = meter_generation

    def sample(self, contexts, n, rngs):
        out = []
        for context, rng in zip(contexts, rngs, strict=True):
            actions = context.admissible_actions
            picks = rng.integers(len(actions), size=n)
            out.append([Action(actions[i], (int(i),), (-math.log(len(actions)),), index=int(i)) for i in picks])
            if self.meter_generation:
                self.meter.gen_tokens += n
        self.meter.policy_calls += 1
        return out

    def decision_entropy(self, contexts):
        return [math.log(len(c.admissible_actions)) for c in contexts]

    def token_logprobs(self, steps):
        return torch.tensor([[s.action.logprobs[0]] for s in steps])


def test_a_policy_with_only_the_binding_methods_runs_and_the_engine_counts_no_token():
    bpo = BPO(backbones=2, branch_factor=3, entropy_threshold=0.5, max_branch_points=1)
    batch = bpo.collect(Uniform(), [_tree], [0, 1], seed=0)
    assert len(batch.steps) > 2 * 2 * 3  # it branched
    # every sampled action became an edge (rule 2), and the policy's count is what is reported
    assert batch.compute.gen_tokens == len(batch.steps) == sum(t.compute.gen_tokens for t in batch.trees)
    assert batch.compute.train_tokens == sum(len(s.action.token_ids) for s in batch.steps)  # the default hook
    # the broken case: a policy that does not meter its generation reports none (no recount)
    silent = bpo.collect(Uniform(meter_generation=False), [_tree], [0, 1], seed=0)
    assert silent.compute.gen_tokens == 0 and len(silent.steps) == len(batch.steps)


def test_the_topology_defaults_are_one_rollout_from_the_root():
    pool = EnvPool([_tree])
    try:
        result = RolloutEngine(pool, seed=3).run(TabularPolicy(), Topology(), [0, 1])
    finally:
        pool.close()
    assert [len(t.leaf_edges()) for t in result.trees] == [1, 1]
    assert all(len(t.edges()) == 3 for t in result.trees)


def test_the_engine_the_trainer_and_the_algorithm_probe_no_policy_or_algorithm():
    for name in ("rollout.py", "trainer.py", "algorithm.py"):
        source = (ROOT / "bpo_algos" / name).read_text()
        assert "import inspect" not in source and "__getattr__" not in source
        probes = re.findall(r"\b(?:getattr|hasattr)\(([^,]+),", source)
        assert not [p for p in probes if re.search(r"polic|topolog|algorithm|self\b", p)], (name, probes)


def test_frozen_is_an_ordinary_class_around_its_algorithm():
    frozen = make_algorithm("frozen", of="rloo", group_size=3, seed=0)
    assert type(frozen) is Frozen and type(frozen.inner).__name__ == "RLOO"
    assert frozen.root_branches == 3 and frozen.options is frozen.inner.options
    assert frozen.config()["frozen"] is True and frozen.config()["collects_as"] == "rloo"


def test_a_choice_action_whose_text_and_index_disagree_is_refused_at_the_loss():
    policy = TabularPolicy()
    context = as_context(("obs", ("a", "b", "c")))
    [[action]] = policy.sample([context], 1, [np.random.default_rng(0)])
    assert context.admissible_actions[action.index] == action.text
    assert policy.token_logprobs([Step(context, action)]).shape == (1, 1)
    wrong = Action("c" if action.text != "c" else "a", action.token_ids, action.logprobs, index=action.index)
    with pytest.raises(ValueError, match="not that admissible action"):
        policy.token_logprobs([Step(context, wrong)])

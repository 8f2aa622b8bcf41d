"""Policies and algorithms declare what they can do; bpo_algos reads the declarations.

* The ``Policy`` and ``Algorithm`` bases give every optional member a documented default, so a
  user's subclass that implements only the required methods trains.
* On one process the loss path is ``Trainer -> Algorithm``: no code of
  :mod:`bpo_algos.data_parallel` runs in ``Trainer.optimize``, and its numbers are those of the
  algorithm's own loss (bitwise) and of the recorded reference
  (``tests/one_process_reference.py``).
* No ``getattr(obj, name, default)`` or ``hasattr`` on the project's own objects in
  ``bpo_algos``: every one left is on a third-party object and says so (``# third-party: why``).
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import one_process_reference
import pytest
import torch
from torch import nn

import bpo_envs  # noqa: F401
from baselines import RLOO
from bpo_algos import Trainer, TrainerConfig
from bpo_algos import data_parallel as dp
from bpo_algos.algorithm import Algorithm, NoOptions
from bpo_algos.losses import gradient_norm
from bpo_algos.policy.base import Action, Context, Policy, StepLike, as_steps
from bpo_algos.policy.tabular import TabularPolicy

ROOT = Path(__file__).resolve().parents[1]


def make():
    return gym.make("BPO-TreeMDP-v0", depth=3, n_actions=3, seed=1, n_tasks=4)


# ---- the declared defaults ------------------------------------------------------------------
def test_the_policy_base_declares_every_optional_member_with_its_default():
    class Bare(Policy):
        pass

    bare = Bare()
    assert Policy.eval_temperature is None and Policy.device is None and Policy.train_batch_size is None
    assert Policy.samples_from_rngs is True and Policy.restored_in_place is False
    assert bare.shardable_model() is None
    assert bare.trainable_parameters() == [] and bare.flops_parameters() == 0  # no module, no parameters
    assert isinstance(bare.sampling_temperature(0.0), nullcontext) and isinstance(bare.shared_pass([]), nullcontext)
    assert bare.clear_cache() is None and bare.sync_weights() is None and bare.prepare_parameters([]) is None
    for required in (lambda: bare.sample([], 1, None), lambda: bare.decision_entropy([]), lambda: bare.token_logprobs([])):
        with pytest.raises(NotImplementedError, match="Bare implements no"):
            required()
    with pytest.raises(TypeError, match="gradient_checkpointing"):
        bare.enable_gradient_checkpointing()
    # what the project's policies declare instead of being probed for
    from bpo_algos.policy.hf import HFPolicy

    assert HFPolicy.restored_in_place is True and TabularPolicy.restored_in_place is False
    from bpo_algos.policy.weights import reusable

    assert not reusable(TabularPolicy()) and not reusable(nn.Linear(2, 2))  # a bare module is no Policy
    assert HFPolicy._generator is None  # until __init__ makes it: HFPolicy._apply reads it


def test_the_algorithm_base_declares_every_optional_member_with_its_default():
    class Bare(Algorithm):
        pass

    bare = Bare()
    assert bare.Options is NoOptions and bare.unbiased is True and bare.budget_multiple == 1.0
    assert bare.threshold is None and bare.root_branches == 1 and bare.trees_per_task == 1
    assert bare.snapshot_nodes is False
    assert bare.finish_trees([]) is None and bare.end_batch(None) is None  # type: ignore[arg-type]
    assert list(bare.expansions(None, 0)) == []  # type: ignore[arg-type]
    with pytest.raises(NotImplementedError, match="names no estimator"):
        bare.estimator([])


class UserPolicy(Policy, nn.Module):
    """A user's policy: one logit per admissible action index, the three binding methods and
    nothing else (no optional member defined)."""

    def __init__(self, n_actions: int = 3) -> None:
        nn.Module.__init__(self)
        Policy.__init__(self)
        self.logits = nn.Parameter(torch.zeros(n_actions))

    def sample(self, contexts: Sequence[Context], n: int, rngs: Sequence[np.random.Generator] | None) -> list[list[Action]]:
        logp = torch.log_softmax(self.logits.detach().double(), -1)
        p = logp.exp().numpy()
        rows = []
        for context, rng in zip(contexts, rngs or [self._rng] * len(contexts), strict=True):
            picks = [int(rng.choice(len(p), p=p / p.sum())) for _ in range(n)]
            rows.append([Action(context.admissible_actions[i], (i,), (float(logp[i]),), index=i) for i in picks])
        self.meter.policy_calls += 1
        return rows

    def decision_entropy(self, contexts: Sequence[Context]) -> list[float]:
        logp = torch.log_softmax(self.logits.detach(), -1)
        return [float(-(logp.exp() * logp).sum())] * len(contexts)

    def token_logprobs(self, steps: Sequence[StepLike]) -> torch.Tensor:
        logp = torch.log_softmax(self.logits, -1)
        return torch.stack([logp[s.action.token_ids[0]] for s in as_steps(steps)])[:, None]


class UserAlgorithm(Algorithm):
    """A user's algorithm: a group of 3 at the root, scored by the registered ``rloo``
    estimator; every other member is the base's."""

    name = "user-rloo"
    root_branches = 3

    def estimator(self, trees: Sequence[Any]) -> tuple[str, dict[str, Any]]:
        return "rloo", {}


def test_a_user_policy_and_algorithm_train_without_defining_optional_members():
    policy = UserPolicy()
    trainer = Trainer(UserAlgorithm(seed=1), policy, [make, make], [0, 1, 2, 3], TrainerConfig(updates=3, tasks_per_update=2, learning_rate=0.5))
    history = trainer.train()
    assert [r["update"] for r in history] == [1, 2, 3]
    assert all(np.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in history)
    # the base topology: the root's group of 3, nothing else branches
    trees = trainer.last_batch.trees
    assert all(len(t.root.children) == 3 and t.branch_points == 0 for t in trees)
    assert not torch.equal(policy.logits.detach(), torch.zeros(3))  # it learned


# ---- the loss path on one process ---------------------------------------------------------
def calls_into(path: str, fn: Callable[[], Any]) -> tuple[Any, list[str]]:
    """``fn()``'s result and the names of the functions defined in ``path`` that ran during it."""
    seen: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename == path:
            seen.append(frame.f_code.co_name)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        result = fn()
    finally:
        sys.setprofile(previous)
    return result, seen


# the rank-agnostic helpers a one-process step may still use (seeds, shares, no-op barrier)
ONE_PROCESS_HELPERS = {"update_seed", "shard_indices", "barrier", "is_distributed", "rank", "world_size", "<listcomp>"}


@pytest.mark.parametrize("micro_batch_tokens", [None, 24])
def test_one_process_loss_path_runs_no_data_parallel_code(micro_batch_tokens):
    trainer = Trainer(RLOO(group_size=3), TabularPolicy(), [make], [0, 1, 2],
                      TrainerConfig(updates=2, tasks_per_update=2, micro_batch_tokens=micro_batch_tokens))
    assert trainer.parallel is None and not trainer.fsdp
    batch = trainer.collect(trainer.draw_tasks())
    trainer.policy.train()
    _, seen = calls_into(dp.__file__, lambda: trainer.optimize(batch))
    assert seen == []
    # a whole step: only the rank-agnostic helpers (seeds, tree shares), no data-parallel layer
    _, seen = calls_into(dp.__file__, trainer.step)
    assert set(seen) <= ONE_PROCESS_HELPERS, sorted(set(seen))
    assert "DataParallel" not in str(seen)


def test_the_call_detector_sees_data_parallel_code():
    """The broken case: a loss path that went through data_parallel would be seen."""
    _, seen = calls_into(dp.__file__, lambda: dp.all_reduce_sum([1.0]))
    assert "all_reduce_sum" in seen


def test_data_parallel_is_only_built_for_several_ranks():
    with pytest.raises(ValueError, match="several ranks"):
        dp.DataParallel(TabularPolicy(), RLOO(group_size=2), fsdp=False, precision="fp32", device=torch.device("cpu"))


@pytest.mark.parametrize(("aggregation", "micro_batch_tokens", "max_grad_norm"), [
    ("token-mean", None, 0.02), ("step-sum", None, None), ("seq-mean-token-mean", 24, 0.02),
])
def test_one_process_update_is_bitwise_the_algorithms_own_loss(aggregation, micro_batch_tokens, max_grad_norm):
    """Trainer.optimize on one process = the algorithm's loss (or its micro-batched backward),
    the float64 gradient norm, clipping: bitwise, in the same process."""
    trainer = Trainer(RLOO(group_size=3, aggregation=aggregation), TabularPolicy(), [make], [0, 1, 2],
                      TrainerConfig(updates=1, tasks_per_update=3, micro_batch_tokens=micro_batch_tokens, max_grad_norm=max_grad_norm))
    batch = trainer.collect(trainer.draw_tasks())
    trainer.policy.prepare_parameters(batch.steps)
    twin = copy.deepcopy(trainer.policy)
    loss, norm = trainer.optimize(batch)

    if micro_batch_tokens is None:
        expected = trainer.algorithm.loss(twin, batch)
        expected.backward()
        expected_loss = float(expected.detach())
    else:
        expected_loss = trainer.algorithm.backward(twin, batch, micro_batch_tokens=micro_batch_tokens)
    params = [p for p in twin.trainable_parameters() if p.requires_grad]
    expected_norm = gradient_norm(params)
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    assert (loss, norm) == (expected_loss, expected_norm)
    got = dict(trainer.policy.named_parameters())
    for name, p in twin.named_parameters():
        assert torch.equal(got[name].grad, p.grad), name


def test_one_process_training_matches_the_recorded_reference():
    """The numbers of ``tests/data/one_process_update_reference.json``, written before the
    data-parallel layer left the one-process loss path (bitwise equal there; float32 sums may
    differ in the last bits on another CPU, hence the tolerance)."""
    reference = json.loads((ROOT / "tests" / "data" / "one_process_update_reference.json").read_text())
    assert set(reference) == set(one_process_reference.CASES)
    for name, want in reference.items():
        got = one_process_reference.run(name)
        for row_got, row_want in zip(got["rows"], want["rows"], strict=True):
            assert row_got == pytest.approx(row_want, rel=1e-6, abs=1e-9), name
        assert got["param_sum"] == pytest.approx(want["param_sum"], rel=1e-6, abs=1e-9), name
        assert got["param_norm"] == pytest.approx(want["param_norm"], rel=1e-6), name


# ---- no probing of the project's own objects ------------------------------------------------
# Env capabilities the engine still probes: the env declarations own them (bpo_envs.core's
# SnapshotEnv); these three attribute names in rollout.py are theirs to replace.
# The scan for getattr-with-default / hasattr on the project's own objects, over bpo_envs and
# bpo_algos alike, is tests/test_env_capabilities.py::test_no_probe_of_the_projects_own_objects.


def test_vllm_policy_declares_its_engine_state():
    """``VLLMPolicy``'s engine state has class defaults (read, not probed): closing or waking a
    policy whose engine was never built, or was closed, is a no-op (no vLLM needed)."""
    from bpo_algos.policy.vllm_policy import VLLMPolicy

    assert VLLMPolicy.llm is None and VLLMPolicy.asleep is False and VLLMPolicy.sleep_during_update is False
    assert VLLMPolicy.samples_from_rngs is False and VLLMPolicy.restored_in_place is True
    unbuilt = object.__new__(VLLMPolicy)
    nn.Module.__init__(unbuilt)
    unbuilt.train()
    unbuilt._wake()
    unbuilt.close()
    unbuilt.llm = object()  # an engine, then closed: the class default shows again
    unbuilt.close()
    assert unbuilt.llm is None

"""TouchedRowsAdam takes AdamW(weight_decay=0)'s steps bit for bit while computing them only on
the rows a gradient has reached; behaviour cloning with it gives the policy AdamW gives."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

import bpo_envs  # noqa: F401
from bpo_algos.optimizers import TouchedRowsAdam
from bpo_algos.policy.scorer import TextScorerPolicy
from bpo_algos.policy.sft import behaviour_cloning, expert_demos


def _run(optimizer_class: type[torch.optim.Optimizer], cols: int, steps: int = 60, **options: float) -> tuple[list[torch.Tensor], dict]:
    """A table (sparse rows), a matrix and a vector under ``steps`` seeded gradients: the table's
    first 40 steps reach rows of its first 300 only, some rows get an exact-zero gradient after
    having had others, and the last steps reach the whole table (it turns dense mid-run)."""
    init = torch.Generator().manual_seed(1)
    params = [torch.randn(5000, cols, generator=init).requires_grad_(), torch.randn(16, 5, generator=init).requires_grad_(),
              torch.randn(5, generator=init).requires_grad_()]
    optimizer = optimizer_class(params, lr=3e-3, **options)
    draws = torch.Generator().manual_seed(cols)
    for step in range(steps):
        # distinct rows: a row written twice by one index_put gets either value (threads race)
        rows = torch.randperm(300 if step < 40 else 5000, generator=draws)[: 20 if step < 50 else 4000]
        table = torch.zeros(5000, cols)
        table[rows] = torch.randn(len(rows), cols, generator=draws)
        if step % 7 == 0:
            table[rows[:3]] = 0.0
        for p, grad in zip(params, (table, torch.randn(16, 5, generator=draws), torch.randn(5, generator=draws)), strict=True):
            p.grad = grad
        optimizer.step()
    return [p.detach() for p in params], optimizer.state[params[0]]


@pytest.mark.parametrize("cols", [7, 32, 33])
def test_touched_rows_adam_equals_adamw_without_weight_decay_bit_for_bit(cols):
    expected, expected_state = _run(torch.optim.AdamW, cols, weight_decay=0.0, foreach=True)
    got, state = _run(TouchedRowsAdam, cols)
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    for key in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(expected_state[key], state[key]), key
    assert state["touched"] is None  # the last steps reached most rows: the full step from then on


def test_a_step_on_no_touched_row_still_counts_for_the_bias_correction():
    p = torch.nn.Parameter(torch.ones(10, 4))
    optimizer = TouchedRowsAdam([p], lr=0.1)
    p.grad = torch.zeros(10, 4)
    optimizer.step()
    assert torch.equal(p.detach(), torch.ones(10, 4)) and float(optimizer.state[p]["step"]) == 1.0
    reference = torch.nn.Parameter(torch.ones(10, 4))
    adamw = torch.optim.AdamW([reference], lr=0.1, weight_decay=0.0)
    reference.grad = torch.zeros(10, 4)
    adamw.step()
    for q in (p, reference):
        q.grad = torch.zeros(10, 4)
        q.grad[3] = 1.0
    optimizer.step()
    adamw.step()
    assert torch.equal(p.detach(), reference.detach()) and not torch.equal(p[3], torch.ones(4))


class _CurrentRowsOnly(TouchedRowsAdam):
    """The broken case: a lazy Adam that forgets the rows earlier steps reached (as
    ``torch.optim.SparseAdam`` does), so their moments stop decaying and they stop moving."""

    def step(self, closure: None = None) -> None:  # type: ignore[override]
        for state in self.state.values():
            if state.get("touched") is not None:
                state["touched"].zero_()
        super().step()


def test_forgetting_the_rows_reached_before_is_caught():
    expected, _ = _run(torch.optim.AdamW, 32, weight_decay=0.0, foreach=True)
    got, _ = _run(_CurrentRowsOnly, 32)
    assert not torch.equal(expected[0], got[0])


def test_bad_settings_and_sparse_gradients_are_refused():
    with pytest.raises(ValueError, match="betas"):
        TouchedRowsAdam([torch.nn.Parameter(torch.ones(2))], betas=(0.9, 1.0))
    table = torch.nn.EmbeddingBag(10, 4, sparse=True)
    table(torch.tensor([[1, 2]])).sum().backward()
    with pytest.raises(ValueError, match="dense gradients"):
        TouchedRowsAdam(table.parameters()).step()


def test_behaviour_cloning_with_it_gives_the_policy_adamw_gives():
    def webshop() -> gym.Env:
        return gym.make("BPO-WebShop-v0", max_episode_steps=10)

    env = webshop()
    tasks = list(env.unwrapped.task_ids())[:12]
    env.close()
    demos = expert_demos(webshop, tasks, seed=0)
    policies = [TextScorerPolicy(seed=0) for _ in range(2)]
    behaviour_cloning(policies[0], demos, epochs=3, lr=3e-3, seed=0)  # the default: TouchedRowsAdam
    adamw = torch.optim.AdamW(policies[1].trainable_parameters(), lr=3e-3, weight_decay=0.0, foreach=True)
    behaviour_cloning(policies[1], demos, epochs=3, lr=3e-3, seed=0, optimizer=adamw)
    ours, theirs = (p.state_dict() for p in policies)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert not torch.equal(ours["embedding.weight"], TextScorerPolicy(seed=0).state_dict()["embedding.weight"])

"""Trainer: learning, logs, checkpoints and exact resume; BPO's adaptive threshold."""

from __future__ import annotations

import json
import sys
import types

import gymnasium as gym
import numpy as np
import pytest

import bpo_envs  # noqa: F401
from baselines import GRPO, RLOO
from bpo_algos import BPO, TabularPolicy, Trainer, TrainerConfig


def make():
    return gym.make("BPO-TreeMDP-v0", depth=4, n_actions=3, seed=1, n_tasks=4)


def _config(tmp_path, updates, **kw):
    return TrainerConfig(updates=updates, tasks_per_update=4, budget=("env_steps", 64), out_dir=tmp_path, **kw)


@pytest.mark.parametrize("algorithm", [lambda: BPO(entropy_threshold=None), lambda: GRPO(group_size=4), lambda: RLOO(group_size=4)])
def test_training_raises_the_return(tmp_path, algorithm):
    history = Trainer(algorithm(), TabularPolicy(), [make, make], [0, 1, 2, 3], _config(tmp_path, 60)).train()
    first = np.mean([r["return"] for r in history[:5]])
    last = np.mean([r["return"] for r in history[-5:]])
    assert last > first + 0.1
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 60 and rows[-1]["update"] == 60
    for key in ("success", "return", "loss", "grad_norm", "entropy", "compute", "compute_total"):
        assert key in rows[0]
    assert set(rows[0]["compute"]) >= {"env_steps", "restores", "snapshots", "leaves", "gen_tokens", "prefill_tokens", "policy_calls", "seconds"}


def test_resume_reproduces_an_uninterrupted_run(tmp_path):
    def run(path, updates):
        return Trainer(BPO(), TabularPolicy(), [make], [0, 1, 2, 3], _config(path, updates)).train()

    straight = run(tmp_path / "a", 12)
    run(tmp_path / "b", 5)
    resumed = run(tmp_path / "b", 12)
    key = lambda h: [(r["success"], r["loss"], r["compute"]["env_steps"], r.get("entropy_threshold")) for r in h]  # noqa: E731
    assert key(straight) == key(resumed)
    assert len((tmp_path / "b" / "metrics.jsonl").read_text().splitlines()) == 12


def test_resume_refuses_another_algorithm(tmp_path):
    Trainer(RLOO(group_size=2), TabularPolicy(), [make], [0], _config(tmp_path, 2)).train()
    with pytest.raises(ValueError, match="checkpoint of 'rloo'"):
        Trainer(BPO(), TabularPolicy(), [make], [0], _config(tmp_path, 3))


def test_adaptive_threshold_uses_only_earlier_batches():
    algorithm = BPO(backbones=2, branch_factor=2, entropy_threshold=None, entropy_quantile=0.5, threshold_window=1)
    policy = TabularPolicy()
    assert algorithm.threshold == 0.0
    thresholds, entropies = [], []
    for _ in range(4):
        thresholds.append(algorithm.threshold)
        batch = algorithm.collect(policy, [make], [0])
        entropies.append(batch.entropies)
    for t in range(1, 4):
        assert thresholds[t] == pytest.approx(float(np.quantile(entropies[t - 1], 0.5)))


def test_same_seed_same_batches_for_every_algorithm_task_sequence(tmp_path):
    a = Trainer(GRPO(group_size=2), TabularPolicy(), [make], [0, 1, 2, 3], TrainerConfig(updates=3, tasks_per_update=2, seed=9))
    b = Trainer(RLOO(group_size=2), TabularPolicy(), [make], [0, 1, 2, 3], TrainerConfig(updates=3, tasks_per_update=2, seed=9))
    assert [a.draw_tasks() for _ in range(3)] == [b.draw_tasks() for _ in range(3)]


class _RecordingWandb(types.ModuleType):
    """Stands in for the ``wandb`` package (not installed here): records what the Trainer asks."""

    def __init__(self) -> None:
        super().__init__("wandb")
        self.inits: list[dict] = []
        self.logged: list[dict] = []
        self.util = types.SimpleNamespace(generate_id=lambda: f"run{len(self.inits)}")

    def init(self, **kwargs):
        self.inits.append(kwargs)
        return types.SimpleNamespace(log=lambda scalars, step: self.logged.append({"step": step, **scalars}))


def test_wandb_runs_are_named_grouped_configured_and_resumed_under_their_id(tmp_path, monkeypatch):
    fake = _RecordingWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)

    def config(updates: int) -> TrainerConfig:
        return TrainerConfig(updates=updates, tasks_per_update=2, out_dir=tmp_path, wandb_project="bpo",
                             wandb_name="treemdp/rloo/seed0", wandb_group="cmp-1", wandb_config={"preset": {"updates": 3}})

    Trainer(RLOO(group_size=2), TabularPolicy(), [make], tasks=[0, 1], config=config(2)).train()
    Trainer(RLOO(group_size=2), TabularPolicy(), [make], tasks=[0, 1], config=config(3)).train()  # resumes
    first, second = fake.inits
    assert first["id"] == second["id"] and second["resume"] == "allow"
    assert first["name"] == "treemdp/rloo/seed0" and first["group"] == "cmp-1" and first["project"] == "bpo"
    assert first["config"]["preset"] == {"updates": 3} and first["config"]["algorithm"]["group_size"] == 2
    assert [row["step"] for row in fake.logged] == [1, 2, 3]


def _trained_tasks(path, updates, task_draw, n_tasks=12):
    def make32():
        return gym.make("BPO-TreeMDP-v0", depth=4, n_actions=3, seed=1, n_tasks=n_tasks)

    seen: list[list[int]] = []

    def record(trainer):
        if trainer.update > len(seen) and trainer.last_batch is not None:
            seen.append([t.task_id for t in sorted(trainer.last_batch.trees, key=lambda t: t.index)])

    config = TrainerConfig(updates=updates, tasks_per_update=n_tasks, budget=("env_steps", 48), out_dir=path, task_draw=task_draw)
    trainer = Trainer(RLOO(group_size=4), TabularPolicy(), [make32], list(range(n_tasks)), config)
    trainer.train(after_update=record)
    return seen


def test_unseen_first_trains_on_every_task_once_before_any_again(tmp_path):
    # each update's budget starts ~3 trees on the first tasks of its draw; the walk continues
    # from there, so the tasks trained on are consecutive permutations of all 12
    per_update = _trained_tasks(tmp_path / "a", 10, "unseen-first")
    flat = [t for update in per_update for t in update]
    assert len(flat) >= 24 and all(len(u) >= 1 for u in per_update)
    for start in range(0, len(flat) - 11, 12):
        assert sorted(flat[start : start + 12]) == list(range(12)), start
    # the broken case this catches: independent draws repeat tasks across updates before every
    # task was seen (fixed seed; 4 updates of ~3 draws from 12 tasks)
    independent = [t for update in _trained_tasks(tmp_path / "b", 4, "independent") for t in update]
    assert len(set(independent)) < len(independent)
    # a resumed run continues the same walk
    _trained_tasks(tmp_path / "c", 3, "unseen-first")
    resumed = _trained_tasks(tmp_path / "c", 10, "unseen-first")
    assert resumed == per_update[3:]
    with pytest.raises(ValueError, match="task_draw"):
        TrainerConfig(task_draw="random")

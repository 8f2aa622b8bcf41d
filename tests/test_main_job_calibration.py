"""The calibration control ``rloo-2x``: RLOO at twice the budget per update, read per update."""

from __future__ import annotations

import gymnasium as gym
import pytest

import bpo_envs  # noqa: F401
from bpo_algos import EnvPool, TabularPolicy, make_algorithm
from bpo_experiments.build import build_algorithm, run_budget
from bpo_experiments.presets import PRESETS
from bpo_experiments.stats import run_metrics


def test_rloo_2x_collects_twice_the_budget_of_rloo():
    preset = PRESETS["smoke"]
    rloo, doubled = (build_algorithm(name, preset, 0, "treemdp") for name in ("rloo", "rloo-2x"))
    assert rloo.budget_multiple == 1.0 and doubled.budget_multiple == 2.0
    assert doubled.config() == rloo.config()  # the comparator's options, only the budget differs
    assert run_budget(preset, "treemdp", doubled).amount == 2 * run_budget(preset, "treemdp", rloo).amount == 256

    def make():
        return gym.make("BPO-TreeMDP-v0", depth=6, n_actions=3, n_tasks=8, seed=0)

    pool = EnvPool([make] * 4)
    try:
        steps = {}
        for name, algorithm in (("rloo", rloo), ("rloo-2x", doubled)):
            batch = algorithm.collect(TabularPolicy(seed=0), pool, list(range(8)), run_budget(preset, "treemdp", algorithm), seed=1)
            steps[name] = batch.compute.env_steps
    finally:
        pool.close()
    # each within one tree (8 trajectories x 6 steps) of its budget
    assert abs(steps["rloo"] - 128) <= 48 and abs(steps["rloo-2x"] - 256) <= 48
    assert make_algorithm("rloo-2x", group_size=4).options.group_size == 4


def _run(multiple: float) -> dict:
    return {"env": "treemdp", "budget_multiple": multiple,
            "evals": [{"update": u, "success": s, "compute": {"env_steps": 128 * u * multiple}} for u, s in ((0, 0.2), (2, 0.6), (4, 0.6))]}


def test_the_calibration_curve_is_read_per_update():
    preset = PRESETS["smoke"]
    same_updates = run_metrics(_run(1.0), preset, "env_steps")["auc"]
    assert run_metrics(_run(2.0), preset, "env_steps")["auc"] == pytest.approx(same_updates)
    # broken case: its compute read as the others' would squeeze its curve into half the horizon
    unscaled = {**_run(2.0), "budget_multiple": 1.0}
    assert run_metrics(unscaled, preset, "env_steps")["auc"] != pytest.approx(same_updates)

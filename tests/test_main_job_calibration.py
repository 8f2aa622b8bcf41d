"""The calibration control ``rloo-2x``: RLOO at twice the budget per update, read per update."""

from __future__ import annotations

import gymnasium as gym
import pytest

import bpo_envs  # noqa: F401
from bpo_algos import EnvPool, TabularPolicy, make_algorithm
from bpo_experiments.presets import PRESETS
from bpo_experiments.run_config import algorithm_spec, comparison_config, env_config
from bpo_experiments.stats import run_metrics


def test_rloo_2x_collects_twice_the_budget_of_rloo():
    preset = PRESETS["smoke"]
    rloo, doubled = (algorithm_spec(name, preset, 0, "treemdp").build() for name in ("rloo", "rloo-2x"))
    treemdp = env_config(preset, "treemdp")
    assert rloo.budget_multiple == 1.0 and doubled.budget_multiple == 2.0
    assert doubled.config() == rloo.config()  # the comparator's options, only the budget differs
    assert treemdp.per_update_budget(doubled.budget_multiple).amount == 2 * treemdp.per_update_budget(rloo.budget_multiple).amount == 256

    def make():
        return gym.make("BPO-TreeMDP-v0", depth=6, n_actions=3, n_tasks=8, seed=0)

    pool = EnvPool([make] * 4)
    try:
        steps = {}
        for name, algorithm in (("rloo", rloo), ("rloo-2x", doubled)):
            batch = algorithm.collect(TabularPolicy(seed=0), pool, list(range(8)), treemdp.per_update_budget(algorithm.budget_multiple), seed=1)
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
    treemdp = env_config(preset, "treemdp")
    same_updates = run_metrics(_run(1.0), treemdp)["auc"]
    assert run_metrics(_run(2.0), treemdp)["auc"] == pytest.approx(same_updates)
    # broken case: its compute read as the others' would squeeze its curve into half the horizon
    unscaled = {**_run(2.0), "budget_multiple": 1.0}
    assert run_metrics(unscaled, treemdp)["auc"] != pytest.approx(same_updates)


def test_the_treatment_is_compared_with_the_calibration_paired_by_seed():
    from bpo_experiments.stats import METRICS, _headlines, compare_with

    preset = PRESETS["smoke"]
    auc = {"bpo": [0.50, 0.52, 0.49, 0.51], "rloo": [0.50, 0.50, 0.50, 0.50], "rloo-2x": [0.52, 0.53, 0.52, 0.535]}
    metrics = {(a, s): {m: v[s] for m in METRICS} for a, v in auc.items() for s in range(4)}
    rows = {a: [{"seed": s, "budget_multiple": 2.0 if a == "rloo-2x" else 1.0} for s in range(4)] for a in auc}
    rows["rloo-2x"] = rows["rloo-2x"][:3][::-1]  # seed 3's calibration run is missing, and the rows come in another order
    vs = {a: compare_with(rows[a], rows["rloo"], metrics, a, "rloo") for a in ("bpo", "rloo-2x")}
    out = _headlines(vs, rows, comparison_config(preset))["treatment_vs_calibration"]
    assert (out["treatment"], out["calibration"], out["metric"]) == ("bpo", "rloo-2x", "auc")
    # per seed bpo − rloo-2x on the seeds both have: -0.02, -0.01, -0.03
    assert out["seeds"] == [0, 1, 2] and out["diff_per_seed"] == pytest.approx([-0.02, -0.01, -0.03])
    assert out["diff"] == pytest.approx(-0.02) and out["n"] == 3
    # t_{0.975, 2} sd / sqrt(3) with sd 0.01
    assert out["diff_ci95"] == pytest.approx(4.3027 * 0.01 / 3 ** 0.5, rel=1e-3) and out["mde"] > out["diff_ci95"]
    # t = -0.02 / (0.01 / sqrt 3) on 2 degrees of freedom: p = 1 - |t| / sqrt(t^2 + 2)
    t = 0.02 / (0.01 / 3 ** 0.5)
    assert out["p"] == pytest.approx(1 - t / (t * t + 2) ** 0.5, rel=1e-4) and out["verdict"] == "not detected"
    # the broken case: unpaired (seed 3's treatment against no calibration run) would differ
    assert out["diff"] != pytest.approx(sum(auc["bpo"]) / 4 - sum(auc["rloo-2x"][:3]) / 3)


def test_the_headline_table_has_the_row_against_the_calibration():
    from bpo_experiments.report import headline_lines
    from bpo_experiments.stats import treatment_vs_calibration

    treatment = {"seeds": [0, 1, 2, 3], "diff_per_seed": [-0.01, 0.0, -0.02, 0.01]}
    calibration = {"seeds": [0, 1, 2, 3], "diff_per_seed": [0.01, 0.01, 0.0, 0.02]}
    row = treatment_vs_calibration(treatment, calibration, "bpo", "rloo-2x", "auc")
    results = {"treatment": "bpo", "comparator": "rloo",
               "per_env": {"webshop": {"treatment_vs_comparator": {"metric": "auc", "metrics": {}}, "treatment_vs_calibration": row}}}
    lines = [line for line in headline_lines(results) if "against the calibration" in line]
    assert len(lines) == 1 and "bpo − rloo-2x, paired by seed" in lines[0] and "-0.020, -0.010, -0.020, -0.010" in lines[0]
    assert f"{row['diff']:+.3f}" in lines[0] and "detected (p" in lines[0] and "below what halving" in lines[0]

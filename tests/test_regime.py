"""``bpo-regime`` and ``bpo-diagnose`` (docs/regime.md) on TreeMDPs, against exact values.

The diagnosis's η is checked against :func:`bpo_algos.mechanism.exact_prefix_explained` at the
depths BPO branched at (seeded; the 95% bootstrap interval misses with probability about 5%,
fixed by the seed); the broken case is the exact η at the depth it did not branch at, which the
interval must exclude.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bpo_algos.mechanism import Mechanism, exact_prefix_explained, predict_variance_ratio
from bpo_algos.policy import TabularPolicy
from bpo_envs import TreeMDPEnv
from bpo_experiments import diagnose, regime, significance

ROOT = Path(__file__).resolve().parents[1]
TREE = {"depth": 8, "n_actions": 3, "seed": 0, "decisive_levels": [1, 5], "observe": "state", "n_tasks": 6}


def test_regime_runs_a_cell_and_writes_the_map(tmp_path: Path) -> None:
    out = tmp_path / "regime"
    results = regime.main(["--cells", "horizon-6", "--seeds", "2", "--tuning-seeds", "1", "--updates", "2",
                           "--variance-batches", "3", "--predictor-seeds", "1", "--out", str(out)])
    assert (out / "regime.json").exists() and (out / "regime.png").stat().st_size > 10_000
    cell = results["cells"]["horizon-6"]
    chosen = cell["tuning"]["chosen"]
    assert chosen["bpo"].startswith("bpo") and not chosen["independent"].startswith("bpo")
    assert set(cell["tuning"]["scores"]) == set(regime.CONFIGS)
    # one tuning seed: no F-test is possible, so every kind keeps its default
    assert chosen == regime.DEFAULT_CHOICE and all(d["kept_default"] for d in cell["tuning"]["decisions"].values())
    prior = cell["prior_return"]
    for unit in ("env_steps", "flops"):
        matched = cell["matched"][unit]
        assert matched["n"] == 2 and np.isfinite(matched["diff"])
        # one cell: Holm's adjustment of a family of one is the p-value itself
        assert 0 < matched["p"] <= 1 and matched["p_holm"] == pytest.approx(matched["p"])
        assert matched["verdict"] in ("win", "loss", "tie") and matched["seeds"] == [0, 1]
        for curve in matched["mean_curve"].values():
            assert curve[0] == pytest.approx(prior)  # every run starts from the same exact value
        for spent in matched["spent_per_update"].values():
            # the budget holds within one tree's cost (a tree here costs at most 8 x 6 steps)
            amount = matched["budget"]
            per_step = spent["flops"] / spent["env_steps"]
            assert abs(spent[unit] - amount) <= 48 * (per_step if unit == "flops" else 1)
    for row in cell["variance"]["shapes"].values():
        # a measured ratio from 5 seeds, with its interval around it
        assert row["measured_ratio_seeds"] == 5 and len(row["measured_ratio_per_seed"]) == 5
        lo, hi = row["measured_ratio_ci95"]
        assert 0 < lo < row["measured_ratio"] < hi and row["mechanism"]["branch_nodes"] > 0
    assert cell["variance"]["seeds"] == {"variance": [0, 1, 2, 3, 4], "predictor": [5]}
    # the exact return variance by depth: the decision at level 4 settles most of it
    v = np.array(cell["variance_by_depth"])
    assert int(np.argmax(-np.diff(v))) == 4
    predictor = json.loads((out / "regime.json").read_text())["predictor"]
    assert predictor["n"] == len(regime.SHAPES) and predictor["seeds_per_point"] == 5 and "replication" not in results


def test_too_few_variance_seeds_is_an_error() -> None:
    with pytest.raises(SystemExit):
        regime.main(["--cells", "base", "--variance-seeds", "4"])


def test_the_replicate_runs_share_no_seed_and_the_predictor_reads_no_measured_batch() -> None:
    args = regime.argparse.Namespace(seeds=10, tuning_seeds=2, variance_seeds=5, predictor_seeds=2)
    first, second = regime.map_seeds(args, 0), regime.map_seeds(args, 1)
    assert first.evaluation == tuple(range(10))  # the unreplicated map's seeds
    assert first.tuning == (regime.tuning_seed(0), regime.tuning_seed(1))  # the key (s, tuning), no offset arithmetic
    for kind in ("evaluation", "tuning", "variance", "predictor"):
        assert not set(getattr(first, kind)) & set(getattr(second, kind)), kind
    for seeds in (first, second):
        assert len(seeds.variance) == 5 and not set(seeds.variance) & set(seeds.predictor)
        assert not set(seeds.tuning) & set(seeds.evaluation)


def test_a_later_seed_block_is_a_map_on_fresh_seeds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--seed-block 2 --replicate`` runs blocks 2 and 3: no seed of either earlier run (blocks 0
    and 1), of any kind. The broken case, a block ignored, would rerun blocks 0 and 1."""
    blocks: list[int] = []
    real = regime.map_seeds
    monkeypatch.setattr(regime, "map_seeds", lambda args, run: blocks.append(run) or real(args, run))
    monkeypatch.setattr(regime, "run_cell", lambda cell, args, configs, seeds: {"name": cell.name, "seconds": 0.0})
    monkeypatch.setattr(regime, "write", lambda *args: {"seconds": 0.0})
    monkeypatch.setattr(regime, "markdown", lambda results: "")
    regime.main(["--cells", "base", "--replicate", "--seed-block", "2", "--out", str(tmp_path)])
    assert blocks == [2, 3]
    args = regime.argparse.Namespace(seeds=24, tuning_seeds=8, variance_seeds=5, predictor_seeds=2)
    earlier = [regime.map_seeds(args, b) for b in (0, 1)]
    for block in (2, 3):
        fresh = regime.map_seeds(args, block)
        for kind in ("evaluation", "tuning", "variance", "predictor"):
            assert not set(getattr(fresh, kind)) & {s for e in earlier for s in getattr(e, kind)}, (block, kind)


def test_the_prediction_is_made_out_of_sample() -> None:
    """The predicted ratio depends only on the predictor seeds' batches: other variance seeds
    change the measured ratio and leave the prediction as it was (an in-sample predictor, fed
    the measured batches, the broken case, would move with them)."""
    cell = next(c for c in regime.cells() if c.name == "horizon-6")
    pool = regime.EnvPool([cell.make_env, cell.make_env])
    try:
        def study(variance: tuple[int, ...]) -> dict:
            seeds = regime.MapSeeds(evaluation=(0, 1), tuning=(1000,), variance=variance, predictor=(9,))
            return regime.variance_study(cell, "rloo-4", ["bpo-2x4-q0.8"], 2, pool, seeds)["shapes"]["bpo-2x4-q0.8"]

        a, b = study((0, 1)), study((10, 11))
        inside = regime.measure([batch for s in (0, 1) for batch in regime.gradient_batches(cell, "bpo-2x4-q0.8", 2, 2, pool, s)[1]])
    finally:
        pool.close()
    assert a["predicted_ratio"] == b["predicted_ratio"] and a["mechanism"] == b["mechanism"]
    assert a["measured_ratio"] != b["measured_ratio"]
    assert inside.to_json() != a["mechanism"]  # the measured seeds' own mechanism is another reading


def _cell(diff: float, p: float | None) -> dict:
    row = {"diff": diff, "diff_ci95": 0.01, "p": p}
    return {"matched": {"env_steps": dict(row), "flops": dict(row)}, "variance": {"shapes": {}}}


def test_holm_against_a_hand_computed_case() -> None:
    # sorted 0.005, 0.01, 0.03, 0.04 -> 4 x 0.005 = 0.02, 3 x 0.01 = 0.03, 2 x 0.03 = 0.06,
    # max(0.06, 1 x 0.04) = 0.06, back in the input's order
    assert significance.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # the broken cases: Bonferroni (m p) and the step-down without its running maximum
    assert significance.holm([0.01, 0.04, 0.03, 0.005]) != pytest.approx([0.04, 0.16, 0.12, 0.02])
    assert significance.holm([0.01, 0.04, 0.03, 0.005])[1] != pytest.approx(0.04)
    assert significance.holm([0.2, None, 0.9]) == [pytest.approx(0.4), None, pytest.approx(0.9)]  # None: not tested, not counted
    assert significance.holm([0.6, 0.7]) == [pytest.approx(1.0), pytest.approx(1.0)]  # capped at 1
    # the paired t-test's p: t = 2.5 / (1.291 / 2) = 3.873 on 3 degrees of freedom
    assert significance.paired_p_value([1, 2, 3, 4]) == pytest.approx(0.0305, abs=1e-4)
    assert significance.paired_p_value([1.0]) is None


def test_verdicts_are_taken_after_holm_and_the_replication_counts_agreement_and_opposites() -> None:
    # p 0.008 alone is a win; among 13 cells Holm's level for the smallest is 0.05 / 13 = 0.0038
    lone = {"a": _cell(0.005, 0.008)}
    assert regime.adjust(lone) == {"a": "win"}
    family = {"a": _cell(0.005, 0.008), **{f"t{i}": _cell(0.001, 0.5) for i in range(12)}}
    verdicts = regime.adjust(family)
    assert family["a"]["matched"]["env_steps"]["p_holm"] == pytest.approx(0.104) and verdicts["a"] == "tie"
    first = {"seeds": {"evaluation": [0, 1]}, "cells": {"w": _cell(0.01, 0.001), "l": _cell(-0.01, 0.001), "t": _cell(0.01, 0.4),
                                                          "x": _cell(0.02, 0.002)}}
    second = {"seeds": {"evaluation": [2, 3]}, "cells": {"w": _cell(0.01, 0.002), "l": _cell(0.01, 0.001), "t": _cell(-0.01, 0.3),
                                                           "x": _cell(0.02, 0.9)}}
    for run in (first, second):
        regime.adjust(run["cells"])
    rep = regime.replication([first, second])
    assert rep["verdicts"] == {"w": ["win", "win"], "l": ["loss", "win"], "t": ["tie", "tie"], "x": ["win", "tie"]}
    assert rep["agreement"] == pytest.approx(0.5) and rep["opposite"] == ["l"]
    assert [r["seeds"] for r in rep["runs"]] == [{"evaluation": [0, 1]}, {"evaluation": [2, 3]}]
    assert rep["runs"][0]["verdicts"]["l"]["p_holm"] == pytest.approx(0.004)
    with pytest.raises(ValueError, match="two runs"):
        regime.replication([first])


def test_welch_against_a_hand_computed_case_and_its_error_rate() -> None:
    """Welch's p by hand: means 3 and 7, se^2 = 2.5/5 + 14/6, t = -2.376 on 6.97 dof: p 0.0494.
    Seeded error rate, 4,000 nulls with unequal sizes (6, 30) and spreads (3, 1): Welch rejects
    at 5% within 3 SE; the broken case, Student's pooled-variance test, rejects about 4 times as
    often there (the small noisy sample's variance is diluted by the large one's)."""
    assert significance.welch_p_value([1, 2, 3, 4, 5], [2, 4, 6, 8, 10, 12]) == pytest.approx(0.0494, abs=5e-4)
    assert significance.welch_p_value([1.0], [1.0, 2.0]) is None
    rng = np.random.default_rng(7)
    trials = [(rng.normal(0, 3, 6), rng.normal(0, 1, 30)) for _ in range(4000)]
    welch = np.mean([significance.welch_p_value(a, b) < 0.05 for a, b in trials])

    def pooled_p(a: np.ndarray, b: np.ndarray) -> float:
        dof = len(a) + len(b) - 2
        s2 = ((len(a) - 1) * a.var(ddof=1) + (len(b) - 1) * b.var(ddof=1)) / dof
        t = (a.mean() - b.mean()) / np.sqrt(s2 * (1 / len(a) + 1 / len(b)))
        return 2 * (1 - significance.t_cdf(abs(t), dof))

    student = np.mean([pooled_p(a, b) < 0.05 for a, b in trials])
    se = np.sqrt(0.05 * 0.95 / len(trials))
    assert abs(welch - 0.05) < 3 * se and student > 0.05 + 10 * se, (welch, student)


def _run(per_cell: dict[str, np.ndarray], evaluation: list[int], bpo: str = "bpo-2x4-q0.95") -> dict:
    cells = {}
    for name, d in per_cell.items():
        row = {"diff": float(d.mean()), "diff_ci95": 0.0, "diff_per_seed": d.tolist(), "p": significance.paired_p_value(d)}
        cells[name] = {"matched": {"env_steps": dict(row), "flops": dict(row)}, "variance": {"shapes": {}},
                       "tuning": {"chosen": {"bpo": bpo, "independent": "rloo-4"}}}
    run = {"seeds": {"evaluation": evaluation}, "cells": cells}
    regime.adjust(run["cells"])
    return run


def test_the_replication_compares_the_runs_estimates_and_pools_them() -> None:
    """Two runs drawn from the same differences: the estimates agree in every cell and the pooled
    48 seeds see the effect at the edge of one run's power; the broken case, a second run whose
    cell moved by 0.02, is flagged inconsistent. The expected agreement is near 1 where one run
    always (or never) detects, and near 1/2 where it detects half the time."""
    rng = np.random.default_rng(3)
    truth = {"clear": -0.02, "edge": -0.006, "null": 0.0, "moved": -0.005}
    runs = [_run({c: rng.normal(m + (0.02 if (c == "moved" and r == 1) else 0.0), 0.01, 24) for c, m in truth.items()},
                 list(range(24 * r, 24 * r + 24))) for r in (0, 1)]
    rep = regime.replication(runs)
    assert {c: row["consistent"] for c, row in rep["consistency"].items()} == {"clear": True, "edge": True, "null": True, "moved": False}
    assert rep["consistent"] == pytest.approx(0.75) and rep["same_comparators"] == list(truth)
    pooled = rep["pooled"]
    assert pooled["clear"]["n"] == 48 and pooled["clear"]["verdict"] == "loss" and pooled["null"]["verdict"] == "tie"
    assert pooled["clear"]["diff"] == pytest.approx(np.mean([*runs[0]["cells"]["clear"]["matched"]["env_steps"]["diff_per_seed"],
                                                               *runs[1]["cells"]["clear"]["matched"]["env_steps"]["diff_per_seed"]]))
    # expected agreement, per cell, from the power of one 24-seed run at 0.05 / m
    level = 0.05 / 4
    one = {c: significance.power(pooled[c]["diff"], pooled[c]["sd"], 24, level) for c in truth}
    assert rep["expected_agreement"] == pytest.approx(np.mean([p * p + (1 - p) ** 2 for p in one.values()]))
    assert one["clear"] > 0.99 and 0.2 < one["edge"] < 0.8 and one["null"] < 0.2
    # a cell whose runs compared different configurations is not pooled
    runs[1]["cells"]["edge"]["tuning"]["chosen"]["bpo"] = "bpo-2x4-q0.8"
    rep = regime.replication(runs)
    assert "edge" not in rep["pooled"] and "edge" in rep["consistency"]


def test_the_committed_map_renders_to_itself(tmp_path: Path) -> None:
    """``bpo-regime --render`` on a copy of the committed map (docs/results/regime/) re-derives
    every verdict, p_holm, the replication and its estimates from the runs' cells: the same JSON.
    The broken case, a run's per-seed differences edited, moves the pooled estimate."""
    import shutil

    committed = ROOT / "docs" / "results" / "regime"
    shutil.copy(committed / "regime.json", tmp_path / "regime.json")
    results = regime.main(["--render", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "regime.json").read_text()) == json.loads((committed / "regime.json").read_text())
    assert "Pooled over both runs' seeds" in (tmp_path / "regime.md").read_text()
    edited = json.loads((tmp_path / "regime.json").read_text())
    row = edited["cells"]["base"]["matched"]["env_steps"]
    row["diff_per_seed"] = [d - 0.01 for d in row["diff_per_seed"]]
    (tmp_path / "regime.json").write_text(json.dumps(edited))
    moved = regime.render(tmp_path)["replication"]["pooled"]["base"]["diff"]
    assert moved == pytest.approx(results["replication"]["pooled"]["base"]["diff"] - 0.005)


@pytest.mark.slow
def test_regime_quick_command(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bpo_experiments.regime", "--quick", "--replicate", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((tmp_path / "regime.json").read_text())
    assert list(results["cells"]) == ["base", "decided-first", "binary"] and results["pending_cells"] == []
    assert results["predictor"]["n"] == 6 and results["predictor"]["seeds_per_point"] >= 5 and (tmp_path / "regime.png").exists()
    rep = results["replication"]
    first, second = (run["seeds"] for run in rep["runs"])
    for kind in first:
        assert not set(first[kind]) & set(second[kind])
    assert set(rep["verdicts"]) == set(results["cells"]) and 0 <= rep["agreement"] <= 1
    assert all(results["cells"][c]["matched"]["env_steps"]["p_holm"] >= results["cells"][c]["matched"]["env_steps"]["p"]
               for c in results["cells"])
    assert "Replication" in (tmp_path / "regime.md").read_text()


def test_diagnose_eta_matches_exact_on_a_tree_mdp(tmp_path: Path) -> None:
    result = diagnose.main([
        "BPO-TreeMDP-v0", "--env-kwargs", json.dumps(TREE), "--policy", "tabular-prior", "--batches", "40", "--tasks", "6",
        "--budget", "128", "--tasks-per-update", "4", "--shapes", "bpo-2x4-q0.95", "--out", str(tmp_path),
    ])
    row = result["configs"]["bpo-2x4-q0.95"]
    m = Mechanism.from_json(row["mechanism"])
    assert set(m.branch_depths) == {1, 5}  # the two decisive levels, where the prior is uniform
    exact = result["exact"]["prefix_explained"]["bpo-2x4-q0.95"]
    env = TreeMDPEnv(**{**TREE, "decisive_levels": tuple(TREE["decisive_levels"])})
    policy = TabularPolicy.from_logits(env.agent_prior())
    depths = [d for d, n in m.branch_depths.items() for _ in range(n)]
    assert exact == pytest.approx(exact_prefix_explained(env, policy, depths))
    lo, hi = m.prefix_explained_ci95
    assert lo <= exact <= hi
    # the broken case: eta as if every branch point were after the first decision
    wrong = exact_prefix_explained(env, policy, [5])
    assert not lo <= wrong <= hi
    # the prediction is the documented formula of the reported mechanism
    assert row["predicted_ratio"] == pytest.approx(predict_variance_ratio(
        m, backbones=2, branch_factor=4, group_size=4, independent_steps=8, task_share=result["task_share"],
        independent_tasks_per_update=result["configs"]["rloo-4"]["mechanism"]["tasks_per_update"],
    ))
    assert 0 < row["measured_ratio_ci95"][0] <= row["measured_ratio"] <= row["measured_ratio_ci95"][1]
    assert "Recommendation" in (tmp_path / "diagnose.md").read_text()
    # what the policy did: its mean return is the exact one over the (equally drawn) tasks
    with torch.no_grad():
        exact_return = float(np.mean([float(env.expected_return(policy.log_probs, t)) for t in range(TREE["n_tasks"])]))
        uniform = float(np.mean([float(env.expected_return(TabularPolicy().log_probs, t)) for t in range(TREE["n_tasks"])]))
    # (seeded: 0.006 off here; the uniform policy, the broken case, is 0.029 off)
    assert abs(result["configs"]["rloo-4"]["mean_return"] - exact_return) < 0.015 < abs(uniform - exact_return)
    assert result["configs"]["rloo-4"]["invalid_action_share"] == 0 and 0 <= row["success"] <= 1
    assert result["command"].startswith("bpo-diagnose BPO-TreeMDP-v0 --env-kwargs ")


def test_recommendation_rule() -> None:
    rows = {"a": {"predicted_ratio": 0.7}, "b": {"predicted_ratio": 0.95, "measured_ratio": 0.6, "measured_ratio_ci95": [0.4, 0.8]},
            "c": {"predicted_ratio": None}}
    assert diagnose.recommend(rows, ["a", "b", "c"], 0.9) == {
        "branch": True, "shape": "b", "ratio": 0.6, "basis": "measured",
        "reason": "b's measured gradient variance is 0.60x RLOO's at the same env steps (95% interval [0.40, 0.80])",
    }
    # every verdict gives its interval, or says there is none (a predicted ratio)
    assert "predicted from the mechanism, no interval" in diagnose.recommend(rows, ["a"], 0.9)["reason"]
    # the broken case: a low point estimate whose interval reaches 1 is no reason to branch
    wide = {"a": {"predicted_ratio": 1.5, "measured_ratio": 0.12, "measured_ratio_ci95": [0.0, 1.13]}}
    assert diagnose.recommend(wide, ["a"], 0.9)["branch"] is False
    assert diagnose.recommend(wide, ["a"], 0.9)["reason"].startswith("inconclusive")
    assert "95% interval [0.00, 1.13]" in diagnose.recommend(wide, ["a"], 0.9)["reason"]
    worse = {"a": {"predicted_ratio": 1.4, "measured_ratio": 2.0}}
    assert diagnose.recommend(worse, ["a"], 0.9)["branch"] is False
    assert diagnose.recommend({"a": {"predicted_ratio": None}}, ["a"], 0.9)["branch"] is False
    flat = {"a": {"predicted_ratio": None, "mechanism": {"zero_variance_groups": 1.0}}}
    assert diagnose.recommend(flat, ["a"], 0.9)["reason"].startswith("every sibling group's returns were equal")
    # a shape that never branched still has a predicted ratio (its backbones as RLOO-K0): with no
    # variance anywhere the answer is still "no gradient", not a ratio
    flat_predicted = {"a": {"predicted_ratio": 1.5, "mechanism": {"zero_variance_groups": 1.0}}}
    assert diagnose.recommend(flat_predicted, ["a"], 0.9)["reason"].startswith("every sibling group's returns were equal")


def test_llm_flags_set_the_warm_start_on_the_env_and_the_reply_format_on_the_preset() -> None:
    preset, name, setup = diagnose.find_setup("BPO-ALFWorld-v0", None)
    assert setup.sft_epochs == 10  # the scorer's warm start, which an LLM must not inherit blindly
    diagnose.apply_llm_flags(preset, setup, {"reasoning": True, "decision_entropy": "probe", "probe_samples": 3,
                                             "sft_epochs": 1, "sft_lr": 1e-4, "max_new_tokens": None})
    assert (setup.sft_epochs, setup.sft_lr, setup.max_new_tokens) == (1, 1e-4, 64)
    assert (preset.reasoning, preset.decision_entropy, preset.probe_samples) == (True, "probe", 3)
    with pytest.raises(ValueError, match="temperature"):
        diagnose.apply_llm_flags(preset, setup, {"temperature": 0.5})


def test_the_map_keeps_the_default_where_its_tuning_cannot_tell_the_candidates_apart() -> None:
    """The tuning's choice per kind (:func:`regime.choose_config`). Seeded draws, 4 tuning seeds a
    candidate: where the default equals the leaders and one candidate is clearly worse (the map's
    usual case: RLOO-8 below RLOO-4, GRPO-4, RLOO-2), the default is kept in 95% of maps (Holm's
    level; the seeds are fixed, so the test is deterministic); a candidate 0.05 above the default
    against a 0.01 spread is chosen. The broken case, the highest mean wherever the F-test
    rejects, would have switched in most of the draws."""
    rng = np.random.default_rng(0)
    kept, f_rule_switches = 0, 0
    for _ in range(40):
        draw = {c: list(0.6 + 0.01 * rng.standard_normal(4)) for c in ("rloo-2", "rloo-4", "grpo-4")}
        draw["rloo-8"] = list(0.57 + 0.01 * rng.standard_normal(4))
        decision = regime.choose_config(draw, "rloo-4")
        kept += decision["chosen"] == "rloo-4"
        f_rule_switches += decision["f_test"]["distinguishable"] and decision["best"] != "rloo-4"
        assert decision["kept_default"] == (decision["chosen"] == "rloo-4") == (not decision["vs_default"]["better"])
    assert kept >= 36 and f_rule_switches >= 20
    apart = {"rloo-2": [0.55, 0.56, 0.54, 0.55], "rloo-4": [0.60, 0.61, 0.59, 0.60], "grpo-4": [0.65, 0.66, 0.64, 0.65]}
    decision = regime.choose_config(apart, "rloo-4")
    assert decision["vs_default"]["better"] == ["grpo-4"] and decision["chosen"] == "grpo-4" and not decision["kept_default"]
    # a default that is not a candidate (a --quick grid without it): the highest mean
    assert regime.choose_config({"a": [0.1, 0.2], "b": [0.5, 0.6]}, "c")["chosen"] == "b"


def _variance_run(truth: np.ndarray, predicted: np.ndarray, rng: np.random.Generator, seeds: int = 5, noise: float = 0.4) -> dict:
    shapes = {}
    for i, (t, p) in enumerate(zip(truth, predicted, strict=True)):
        per_seed = (t * np.exp(rng.normal(0.0, noise, seeds))).tolist()
        shapes[f"shape-{i}"] = {**regime.ratio_over_seeds(per_seed), "measured_ratio_per_seed": per_seed, "predicted_ratio": float(p)}
    return {"cells": {"cell": {"variance": {"shapes": shapes}}}}


def test_the_replication_ranks_the_predictor_on_both_runs_ratios() -> None:
    """Each run's predictor against the ratios measured on both runs' variance seeds: a pooled
    ratio is the geometric mean of the ten per-seed ratios (not run 1's five: the broken case),
    and, on seeded synthetic points whose 5-seed ratios are noisy (log-sd 0.4 a seed) around a
    truth that an exact predictor gives, the pooled reading ranks better than one run's ratios and
    than the runs rank each other, over 200 draws' means (a deterministic, seeded check)."""
    rng = np.random.default_rng(11)
    truth = np.exp(np.linspace(-0.5, 0.5, 20))
    runs = [_variance_run(truth, truth, rng) for _ in range(2)]
    rep = regime.replication_predictor(runs, ["cell"])
    assert [row["seeds_per_point"] for row in rep["pooled"]] == [10, 10] and rep["pooled"][0]["out_of_sample"]
    first, second = (run["cells"]["cell"]["variance"]["shapes"]["shape-3"] for run in runs)
    both = np.log([*first["measured_ratio_per_seed"], *second["measured_ratio_per_seed"]])
    assert rep["points"][3][:4] == ["cell", "shape-3", truth[3], truth[3]]
    assert rep["points"][3][4] == pytest.approx(float(np.exp(both.mean())))
    assert rep["points"][3][4] != pytest.approx(first["measured_ratio"])
    assert rep["predicted_test_retest"]["rho"] == pytest.approx(1.0)
    pooled, one_run, retest = [], [], []
    for _ in range(200):
        runs = [_variance_run(truth, truth, rng) for _ in range(2)]
        rep = regime.replication_predictor(runs, ["cell"], n_boot=0)
        pooled.append(rep["pooled"][0]["rho"])
        one_run.append(regime.spearman(truth, [row["measured_ratio"] for row in runs[0]["cells"]["cell"]["variance"]["shapes"].values()],
                                       n_boot=0)["rho"])
        retest.append(rep["measured_test_retest"]["rho"])
    assert np.mean(pooled) > np.mean(one_run) + 0.03 and np.mean(one_run) > np.mean(retest)

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
from bpo_experiments import diagnose, regime

ROOT = Path(__file__).resolve().parents[1]
TREE = {"depth": 8, "n_actions": 3, "seed": 0, "decisive_levels": [1, 5], "observe": "state", "n_tasks": 6}


def test_regime_runs_a_cell_and_writes_the_map(tmp_path: Path) -> None:
    out = tmp_path / "regime"
    results = regime.main(["--cells", "horizon-6", "--seeds", "2", "--tuning-seeds", "1", "--updates", "2",
                           "--variance-batches", "4", "--out", str(out)])
    assert (out / "regime.json").exists() and (out / "regime.png").stat().st_size > 10_000
    cell = results["cells"]["horizon-6"]
    chosen = cell["tuning"]["chosen"]
    assert chosen["bpo"].startswith("bpo") and not chosen["independent"].startswith("bpo")
    assert set(cell["tuning"]["scores"]) == set(regime.CONFIGS)
    prior = cell["prior_return"]
    for unit in ("env_steps", "flops"):
        matched = cell["matched"][unit]
        assert matched["n"] == 2 and np.isfinite(matched["diff"])
        for curve in matched["mean_curve"].values():
            assert curve[0] == pytest.approx(prior)  # every run starts from the same exact value
        for spent in matched["spent_per_update"].values():
            # the budget holds within one tree's cost (a tree here costs at most 8 x 6 steps)
            amount = matched["budget"]
            per_step = spent["flops"] / spent["env_steps"]
            assert abs(spent[unit] - amount) <= 48 * (per_step if unit == "flops" else 1)
    for row in cell["variance"]["shapes"].values():
        assert row["measured_ratio"] > 0 and row["mechanism"]["branch_nodes"] > 0
    # the exact return variance by depth: the decision at level 4 settles most of it
    v = np.array(cell["variance_by_depth"])
    assert int(np.argmax(-np.diff(v))) == 4
    assert json.loads((out / "regime.json").read_text())["predictor"]["n"] == len(regime.SHAPES)


@pytest.mark.slow
def test_regime_quick_command(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bpo_experiments.regime", "--quick", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((tmp_path / "regime.json").read_text())
    assert list(results["cells"]) == ["base", "decided-first", "binary"]
    assert results["predictor"]["n"] == 6 and (tmp_path / "regime.png").exists()


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

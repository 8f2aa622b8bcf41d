"""bpo-compare end to end on a small TreeMDP: outputs, matched budgets, resume."""

from __future__ import annotations

import json
import shutil

import pytest

from bpo_experiments import compare
from bpo_experiments.presets import PRESETS, Preset
from bpo_experiments.tasks import task_split

ARGS = ["--envs", "treemdp", "--seeds", "0", "1", "--updates", "3", "--budget", "200", "--grad-batches", "3", "--no-progress", "--jobs", "1"]


def test_compare_writes_results_and_resumes(tmp_path):
    out = tmp_path / "cmp"
    results = compare.main(["--smoke", "--out", str(out), *ARGS])
    names = ("bpo", "grpo", "rloo", "frozen", "reinforce", "rloo-2x")
    assert set(results["algorithms"]) == set(names)
    saved = json.loads((out / "results.json").read_text())
    assert saved["budget_unit"] == "env_steps" and saved["seeds"] == [0, 1] and saved["envs"] == ["treemdp"]
    for row in saved["algorithms"].values():
        assert 0.0 <= row["success"] <= 1.0 and 0.0 <= row["auc"] <= 1.0
        assert "env_steps" in row["compute"] and "flops" in row["compute"]
    per_env = saved["per_env"]["treemdp"]["algorithms"]
    for a in names:
        assert len(per_env[a]["curve"]) == 3
        # evaluated at update 0 (the warm start: the same for every algorithm of a seed) and along training
        curve = per_env[a]["eval_curve"]
        assert curve["updates"] == [0, 2, 3] and curve["success_per_seed"][0][0] == per_env["rloo"]["eval_curve"]["success_per_seed"][0][0]
    used = [per_env[a]["compute"]["env_steps"] for a in names if a != "rloo-2x"]
    assert max(used) / min(used) < 1.25  # the same budget per update
    # the calibration control spends twice the budget per update, by design
    assert 1.75 < per_env["rloo-2x"]["compute"]["env_steps"] / per_env["rloo"]["compute"]["env_steps"] < 2.25
    assert (out / "results.md").read_text().startswith("# BPO vs GRPO vs RLOO vs FROZEN vs REINFORCE vs RLOO-2X")
    for picture in ("success.png", "final_success.png", "gradient_snr.png", "training_success.png", "grad_norm_variance.png"):
        assert (out / picture).read_bytes().startswith(b"\x89PNG")
    # one example tree per env and algorithm, linked from results.md
    assert saved["example_trees"] == {"treemdp": {a: f"trees/treemdp-{a}.png" for a in names}}
    assert all((out / "trees" / f"treemdp-{a}.png").read_bytes().startswith(b"\x89PNG") for a in names)
    assert "[bpo](trees/treemdp-bpo.png)" in (out / "results.md").read_text()

    # an interrupted run: one run lost its result and the aggregate was never written
    shutil.rmtree(out / "runs" / "treemdp" / "rloo" / "seed1")
    (out / "results.json").unlink()
    with pytest.raises(SystemExit, match="--resume"):
        compare.main(["--smoke", "--out", str(out), *ARGS])
    resumed = compare.main(["--smoke", "--out", str(out), "--resume", *ARGS])
    assert resumed["per_env"]["treemdp"]["algorithms"]["bpo"] == results["per_env"]["treemdp"]["algorithms"]["bpo"]
    assert resumed["per_env"]["treemdp"]["algorithms"]["rloo"]["curve"] == results["per_env"]["treemdp"]["algorithms"]["rloo"]["curve"]

    # the same setting on other data (here: as if the env's data had changed) is refused
    data = json.loads((out / "data.json").read_text())
    data["treemdp"]["train"]["tasks_used"] += 1
    (out / "data.json").write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="other data for treemdp"):
        compare.main(["--smoke", "--out", str(out), "--resume", *ARGS])


def test_compare_rejects_unknown_env(tmp_path):
    with pytest.raises(SystemExit, match="unknown env"):
        compare.main(["--smoke", "--out", str(tmp_path / "x"), "--envs", "atari"])


def test_compare_scorer_on_webshop_pairs_seeds_and_keeps_per_env_settings(tmp_path):
    """The CPU default's path: the text scorer warm-started from WebShop's expert."""
    out = tmp_path / "ws"
    args = ["--smoke", "--out", str(out), "--envs", "webshop", "--seeds", "0", "1", "--updates", "2", "--no-progress", "--jobs", "1",
            "--algorithms", "bpo", "grpo", "rloo"]
    results = compare.main(args)
    env = results["per_env"]["webshop"]
    assert env["seeds"] == [0, 1] and env["eval_split"] == "test"
    # the standard test goals (0-499), disjoint from the train split's; the data is named
    data = env["data"]
    assert data["train"]["split"] == "train" and data["eval"]["split"] == "test"
    assert data["train"]["data_source"] == "bundled-generator" and data["eval"]["task_count"] == 500
    assert data["train"]["search_actions"] == "instruction" and data["eval"]["tasks_used"] == 8
    train_tasks, eval_tasks = task_split(PRESETS["smoke"].envs["webshop"])
    assert all(t < 500 for t in eval_tasks) and all(t >= 1500 for t in train_tasks)
    assert "Data: bundled generator `bpo_envs.webshop.generator`" in (out / "results.md").read_text()
    assert "`test` tasks" in (out / "results.md").read_text()
    # the headline: the treatment minus the comparator fixed in advance, paired by seed
    head = env["treatment_vs_comparator"]
    assert head["comparator"] == "rloo" and head["metric"] == "auc" and len(head["diff_per_seed"]) == 2
    auc = {a: env["algorithms"][a]["metrics"]["auc"]["per_seed"] for a in ("bpo", "rloo")}
    assert head["diff_per_seed"] == pytest.approx([b - r for b, r in zip(auc["bpo"], auc["rloo"], strict=True)])
    assert set(head["metrics"]) == {"auc", "final", "compute_to_threshold"} and "mde" in head
    # the post-hoc figure stays, labelled as chosen after the results
    paired = env["treatment_vs_best_baseline"]
    assert paired["best_baseline"] in ("grpo", "rloo") and paired["chosen_after_the_results"]
    best = env["algorithms"][paired["best_baseline"]]
    expected = [b - g for b, g in zip(env["algorithms"]["bpo"]["success_per_seed"], best["success_per_seed"], strict=True)]
    assert paired["success_diff_per_seed"] == pytest.approx(expected)
    text = (out / "results.md").read_text()
    assert "paired by seed" in text and text.index("## Controls") < text.index("## Headline")
    for a in ("bpo", "grpo", "rloo"):
        assert len(env["algorithms"][a]["curve"]) == 2


def test_preset_fields_per_env():
    preset = PRESETS["cpu"]
    import copy

    per_env = copy.deepcopy(preset)
    per_env.envs["alfworld"].trainer = {"updates": 12}
    from bpo_experiments.presets import EnvSetup
    from bpo_experiments.run_config import env_config

    assert env_config(per_env, "webshop").trainer.updates == preset.trainer.updates and env_config(per_env, "alfworld").trainer.updates == 12
    assert env_config(preset, "webshop").seeds != env_config(preset, "alfworld").seeds
    assert "seeds" not in Preset.__dataclass_fields__ and EnvSetup("BPO-SWEBench-v0").seeds == (0, 1, 2)  # each env's own field
    assert preset.envs["alfworld"].eval_split == "valid_seen" and preset.envs["webshop"].eval_split == "test"


def test_missing_logger_fails_before_training(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(SystemExit, match="pip install wandb"):
        compare.main(["--smoke", "--out", str(tmp_path / "w"), "--wandb-project", "bpo"])
    assert not (tmp_path / "w" / "runs").exists()


def test_no_silent_budget_fallback(tmp_path):
    # the cpu preset has no budget for SWE-bench: an error naming it, not the GPU preset's number
    with pytest.raises(SystemExit, match=r"swebench.*--budget"):
        compare.main(["--out", str(tmp_path / "a"), "--envs", "webshop", "swebench"])
    # budgets in another unit than the one chosen
    with pytest.raises(SystemExit, match="give --budget in gen_tokens"):
        compare.main(["--smoke", "--out", str(tmp_path / "b"), "--budget-unit", "gen_tokens"])


def test_evaluation_set_must_be_held_out_and_non_empty():
    setup = PRESETS["smoke"].envs["treemdp"]
    import dataclasses

    with pytest.raises(ValueError, match="10000 training tasks asked, but the training env has 12"):
        task_split(dataclasses.replace(setup, train_tasks=10_000))  # a task set smaller than asked
    with pytest.raises(ValueError, match="no held-out evaluation task"):
        task_split(dataclasses.replace(setup, train_tasks=12))
    train, held_out = task_split(setup)
    assert held_out and not set(train) & set(held_out)


def test_evaluation_uses_common_random_numbers():
    import gymnasium as gym

    from bpo_algos import EnvPool, TabularPolicy
    from bpo_experiments.evaluation import evaluate

    pool = EnvPool([lambda: gym.make("BPO-TreeMDP-v0", depth=4, n_actions=3, seed=1, n_tasks=4)])
    a, b = TabularPolicy(seed=1), TabularPolicy(seed=2)
    b.sample([("x", ("a0", "a1"))], 7, None)  # another RNG position: must not matter
    state = b.rng_state()
    assert evaluate(a, pool, [0, 1, 2, 3], 3, seed=5) == evaluate(b, pool, [0, 1, 2, 3], 3, seed=5)
    assert b.rng_state() == state  # the training sampler is left where it was
    with pytest.raises(ValueError, match="no evaluation tasks"):
        evaluate(a, pool, [], 3, seed=5)


def test_results_show_every_meter(tmp_path):
    out = tmp_path / "m"
    compare.main(["--smoke", "--out", str(out), "--envs", "treemdp", "--seeds", "0", "--updates", "1", "--budget", "100", "--grad-batches", "2",
                  "--no-progress", "--jobs", "1"])
    from bpo_algos import COMPUTE_UNITS

    text = (out / "results.md").read_text()
    saved = json.loads((out / "results.json").read_text())
    for unit in COMPUTE_UNITS:
        assert unit.replace("_", " ") in text
        assert all(unit in row["compute"] for row in saved["per_env"]["treemdp"]["algorithms"].values())

"""Tuning fixed in advance (docs/main-job.md, "Tuning"): disjoint seeds, equal grids, a criterion
that never reads an evaluation task, bad settings refused before any run, the choice recorded and used."""

from __future__ import annotations

import json

import pytest

from bpo_experiments import compare
from bpo_experiments.plan import extra_runs
from bpo_experiments.presets import PRESETS
from bpo_experiments.tasks import task_order, task_split
from bpo_experiments.tuning import choose, tuning_tasks


def _preset(*argv: str):
    parser = compare.command_parser()
    holders = compare.add_config_flags(parser)
    return compare.build_preset(parser.parse_args(["--smoke", *argv]), holders)


@pytest.mark.parametrize("argv, message", [
    (["--tuning-seeds", "1"], "also evaluation seeds"),
    (["--tuning-grid", "rloo=[]"], "is empty"),
    (["--tuning-grid", 'rloo=[{"group_size": 2}]'], "different sizes"),
    (["--tuning-grid", 'rloo=[{"groupsize": 2}, {"group_size": 4}]'], "not RLOOOptions fields"),
    (["--tuning-grid", 'rloo=[{"group_size": 0}, {"group_size": 4}]'], "group_size"),
    (["--no-tune", "--tuning-seeds", "7"], "choose one"),
    (["--algorithms", "bpo", "rloo", "gigpo", "--tuning-grid", 'gigpo=[]'], "is empty"),
    (["--algorithms", "bpo", "rloo", "tree-grpo"], "would run untuned"),
])
def test_a_bad_tuning_setting_is_an_error_before_any_run(tmp_path, argv, message):
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=message):
        compare.main(["--smoke", "--no-progress", "--out", str(out), *argv])
    assert not out.exists()


def test_unequal_grids_need_the_flag_and_no_tune_turns_tuning_off():
    preset = _preset("--tuning-grid", 'rloo=[{"group_size": 2}]', "--allow-unequal-grids")
    assert preset.tuning.grids["rloo"] == ({"group_size": 2},) and len(preset.tuning.grids["bpo"]) == 2
    assert _preset("--no-tune").tuning is None
    assert _preset().tuning.seeds == (1000,)  # the smoke preset tunes by default
    assert _preset("--tune", "--tuning-seeds", "50", "51").tuning.seeds == (50, 51)
    # the smoke preset tunes TreeMDP only: a comparison without it runs, untuned
    assert _preset("--envs", "webshop").tuning.envs == ("treemdp",)


@pytest.mark.parametrize("preset_name, env", [("smoke", "treemdp"), ("smoke", "webshop"), ("cpu", "webshop")])
def test_the_criterion_reads_held_out_training_tasks_never_evaluation_tasks(preset_name, env):
    setup = PRESETS[preset_name].envs[env]
    train, evaluation = task_split(setup)
    held_out = tuning_tasks(task_order(setup), train, evaluation, 64)
    assert held_out and not set(map(repr, held_out)) & set(map(repr, evaluation))
    assert not set(map(repr, held_out)) & set(map(repr, train))
    assert set(held_out) <= set(task_order(setup))  # tasks of the training env
    # broken case: nothing is held out once training and evaluation take every task
    with pytest.raises(ValueError, match="no held-out training task"):
        tuning_tasks(list(range(8)), list(range(4)), list(range(4, 8)), 4)


def test_the_highest_mean_over_tuning_seeds_is_chosen_the_first_on_a_tie():
    assert choose([[0.2, 0.4], [0.5, 0.1], [0.3, 0.35]]) == (2, [pytest.approx(0.3), pytest.approx(0.3), pytest.approx(0.325)])
    assert choose([[0.5], [0.5]])[0] == 0


def test_plan_counts_the_tuning_runs():
    cpu = PRESETS["cpu"]
    extra = extra_runs(cpu, "webshop")
    assert len(extra["tuning"]) == 2 * 4 * 2  # (bpo, rloo) x 4 candidates x 2 tuning seeds
    assert sorted(set(extra["tuning"])) == ["bpo", "rloo"]
    assert len(extra["defaults"]) == 2 * 10  # the treatment and the comparator on the first 10 seeds
    assert extra_runs(cpu, "alfworld") == {"tuning": [], "defaults": []}  # the cpu preset tunes WebShop only


@pytest.mark.slow
def test_a_tuned_comparison_records_its_choice_and_uses_it(tmp_path):
    out = tmp_path / "tuned"
    results = compare.main(["--smoke", "--envs", "treemdp", "--updates", "2", "--no-progress", "--jobs", "1", "--out", str(out),
                            "--tuning-grid", 'rloo=[{"group_size": 2}, {"group_size": 8}]'])
    er = results["per_env"]["treemdp"]
    tuning = er["tuning"]
    assert set(tuning) == {"bpo", "grpo", "rloo"}
    for record in tuning.values():
        assert {"candidates", "scores", "chosen", "seeds"} <= set(record) and record["seeds"] == [1000]
        assert record["chosen"] == record["candidates"][record["chosen_index"]]
        assert record["scores"][record["chosen_index"]] == max(record["scores"])
    runs = out / "runs" / "treemdp"
    chosen = tuning["rloo"]["chosen"]["group_size"]
    for name in ("rloo", "frozen", "rloo-2x"):  # the controls collect as the tuned RLOO
        assert json.loads((runs / name / "seed0" / "run.json").read_text())["options"]["group_size"] == chosen
    assert json.loads((runs / "rloo@default" / "seed0" / "run.json").read_text())["options"]["group_size"] == 8
    # the tuning seed's warm start is evaluated on the 4 held-out training tasks, the evaluation seeds' on the 4 evaluation tasks
    assert json.loads((runs / "_initial" / "seed1000" / "initial.json").read_text())["episodes"] == 4
    assert "defaults_vs_comparator" in er and "calibration" in er and "mechanism" in er
    assert "## Tuning" in (out / "results.md").read_text()

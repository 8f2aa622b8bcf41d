"""Tuning fixed in advance (docs/main-job.md, "Tuning"): disjoint seeds, equal grids, a criterion
that never reads an evaluation task, bad settings refused before any run, the choice recorded and used."""

from __future__ import annotations

import json

import numpy as np
import pytest

from baselines.rloo import RLOOOptions
from bpo_algos.bpo import BPOOptions
from bpo_experiments import compare
from bpo_experiments.plan import extra_runs
from bpo_experiments.presets import PRESETS
from bpo_experiments.run_config import base_options, comparison_config
from bpo_experiments.significance import one_way_anova
from bpo_experiments.tasks import task_order, task_split
from bpo_experiments.tuning import choose, decide, default_candidate, tuning_tasks


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


def test_the_f_test_across_candidates_against_a_hand_computed_case():
    # means 2, 3, 6 (grand 11/3): SSB = 3 (25/9 + 4/9 + 49/9) = 26, SSW = 6 -> F = (26/2) / (6/6) = 13 on (2, 6);
    # for 2 degrees of freedom between, P(F > x) = (1 + 2 x / 6)^-3
    test = one_way_anova([[1, 2, 3], [2, 3, 4], [5, 6, 7]])
    assert test["F"] == pytest.approx(13.0) and test["dof"] == [2, 6]
    assert test["p"] == pytest.approx((1 + 26 / 6) ** -3) and test["distinguishable"]
    # the smallest detectable difference of two means of 3: (t_0.975,6 + t_0.8,6) sqrt(MSW 2/3) = (2.447 + 0.906) 0.816
    assert test["detectable_difference"] == pytest.approx((2.4469 + 0.9057) * (2 / 3) ** 0.5, rel=1e-3)
    # one seed a candidate: nothing to test (no spread within a candidate)
    lone = one_way_anova([[0.2], [0.3]])
    assert lone["p"] is None and lone["detectable_difference"] is None and not lone["distinguishable"]


RLOO_GRID = tuple({"group_size": n} for n in (2, 4, 8, 16))


def test_a_tuning_that_tells_the_candidates_apart_chooses_the_best():
    scores = [[0.30, 0.31, 0.29], [0.40, 0.41, 0.39], [0.20, 0.21, 0.19], [0.35, 0.36, 0.34]]
    record = decide(scores, RLOO_GRID, RLOOOptions(group_size=2))
    assert record["distinguishable"] and not record["kept_defaults"]
    assert record["chosen"] == {"group_size": 4} and record["chosen_index"] == record["best_index"] == 1
    assert record["f_test"]["p"] < 1e-6 and record["detectable_difference"] < 0.05 and "beats the defaults" in record["decision"]
    assert record["vs_default"]["better"] == [1, 3]  # group 16 beats group 2 too; the higher mean is chosen
    # the defaults the best: nothing beats them, so they stay (though the candidates differ)
    kept = decide(scores, RLOO_GRID, RLOOOptions(group_size=4))
    assert kept["kept_defaults"] and kept["chosen_index"] == 1 and kept["f_test"]["distinguishable"]
    # defaults outside the grid: the F-test decides
    outside = decide(scores, RLOO_GRID, RLOOOptions(group_size=6))
    assert not outside["kept_defaults"] and outside["chosen_index"] == 1 and "differ" in outside["decision"]


def test_one_clearly_worse_candidate_does_not_switch_away_from_near_equal_defaults():
    # the regime map's case: three near-equal leaders and one clearly worse candidate. The F-test
    # rejects (the worse one differs), yet no candidate beats the defaults: they are kept. The
    # broken case, switching on the F-test to the highest mean, picks group 2 (0.0012 above the
    # defaults, a fifth of the within-candidate spread)
    scores = [[0.6410, 0.6519, 0.6371, 0.6458], [0.6400, 0.6507, 0.6362, 0.6441],
              [0.6206, 0.6298, 0.6141, 0.6225], [0.6402, 0.6511, 0.6368, 0.6446]]
    record = decide(scores, RLOO_GRID, RLOOOptions(group_size=4))
    assert record["f_test"]["p"] < 0.05 and record["best_index"] == 0
    assert record["kept_defaults"] and record["chosen"] == {"group_size": 4}
    assert "could not be told apart from the defaults" in record["decision"]
    assert all(r["p_holm"] >= 0.05 for r in record["vs_default"]["comparisons"] if r["diff"] > 0)


def test_the_rule_switches_away_from_defaults_no_worse_than_the_rest_at_most_at_its_level():
    """Seeded: 400 tunings where the defaults equal two other candidates and a fourth is clearly
    worse (0.03 below, spread 0.01 within), at 2 and 4 tuning seeds. Holm keeps the family-wise
    error at alpha = 0.05: the defaults are left in at most 5% of tunings plus three binomial
    standard errors (a fixed seed, so deterministic). The broken case, switching on the F-test to
    the highest mean, leaves them in about two tunings of three at 4 seeds (the F-test rejects
    almost always, and the highest of three equal leaders is another one)."""
    rng = np.random.default_rng(7)
    shift = np.array([[0.0], [0.0], [-0.03], [0.0]])
    for seeds in (2, 4):
        draws = [0.5 + shift + 0.01 * rng.standard_normal((4, seeds)) for _ in range(400)]
        switched = sum(not decide(list(d), RLOO_GRID, RLOOOptions(group_size=4))["kept_defaults"] for d in draws)
        assert switched / 400 <= 0.05 + 3 * (0.05 * 0.95 / 400) ** 0.5, (seeds, switched)
        f_rule = sum(one_way_anova(list(d))["distinguishable"] and choose(list(d))[0] != 1 for d in draws)
        if seeds == 4:
            assert f_rule / 400 > 0.5, f_rule


def test_the_committed_defaults_tuning_is_chosen_the_same_by_this_rule():
    # docs/results/compare-cpu-default/results.json was tuned with the F-test rule: its recorded
    # scores give the same choices under this one, so its runs (and every figure) stand
    import json
    from pathlib import Path

    from bpo_experiments.tuning import DEFAULT_GRIDS

    results = json.loads((Path(__file__).parents[1] / "docs/results/compare-cpu-default/results.json").read_text())
    tuning = results["per_env"]["webshop"]["tuning"]
    for kind, record in tuning.items():
        again = decide(record["scores_per_seed"], record["candidates"], base_options(PRESETS["cpu"], "webshop", kind))
        assert again["chosen_index"] == record["chosen_index"] and again["chosen"] == record["chosen"], kind
    assert tuning["rloo"]["chosen"] == {"group_size": 8} and tuning["bpo"]["kept_defaults"]
    assert [dict(c) for c in DEFAULT_GRIDS["rloo"]] == tuning["rloo"]["candidates"]


def test_a_tuning_that_cannot_tell_the_candidates_apart_keeps_the_defaults():
    # two seeds of noise (spread 0.010 between means, about 0.015 within): what the CPU default's tuning saw
    scores = [[0.410, 0.440], [0.436, 0.432], [0.420, 0.436], [0.418, 0.430]]
    record = decide(scores, RLOO_GRID, RLOOOptions(group_size=8))
    assert not record["distinguishable"] and record["kept_defaults"] and record["f_test"]["p"] > 0.05
    assert record["chosen"] == {"group_size": 8} and record["chosen_index"] == 2
    assert record["detectable_difference"] > record["f_test"]["spread"]
    assert "could not be told apart" in record["decision"] and "defaults are kept" in record["decision"]
    # the broken case: choosing the highest mean regardless picks the noise (group 4, 0.009 above the defaults)
    assert record["best_index"] == choose(scores)[0] == 1 and RLOO_GRID[1] != record["chosen"]
    # defaults outside the grid: kept as they are, with no index
    outside = decide(scores, RLOO_GRID, RLOOOptions(group_size=6))
    assert outside["chosen"] == {"group_size": 6} and outside["chosen_index"] is None
    # one tuning seed: no test is possible, so no choice is made
    single = decide([[0.4], [0.5], [0.3], [0.45]], RLOO_GRID, RLOOOptions(group_size=8))
    assert single["kept_defaults"] and "no test" in single["decision"] and single["chosen"] == {"group_size": 8}
    # defaults equal to a candidate that names only some fields: that candidate, as the grid writes it
    grid = ({"backbones": 2, "branch_factor": 4}, {"backbones": 2, "branch_factor": 2, "max_branch_points": 2, "max_depth": 2})
    nested = decide([[0.4], [0.5]], grid, BPOOptions(backbones=2, branch_factor=4, max_branch_points=1, max_depth=1))
    assert nested["chosen"] == grid[0] and nested["chosen_index"] == 0


def test_the_defaults_as_a_candidate_read_every_tuned_field():
    grid = ({"backbones": 2, "branch_factor": 4}, {"backbones": 2, "branch_factor": 2, "max_depth": 2})
    assert default_candidate(BPOOptions(), grid) == {"backbones": BPOOptions().backbones, "branch_factor": BPOOptions().branch_factor,
                                                     "max_depth": BPOOptions().max_depth}


def test_plan_counts_the_tuning_runs():
    cpu = comparison_config(PRESETS["cpu"])
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
        assert {"candidates", "scores", "chosen", "seeds", "f_test", "detectable_difference"} <= set(record)
        assert record["seeds"] == [1000]
        # one tuning seed: no F-test is possible, so the defaults are kept (and the report says so)
        assert record["kept_defaults"] and record["f_test"]["p"] is None
        assert record["chosen"] == record["candidates"][record["chosen_index"]]
    runs = out / "runs" / "treemdp"
    chosen = tuning["rloo"]["chosen"]["group_size"]
    for name in ("rloo", "frozen", "rloo-2x"):  # the controls collect as the tuned RLOO
        assert json.loads((runs / name / "seed0" / "run.json").read_text())["options"]["group_size"] == chosen
    # the kept default is the tuned run itself: its secondary row reuses it
    assert chosen == 8 and "rloo@default" in er["algorithms"] and not (runs / "rloo@default").exists()
    # the tuning seed's warm start is evaluated on the 4 held-out training tasks, the evaluation seeds' on the 4 evaluation tasks
    assert json.loads((runs / "_initial" / "seed1000" / "initial.json").read_text())["episodes"] == 4
    assert "defaults_vs_comparator" in er and "calibration" in er and "mechanism" in er
    assert "## Tuning" in (out / "results.md").read_text() and "the defaults are kept" in (out / "results.md").read_text()


def test_the_report_says_when_the_tuning_kept_the_defaults():
    from bpo_experiments.report import tuning_lines

    scores = [[0.410, 0.440], [0.436, 0.432], [0.420, 0.436], [0.418, 0.430]]
    record = {"candidates": list(RLOO_GRID), "scores_per_seed": scores, "seeds": [1000, 1001], "criterion": "auc",
              **decide(scores, RLOO_GRID, RLOOOptions(group_size=8))}
    text = "\n".join(tuning_lines({"per_env": {"webshop": {"tuning": {"rloo": record}}}}))
    assert "could not be told apart" in text and "the defaults are kept" in text
    assert "| rloo | group_size=8 | 0.428 | 0.420, 0.436 | **chosen** (defaults kept) |" in text
    assert "| rloo | group_size=4 | 0.434 | 0.436, 0.432 |  |" in text  # the noisy best is not marked chosen

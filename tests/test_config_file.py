"""``bpo-compare --config FILE.yaml``: every setting from a file, the flags over it, ``config.yaml``
in every results folder that runs the comparison again, and a user's option pinned on a tuned env
(docs/main-job.md, "The configuration file")."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import yaml

from baselines.rloo import RLOOOptions
from bpo_experiments import compare
from bpo_experiments.config import CompareConfig, config_yaml, settings_from_data
from bpo_experiments.output import check_same_settings
from bpo_experiments.presets import PRESETS, EnvSetup, preset_dict


def _parse(*argv: str):
    parser = compare.command_parser()
    holders = compare.add_config_flags(parser)
    return compare.build_preset(parser.parse_args(list(argv)), holders)


def _write(path, data) -> str:
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_survives_its_config_yaml(name):
    text = config_yaml(CompareConfig(name, copy.deepcopy(PRESETS[name])))
    data = yaml.safe_load(text)
    assert data["preset"] == name and data["import"] == []
    loaded = settings_from_data({k: v for k, v in data.items() if k not in ("preset", "import")}, PRESETS[name])
    assert preset_dict(loaded) == preset_dict(PRESETS[name])
    assert type(loaded.options.get("rloo") or loaded.shared) is type(PRESETS[name].options.get("rloo") or PRESETS[name].shared)
    # read over another base, the whole file still says everything (but which envs: a file names its own)
    other = settings_from_data({k: v for k, v in data.items() if k not in ("preset", "import")}, PRESETS["smoke"])
    assert preset_dict(other) == preset_dict(PRESETS[name])


def test_the_file_sets_what_it_names_and_the_flags_override_it(tmp_path):
    path = _write(tmp_path / "c.yaml", {"preset": "smoke", "envs": ["treemdp"], "seeds": [0], "trainer": {"updates": 3},
                                        "options": {"rloo": {"baseline": "anchored"}}, "tuning": None})
    preset = _parse("--config", path)
    assert list(preset.envs) == ["treemdp"] and preset.envs["treemdp"].seeds == (0,) and preset.tuning is None
    assert preset.trainer.updates == 3 and preset.trainer.learning_rate == PRESETS["smoke"].trainer.learning_rate  # merged field by field
    assert preset.options["rloo"].baseline == "anchored" and preset.options["rloo"].group_size == RLOOOptions().group_size
    flagged = _parse("--config", path, "--seeds", "0", "1", "--updates", "5", "--rloo.baseline", "trajectory")
    assert flagged.envs["treemdp"].seeds == (0, 1) and flagged.trainer.updates == 5 and flagged.options["rloo"].baseline == "trajectory"


def test_a_file_of_an_earlier_version_with_per_env_settings_at_the_top_is_converted(tmp_path):
    # before each env held its own seeds, evaluation and probes, a file wrote each as a preset
    # field: one value for every env, or {env: value} (an env it did not name: the default)
    path = _write(tmp_path / "old.yaml", {"preset": "smoke", "seeds": {"treemdp": [5, 6]}, "eval_episodes": 3,
                                          "envs": {"treemdp": {}, "webshop": {"eval_episodes": 2}}})
    preset = _parse("--config", path)
    treemdp, webshop = preset.envs["treemdp"], preset.envs["webshop"]
    assert treemdp.seeds == (5, 6) and webshop.seeds == EnvSetup("BPO-WebShop-v0").seeds  # not named: the default
    assert treemdp.eval_episodes == 3 and webshop.eval_episodes == 2  # an env's own value wins over the top's
    data = yaml.safe_load(config_yaml(CompareConfig("smoke", preset)))  # written again in this version's form
    assert "seeds" not in data and data["envs"]["treemdp"]["seeds"] == [5, 6] and data["envs"]["webshop"]["eval_episodes"] == 2
    with pytest.raises(SystemExit, match=r"\['seedz'\] are not settings"):  # the broken case: no such setting anywhere
        _parse("--config", _write(tmp_path / "bad.yaml", {"preset": "smoke", "seedz": {"treemdp": [5]}}))


def test_budgets_of_an_earlier_version_a_preset_field_per_env_are_read_as_each_envs(tmp_path):
    # before each env held its budget (EnvSetup.budget), a file and preset.json wrote
    # {env: budget} at the top: read as each env's, written again under its env
    path = _write(tmp_path / "old.yaml", {"preset": "smoke", "budget": {"treemdp": 64, "webshop": 32}})
    preset = _parse("--config", path)
    assert (preset.envs["treemdp"].budget, preset.envs["webshop"].budget) == (64, 32)
    data = yaml.safe_load(config_yaml(CompareConfig("smoke", preset)))
    assert "budget" not in data and data["envs"]["treemdp"]["budget"] == 64 and data["envs"]["webshop"]["budget"] == 32
    # a folder whose preset.json kept the budgets at the top resumes; another budget is another setting
    current = _parse("--smoke")
    saved = preset_dict(current)
    saved["budget"] = {name: setup.pop("budget") for name, setup in saved["envs"].items()}
    check_same_settings(tmp_path, current, saved)
    saved["budget"]["webshop"] = 64
    with pytest.raises(SystemExit, match="setting for webshop .*differs in: budget"):
        check_same_settings(tmp_path, current, saved)
    assert [setup.budget for setup in current.envs.values()] == [128, 128]  # the smoke preset's, one for every env


@pytest.mark.parametrize("data, message", [
    ({"preset": "smoke", "seedz": [0]}, r"\['seedz'\] are not settings"),
    ({"preset": "smoke", "trainer": {"update": 3}}, r"trainer: \['update'\] are not TrainerConfig fields"),
    ({"preset": "smoke", "trainer": {"seed": 3}}, r"trainer: \['seed'\] are set per run"),
    ({"preset": "smoke", "options": {"rlooo": {"group_size": 2}}}, "no algorithm kind"),
    ({"preset": "smoke", "envs": ["atari"]}, "not envs of the base preset"),
    ({"preset": "nope"}, "preset 'nope'"),
    ({"preset": "smoke", "tuning": {"pinned": {"rloo": {"groupsize": 2}}}}, "not RLOOOptions fields"),
    (["a", "list"], "a mapping of settings"),
])
def test_a_bad_file_is_a_clear_error_before_any_run(tmp_path, data, message):
    path = _write(tmp_path / "c.yaml", data)
    with pytest.raises(SystemExit, match=message):
        compare.main(["--config", path, "--out", str(tmp_path / "out"), "--no-progress"])
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_flag_naming_another_base_preset_than_the_file_is_refused(tmp_path):
    path = _write(tmp_path / "c.yaml", {"preset": "cpu-tabular"})
    with pytest.raises(SystemExit, match="choose one"):
        _parse("--config", path, "--smoke")
    assert list(_parse("--config", path).envs) == ["treemdp", "webshop"]
    (tmp_path / "bad.yaml").write_text("seeds: [0, 1\n")
    with pytest.raises(SystemExit, match="not YAML"):
        _parse("--config", str(tmp_path / "bad.yaml"))


def test_a_users_option_on_a_tuned_env_is_pinned_and_tuning_tunes_the_rest():
    # the broken case first: without the flags the smoke preset tunes group size and branch factor
    free = _parse("--smoke").tuning
    assert free.pinned == {} and free.grid("rloo") == ({"group_size": 4}, {"group_size": 8})
    preset = _parse("--smoke", "--rloo.group-size", "2", "--bpo.branch-factor", "2")
    tuning = preset.tuning
    assert tuning.pinned == {"rloo": {"group_size": 2}, "bpo": {"branch_factor": 2}}
    assert tuning.grid("rloo") == ({},)  # every option of rloo's grid pinned: nothing left to tune
    assert tuning.grid("bpo") == ({"backbones": 2}, {"backbones": 2, "max_branch_points": 2, "max_depth": 2})
    assert tuning.grid("grpo") == tuning.grids["grpo"]
    assert tuning.grids["rloo"] == PRESETS["smoke"].tuning.grids["rloo"]  # the grid as given stays in config.yaml
    assert preset.options["rloo"].group_size == 2 and preset.options["bpo"].branch_factor == 2


def test_a_pin_named_only_in_the_file_holds_as_a_flags_does(tmp_path):
    path = _write(tmp_path / "c.yaml", {"preset": "smoke", "tuning": {"pinned": {"rloo": {"group_size": 2}}}})
    preset = _parse("--config", path)
    assert preset.options["rloo"].group_size == 2 and preset.tuning.grid("rloo") == ({},)
    assert preset.tuning.seeds == PRESETS["smoke"].tuning.seeds  # the rest of the tuning from the base


def test_print_config_prints_the_file_and_runs_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    assert compare.main(["--smoke", "--seeds", "3", "4", "--rloo.group-size", "2", "--print-config", "--out", str(out)]) == {}
    data = yaml.safe_load(capsys.readouterr().out)
    assert data["preset"] == "smoke" and all(e["seeds"] == [3, 4] for e in data["envs"].values()) and data["tuning"]["pinned"] == {"rloo": {"group_size": 2}}
    assert not out.exists()


def test_a_folder_written_before_pins_resumes(tmp_path):
    preset = _parse("--smoke")
    saved = preset_dict(preset)
    saved["tuning"].pop("pinned")  # as an earlier version wrote preset.json
    check_same_settings(tmp_path, preset, saved)  # no error: a field TuningConfig gained counts at its default
    pinned = _parse("--smoke", "--rloo.group-size", "2")
    with pytest.raises(SystemExit, match="differs in: .*tuning"):
        check_same_settings(tmp_path, pinned, saved)


def _results(out):
    """Every run's results in ``out`` but its wall times: ``{run folder: run.json}``."""

    def plain(value):
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items() if not k.startswith("seconds")}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value

    return {p.parent.relative_to(out).as_posix(): plain(json.loads(p.read_text())) for p in sorted(out.glob("runs/*/*/seed*/run.json"))}


@pytest.mark.slow
def test_a_folders_config_yaml_runs_it_again_and_a_pinned_option_is_used(tmp_path):
    first, again = tmp_path / "first", tmp_path / "again"
    argv = ["--smoke", "--envs", "treemdp", "--updates", "2", "--no-progress", "--jobs", "1"]
    results = compare.main([*argv, "--out", str(first), "--rloo.group-size", "2", "--bpo.branch-factor", "2"])
    runs = first / "runs" / "treemdp"
    # the user's values ran, on the tuned env too (they were replaced by tuning's choice before)
    for name in ("rloo", "frozen", "rloo-2x"):
        assert json.loads((runs / name / "seed0" / "config.json").read_text())["options"]["group_size"] == 2
    assert json.loads((runs / "bpo" / "seed0" / "config.json").read_text())["options"]["branch_factor"] == 2
    tuning = results["per_env"]["treemdp"]["tuning"]
    assert tuning["rloo"]["fixed_by_user"] == {"group_size": 2} and tuning["rloo"]["candidates"] == [{}]
    assert tuning["bpo"]["fixed_by_user"] == {"branch_factor": 2} and len(tuning["bpo"]["candidates"]) == 2
    assert not (runs / "rloo@tune0").exists()  # one candidate left: nothing to choose, nothing run
    report = (first / "results.md").read_text()
    assert "| rloo | nothing left to tune | not run |" in report and "* rloo: group_size=2 **fixed by the user**" in report

    # config.yaml runs the comparison again: the same runs, the same per-seed results
    compare.main(["--config", str(first / "config.yaml"), "--out", str(again), "--no-progress", "--jobs", "1"])
    assert (again / "config.yaml").read_text() == (first / "config.yaml").read_text()
    made, remade = _results(first), _results(again)
    assert set(made) == set(remade) and len(made) >= 12
    assert made == remade

    # a folder written before config.yaml still resumes, and gains its config.yaml
    (first / "config.yaml").unlink()
    shutil.rmtree(runs / "reinforce" / "seed1")
    resumed = compare.main([*argv, "--out", str(first), "--resume", "--rloo.group-size", "2", "--bpo.branch-factor", "2"])
    assert resumed["per_env"]["treemdp"]["algorithms"]["rloo"] == results["per_env"]["treemdp"]["algorithms"]["rloo"]
    assert (first / "config.yaml").exists()


def test_a_gpu_comparisons_config_yaml_names_its_swe_bench_rows_and_runs_again(tmp_path):
    rows = {}
    for name, ids, repo in (("gym", ["gym__a-1", "gym__a-2"], "gym/a"), ("verified", ["django__django-1"], "django/django")):
        with open(tmp_path / f"{name}.jsonl", "w") as fh:
            for i in ids:
                fh.write(json.dumps({"instance_id": i, "repo": repo, "base_commit": "0" * 40, "patch": "", "test_patch": "",
                                     "problem_statement": "fix it", "FAIL_TO_PASS": ["t1"], "PASS_TO_PASS": [], "version": "1.0"}) + "\n")
        rows[name] = str(tmp_path / f"{name}.jsonl")
    flags = ["--preset", "gpu", "--swe-train-instances", rows["gym"], "--swe-instances", rows["verified"], "--swe-backend", "docker"]
    parser = compare.command_parser()
    holders = compare.add_config_flags(parser)
    args = parser.parse_args(flags)
    preset = compare.build_preset(args, holders)
    path = tmp_path / "config.yaml"
    path.write_text(config_yaml(compare.config_of(args, preset)))
    assert preset_dict(_parse("--config", str(path))) == preset_dict(preset)  # no SWE-bench flag needed again
    # the broken case: the file's rows overlap (an evaluation row trained on) and are refused
    data = yaml.safe_load(path.read_text())
    data["envs"]["swebench"]["kwargs"]["instances"] = rows["verified"]
    with pytest.raises(SystemExit, match="training and evaluation rows"):
        _parse("--config", _write(tmp_path / "overlap.yaml", data))

"""``bpo-compare``'s flags come from the config dataclasses: every field, its docstring as help."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools

import pytest

from baselines import RLOO
from baselines.rloo import RLOOOptions
from bpo_algos import BPO
from bpo_algos.algorithm import AlgorithmConfig
from bpo_algos.bpo import BPOOptions
from bpo_algos.trainer_config import TrainerConfig
from bpo_experiments import compare
from bpo_experiments.flags import add_flags, field_docs, given
from bpo_experiments.presets import ENV_SETTINGS, PRESETS, RUN_FIELDS, EnvSetup, Preset
from bpo_experiments.run_config import algorithm_spec, env_config, max_parallel_trees, option_kinds


def _parse(argv):
    parser = compare.command_parser()
    holders = compare.add_config_flags(parser)
    return compare.build_preset(parser.parse_args(argv), holders)


def test_every_field_of_every_config_dataclass_has_a_flag_with_its_docstring():
    parser = argparse.ArgumentParser()
    holders = compare.add_config_flags(parser)
    flags = {a.dest: a for a in parser._actions}
    for holder, cls, skip in (("trainer", TrainerConfig, RUN_FIELDS), ("shared", AlgorithmConfig, ()),
                              ("options:bpo", BPOOptions, ()), ("options:rloo", RLOOOptions, ())):
        docs = field_docs(cls)
        names = set(holders[holder].values())
        assert names == {f.name for f in dataclasses.fields(cls)} - set(skip), holder
        for dest, name in holders[holder].items():
            assert docs[name] and flags[dest].help.startswith(docs[name][:30]), (holder, name)
    assert "policy" in set(holders["preset"].values()) and "budget" in set(holders["envs"].values())
    # each env's settings (EnvSetup fields) have their flag, one value for every env
    assert set(holders["envs"].values()) == set(ENV_SETTINGS)
    docs = field_docs(EnvSetup)
    assert all(flags[dest].help.startswith(docs[name][:30]) for dest, name in holders["envs"].items())


def test_a_new_field_gets_its_flag(tmp_path):
    @dataclasses.dataclass
    class Extra:
        eval_every: int = 0
        """Evaluate the policy every this many updates (0: at the end only)."""
        controls: tuple[str, ...] = ()
        note: str | None = None

    parser = argparse.ArgumentParser()
    dests = add_flags(parser, Extra)
    args = parser.parse_args(["--eval-every", "5", "--controls", "a", "b", "--note", "none"])
    assert given(args, dests) == {"eval_every": 5, "controls": ["a", "b"], "note": None}
    assert "Evaluate the policy every" in parser.format_help()
    assert given(parser.parse_args([]), dests) == {}  # a flag not given leaves the field alone


def test_flags_set_the_preset_trainer_and_algorithm_options():
    preset = _parse(["--updates", "3", "--learning-rate", "0.01", "--bpo.branch-factor", "3", "--rloo.baseline", "anchored",
                     "--kl-coef", "0.1", "--seeds", "4", "5", "--budget", "100", "--gradient-checkpointing"])
    assert preset.trainer.updates == 3 and preset.trainer.learning_rate == 0.01 and preset.trainer.gradient_checkpointing
    assert all(env_config(preset, e).trainer.updates == 3 for e in preset.envs)  # over the per-env updates too
    assert preset.options["bpo"].branch_factor == 3 and preset.options["rloo"].baseline == "anchored"
    assert preset.shared.kl_coef == 0.1 and all(setup.seeds == (4, 5) for setup in preset.envs.values())  # one value, every env
    assert all(setup.budget == 100 for setup in preset.envs.values())
    assert PRESETS["cpu"].trainer.updates != 3 and PRESETS["cpu"].trainer.learning_rate != 0.01  # the table itself is untouched


def test_removed_flags_name_their_successor_and_bad_values_are_errors(capsys):
    # one flag per option: the earlier flags that set an option of every algorithm are errors
    for flag, successor in (("--group-size", "--KIND.group-size"), ("--backbones", "--bpo.backbones"),
                            ("--branch-factor", "--bpo.branch-factor"), ("--algorithm-option", "--KIND.OPTION")):
        with pytest.raises(SystemExit):
            _parse([flag, "4"])
        err = capsys.readouterr().err
        assert f"{flag} was removed" in err and successor in err, err
    preset = _parse(["--rloo.group-size", "4", "--grpo.group-size", "4", "--bpo.backbones", "3"])
    assert preset.options["rloo"].group_size == preset.options["grpo"].group_size == 4 and preset.options["bpo"].backbones == 3
    with pytest.raises(SystemExit, match="group_size must be an int >= 2"):
        _parse(["--rloo.group-size", "1"])
    with pytest.raises(SystemExit, match="optimizer must be one of"):
        _parse(["--optimizer", "lion"])


def test_options_are_documented_dataclasses_and_read_as_attributes():
    bpo = BPO(branch_factor=3, kl_coef=0.1, seed=4)
    assert bpo.options == BPOOptions(branch_factor=3) and bpo.options.branch_factor == 3 and bpo.shared.kl_coef == 0.1
    assert bpo.config() == {**AlgorithmConfig(kl_coef=0.1).to_dict(), **BPOOptions(branch_factor=3).to_dict(), "seed": 4}
    assert RLOO(RLOOOptions(group_size=3), baseline="anchored").options == RLOOOptions(group_size=3, baseline="anchored")
    with pytest.raises(TypeError, match="unknown option"):
        BPO(group_size=4)
    assert Preset(envs={}).trainer == TrainerConfig(updates=30)


def test_per_env_settings_are_each_envs_own_and_earlier_files_read_the_same():
    from bpo_experiments.output import env_setting
    from bpo_experiments.presets import PER_ENV_FIELDS, preset_dict

    assert {"budget", "seeds", "eval_episodes", "max_model_len", "eval_temperature"} <= set(PER_ENV_FIELDS)
    assert not {"envs", "options", "trainer", "policy", "pool_size"} & set(PER_ENV_FIELDS)
    # one env's own value is that env's setting only: resuming the other env's runs still matches
    preset = copy.deepcopy(PRESETS["cpu"])
    preset.envs["webshop"].eval_temperature = 0.0
    saved = preset_dict(preset)
    assert env_setting(saved, "webshop")["eval_temperature"] == 0.0
    assert env_setting(saved, "alfworld")["eval_temperature"] is None
    # a preset.json of an earlier version kept each env's settings as preset fields, one value or
    # {env: value}: read as the same setting, so its folder resumes; another value is another setting
    old = preset_dict(PRESETS["cpu"])
    moved = {k: {e: old["envs"][e].pop(k) for e in old["envs"]} for k in ENV_SETTINGS}
    old.update({**moved, "eval_episodes": 1})  # one value for every env, as the cpu preset's was
    assert all(env_setting(old, e) == env_setting(preset_dict(PRESETS["cpu"]), e) for e in old["envs"])
    old["seeds"] = {"webshop": [0, 1]}  # alfworld not named: the default (0, 1, 2), not the cpu preset's 6 seeds
    current = env_setting(preset_dict(PRESETS["cpu"]), "alfworld")
    assert env_setting(old, "alfworld") == {**current, "seeds": [0, 1, 2]} and current["seeds"] != [0, 1, 2]
    assert env_setting(old, "webshop")["seeds"] != env_setting(preset_dict(PRESETS["cpu"]), "webshop")["seeds"]
    assert env_setting(saved, "alfworld") == env_setting(preset_dict(PRESETS["cpu"]), "alfworld")


def test_trees_in_flight_are_the_presets_explicit_choice():
    preset = copy.deepcopy(PRESETS["cpu"])
    preset.pool_size = 12
    assert max_parallel_trees(preset) == 3  # a quarter of the pool
    preset.pool_size = 2
    assert max_parallel_trees(preset) == 1
    preset.shared = AlgorithmConfig(max_parallel_trees=5)
    assert max_parallel_trees(preset) == 5

    assert algorithm_spec("rloo", preset, 0).keywords()["max_parallel_trees"] == 5


def test_every_registered_factory_declares_its_options_and_its_kinds_flags_reach_it(monkeypatch):
    from bpo_algos import registry
    from bpo_algos.algorithm import Options
    from bpo_algos.registry import Variant, make_algorithm, register_algorithm

    @dataclasses.dataclass
    class MineOptions(Options):
        width: int = 2
        """Trajectories per task."""

    registry.registered_algorithms()  # the entry points, before the table is copied
    monkeypatch.setattr(registry, "_ALGORITHMS", dict(registry._ALGORITHMS))
    register_algorithm("mine", lambda width=2, **options: RLOO(group_size=width, **options), options=MineOptions)
    register_algorithm("rloo-4", Variant(RLOO, group_size=4))
    register_algorithm("bare", lambda **options: RLOO(group_size=3, **options))
    register_algorithm("rloo-5", functools.partial(RLOO, group_size=5))
    preset = _parse(["--mine.width", "3", "--rloo.group-size", "6", "--rloo.baseline", "anchored",
                     "--frozen.of", "grpo", "--grpo.group-size", "5"])
    assert make_algorithm("mine", **algorithm_spec("mine", preset, 0).keywords()).options.group_size == 3  # a user's kind
    rloo4 = algorithm_spec("rloo-4", preset, 0).keywords()  # a variant: its kind's options but the one it fixes
    assert "group_size" not in rloo4 and rloo4["baseline"] == "anchored"
    assert make_algorithm("rloo-4", **rloo4).options == RLOOOptions(group_size=4, baseline="anchored")
    assert "group_size" not in algorithm_spec("bare", preset, 0).keywords()  # declares none: the shared options only
    assert algorithm_spec("rloo-5", preset, 0).keywords()["baseline"] == "anchored" and "group_size" not in algorithm_spec("rloo-5", preset, 0).keywords()
    frozen = algorithm_spec("frozen", preset, 0).keywords()  # a control: the options of the algorithm it wraps
    assert frozen["of"] == "grpo" and frozen["group_size"] == 5
    assert type(make_algorithm("frozen", **frozen).inner).__name__ == "GRPO"
    assert option_kinds(["frozen", "rloo-2x", "rloo-4", "mine", "bare"], preset) == {
        "frozen": "grpo", "rloo-2x": "rloo", "rloo-4": "rloo", "mine": "mine", "bare": None}
    with pytest.raises(TypeError, match="not RLOOOptions fields"):
        Variant(RLOO, width=2)


def test_a_kinds_flag_sets_that_option_over_an_envs_own(monkeypatch):
    from baselines.gigpo import GiGPOOptions

    cpu = copy.deepcopy(PRESETS["cpu"])
    first = next(iter(cpu.envs))
    cpu.envs[first].options["gigpo"] = GiGPOOptions(scale="group")
    monkeypatch.setitem(PRESETS, "cpu", cpu)
    assert algorithm_spec("gigpo", cpu, 0, first).keywords()["scale"] == "group"  # the env's own
    preset = _parse(["--gigpo.scale", "none"])
    assert all(algorithm_spec("gigpo", preset, 0, e).keywords()["scale"] == "none" for e in preset.envs)  # the flag wins


def test_a_folder_of_an_earlier_version_resumes_unless_it_set_a_removed_field(tmp_path):
    import json

    from bpo_experiments.output import check_same_settings, env_setting
    from bpo_experiments.presets import preset_dict

    preset = copy.deepcopy(PRESETS["smoke"])
    env = next(iter(preset.envs))
    folder = tmp_path / "runs" / env
    folder.mkdir(parents=True)
    old = {**env_setting(preset_dict(preset), env), "algorithm_options": {}}  # as earlier versions wrote it
    (folder / "setting.json").write_text(json.dumps(old))
    check_same_settings(tmp_path, preset, None)
    (folder / "setting.json").write_text(json.dumps({**old, "algorithm_options": {"bpo": {"max_depth": 2}}}))
    with pytest.raises(SystemExit, match="differs in: algorithm_options"):
        check_same_settings(tmp_path, preset, None)

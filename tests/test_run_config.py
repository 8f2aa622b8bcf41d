"""One resolved configuration per run: written beside its results, compared when a comparison resumes."""

from __future__ import annotations

import json

import pytest

from bpo_experiments import compare
from bpo_experiments.presets import PRESETS
from bpo_experiments.run_config import algorithm_spec, env_config, run_config
from bpo_experiments.streams import ALGORITHM, stream_seed

TINY = ["--smoke", "--envs", "treemdp", "--algorithms", "bpo", "rloo", "--seeds", "0", "--updates", "2", "--budget", "96",
        "--grad-batches", "2", "--no-tune", "--no-progress", "--jobs", "1"]


def test_run_config_resolves_every_setting_once():
    preset = PRESETS["cpu-llm"]
    env = next(iter(preset.envs))
    config = run_config(preset, env, "rloo-2x", 1, 8)
    assert config.registered == "rloo-2x" and config.options == algorithm_spec("rloo-2x", preset, stream_seed(1, ALGORITHM), env).keywords()
    assert config.options["group_size"] == preset.options["rloo"].group_size and config.options["of"] == "rloo"
    assert config.budget == 2 * preset.envs[env].budget and config.trainer.budget.amount == config.budget  # the control's multiple
    assert config.trainer.tasks_per_update == 8 and config.trainer.out_dir is None  # the folder is set when it runs
    assert config.policy.policy == (preset.envs[env].policy or preset.policy)
    assert config.probing == env_config(preset, env).probes_on(1) and not run_config(preset, env, "rloo@tune1", 1, 8).probing  # not a tuning run
    assert json.loads(json.dumps(config.to_json())) == config.to_json()


def test_run_json_holds_the_resolved_config_and_a_changed_one_is_refused_on_resume(tmp_path):
    out = tmp_path / "cmp"
    compare.main(["--out", str(out), *TINY])
    folder = out / "runs" / "treemdp" / "rloo" / "seed0"
    run = json.loads((folder / "run.json").read_text())
    config = run["config"]
    assert config == json.loads((folder / "config.json").read_text())
    assert config["algorithm"] == "rloo" and config["env"] == "treemdp" and config["seed"] == 0
    assert config["budget"] == 96 and config["trainer"]["updates"] == 2 and config["grad_batches"] == 2
    assert all(run["options"][k] == v for k, v in config["options"].items())  # what the algorithm was built with

    compare.main(["--out", str(out), "--resume", *TINY])  # the same configuration: resumes
    # an interrupted run whose configuration resolves differently now (a default changed in the code,
    # say) is refused, naming what differs, before anything runs
    (folder / "run.json").unlink()
    (folder / "config.json").write_text(json.dumps({**config, "options": {**config["options"], "group_size": 3}}))
    with pytest.raises(SystemExit, match=r"another configuration \(differs in: options.group_size"):
        compare.main(["--out", str(out), "--resume", *TINY])
    assert not (folder / "run.json").exists()

    # a folder of an earlier version (no configuration saved) resumes, its runs kept
    (folder / "config.json").unlink()
    bpo = out / "runs" / "treemdp" / "bpo" / "seed0"
    (bpo / "config.json").unlink()
    old = json.loads((bpo / "run.json").read_text())
    old.pop("config")
    (bpo / "run.json").write_text(json.dumps(old))
    results = compare.main(["--out", str(out), "--resume", *TINY])
    assert json.loads((bpo / "run.json").read_text()) == old and (folder / "config.json").exists()
    assert set(results["algorithms"]) == {"bpo", "rloo"}


def test_settings_stay_typed_until_the_factory_is_called_and_each_env_checks_its_own():
    from dataclasses import replace

    from baselines.rloo import RLOOOptions
    from bpo_algos.algorithm import AlgorithmConfig

    preset = PRESETS["cpu-llm"]
    env = next(iter(preset.envs))
    config = run_config(preset, env, "frozen", 0, 8)
    # a control's options are the typed options of the algorithm it wraps, handed over as keywords only by build()
    assert isinstance(config.spec.options, RLOOOptions) and isinstance(config.spec.shared, AlgorithmConfig) and config.spec.of == "rloo"
    assert config.spec.build().config() == config.build_algorithm().config() and config.options["group_size"] == 4
    settings = env_config(preset, env)
    assert settings.eval_points == tuple(range(0, settings.trainer.updates + 1))  # eval_every=1: derived in __post_init__
    assert settings.probe_points == {"initial": 0, "mid": settings.trainer.updates // 2}
    assert replace(settings, seeds=(0,)).probes_on(0) and not replace(settings, seeds=(0,)).probes_on(1)  # re-derived
    # the broken cases: settings a run cannot use are refused where they are resolved
    with pytest.raises(ValueError, match="eval_episodes >= 1"):
        replace(settings.evaluation, episodes=0)
    with pytest.raises(ValueError, match="repeat one"):
        replace(settings, seeds=(1, 1))
    with pytest.raises(TypeError, match="algorithm option dataclass"):
        replace(config.spec, options={"group_size": 4})


def test_only_run_config_reads_the_preset_after_the_flags():
    """The runner, the statistics, the probes, the evaluation and the policy builder take resolved
    settings (:mod:`bpo_experiments.run_config`); none of them imports ``Preset``."""
    from pathlib import Path

    import bpo_experiments

    root = Path(bpo_experiments.__file__).parent
    readers = ("runner.py", "stats.py", "probes.py", "evaluation.py", "build.py", "gpu_plan.py")
    assert [m for m in readers if "import Preset" in (root / m).read_text() or ", Preset" in (root / m).read_text()] == []
    # per-env settings are EnvSetup fields, not X | dict[str, X] preset fields
    import typing

    from bpo_experiments.presets import Preset

    unions = [n for n, h in typing.get_type_hints(Preset).items()
              if any(typing.get_origin(p) is dict for p in typing.get_args(h))]
    assert unions == []

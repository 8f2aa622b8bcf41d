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
    assert config.budget == 2 * preset.budget[env] and config.trainer.budget.amount == config.budget  # the control's multiple
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

"""Algorithms by name: the registry, and a user's algorithm in the main job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from baselines import RLOO
from bpo_algos import BPO, make_algorithm, register_algorithm, registered_algorithms
from bpo_algos.registry import _ALGORITHMS
from bpo_experiments import compare
from bpo_experiments.presets import PRESETS, EnvSetup
from bpo_experiments.run_config import algorithm_spec

TINY = ["--envs", "treemdp", "--seeds", "0", "--updates", "2", "--budget", "96", "--grad-batches", "2", "--no-progress", "--jobs", "1"]


@pytest.fixture
def clean_registry():
    before = dict(_ALGORITHMS)
    yield
    _ALGORITHMS.clear()
    _ALGORITHMS.update(before)


def test_builtins_are_registered_and_built_with_options():
    assert {"bpo", "grpo", "rloo"} <= set(registered_algorithms())
    bpo = make_algorithm("bpo", backbones=3, branch_factor=2, seed=1)
    assert isinstance(bpo, BPO) and bpo.options.backbones == 3 and bpo.options.branch_factor == 2
    with pytest.raises(ValueError, match="unknown algorithm 'nope'; registered: bpo"):
        make_algorithm("nope")


def test_register_rejects_bad_names_duplicates_and_non_callables(clean_registry):
    with pytest.raises(ValueError, match="without spaces"):
        register_algorithm("my algo", RLOO)
    with pytest.raises(TypeError, match="must be callable"):
        register_algorithm("mine", 3)
    with pytest.raises(ValueError, match="already registered"):
        register_algorithm("rloo", RLOO)
    register_algorithm("rloo", RLOO, overwrite=True)


def test_an_algorithms_options_go_only_to_its_own_kind(clean_registry):
    register_algorithm("rloo-4", lambda **options: RLOO(group_size=4, **options))
    preset = PRESETS["cpu-llm"]
    assert algorithm_spec("bpo", preset, 0).keywords()["backbones"] == preset.options["bpo"].backbones
    assert algorithm_spec("rloo", preset, 0).keywords()["group_size"] == preset.options["rloo"].group_size
    assert "group_size" not in algorithm_spec("rloo-4", preset, 0).keywords()  # a bare **options factory
    assert "backbones" not in algorithm_spec("grpo", preset, 0).keywords()
    assert make_algorithm("rloo-4", **algorithm_spec("rloo-4", preset, 0).keywords()).options.group_size == 4


def test_an_envs_own_options_replace_the_presets_for_that_env_only():
    # verl-agent's GiGPO: mean_std_norm on ALFWorld, mean_norm on WebShop
    preset = PRESETS["gpu"]
    assert algorithm_spec("gigpo", preset, 0, "alfworld").keywords()["scale"] == "group"
    assert algorithm_spec("gigpo", preset, 0, "webshop").keywords()["scale"] == "none"
    assert algorithm_spec("gigpo", preset, 0).keywords()["scale"] == "none"
    assert algorithm_spec("gigpo", preset, 0, "alfworld").keywords()["gamma"] == 0.95  # the rest as the preset's
    with pytest.raises(TypeError, match="option dataclasses"):
        EnvSetup("BPO-TreeMDP-v0", options={"gigpo": {"scale": "group"}})


def test_users_algorithm_joins_the_comparison(tmp_path, clean_registry, monkeypatch):
    module = tmp_path / "my_algos.py"
    module.write_text(textwrap.dedent("""
        from baselines import RLOO
        from bpo_algos import register_algorithm

        register_algorithm("rloo-4", lambda **options: RLOO(group_size=4, **options))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "cmp"
    results = compare.main(["--smoke", "--out", str(out), "--import", "my_algos", "--algorithms", "bpo", "rloo-4",
                            "--comparator", "rloo-4", "--bpo.max-branch-points", "2", "--no-tune", *TINY])
    assert set(results["algorithms"]) == {"bpo", "rloo-4"}
    head = results["per_env"]["treemdp"]["treatment_vs_comparator"]
    assert head["treatment"] == "bpo" and head["comparator"] == "rloo-4"
    preset = json.loads((out / "preset.json").read_text())
    assert preset["options"]["bpo"]["max_branch_points"] == 2
    assert (out / "runs" / "treemdp" / "rloo-4" / "seed0" / "run.json").exists()


def test_unknown_algorithm_and_treatment_are_errors(tmp_path):
    with pytest.raises(SystemExit, match="unknown algorithm"):
        compare.main(["--smoke", "--out", str(tmp_path / "a"), "--algorithms", "bpo", "mine", *TINY])
    with pytest.raises(SystemExit, match="--treatment 'bpo' is not among"):
        compare.main(["--smoke", "--out", str(tmp_path / "b"), "--algorithms", "grpo", "rloo", *TINY])


def test_resume_refuses_another_setting(tmp_path):
    out = tmp_path / "cmp"
    compare.main(["--smoke", "--out", str(out), "--algorithms", "bpo", "rloo", *TINY])
    again = compare.main(["--smoke", "--out", str(out), "--resume", "--algorithms", "bpo", "rloo", *TINY])
    assert set(again["algorithms"]) == {"bpo", "rloo"}
    with pytest.raises(SystemExit, match="another setting.*updates"):
        compare.main(["--smoke", "--out", str(out), "--resume", "--algorithms", "bpo", "rloo", *TINY, "--updates", "3"])


def test_console_commands_answer_help():
    for module in ("bpo_experiments.compare", "bpo_experiments.variance", "bpo_experiments.bench", "bpo_envs.system"):
        done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "usage" in done.stdout


def _plugin(tmp_path, entry_points: str, code: str):
    """A pip-installed package as far as importlib.metadata sees: a module plus its dist-info."""
    (tmp_path / "my_plugin.py").write_text(textwrap.dedent(code))
    info = tmp_path / "my_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *filter(None, [env.get("PYTHONPATH")])])
    return env


def test_an_installed_packages_algorithms_and_estimators_are_found_by_entry_point(tmp_path):
    env = _plugin(tmp_path, """
        [bpo_algos.algorithms]
        rloo-16 = my_plugin:rloo16

        [bpo_algos.advantages]
        zero = my_plugin:zero_advantages
    """, """
        from baselines import RLOO

        def rloo16(**options):
            return RLOO(group_size=16, **options)

        def zero_advantages(trees):
            for tree in trees:
                for edge in tree.edges():
                    edge.advantage = 0.0
    """)
    listed = subprocess.run([sys.executable, "-m", "bpo_experiments.compare", "--list-algorithms"],
                            capture_output=True, text=True, env=env, timeout=120, check=True).stdout.split()
    assert listed[0] == "bpo" and "rloo-16" in listed  # the project's first, no --import
    code = ("from bpo_algos import make_algorithm, registered_advantages; "
            "assert make_algorithm('rloo-16').options.group_size == 16; assert 'zero' in registered_advantages()")
    subprocess.run([sys.executable, "-c", code], env=env, timeout=120, check=True)


def test_a_broken_entry_point_is_an_error_naming_it(tmp_path):
    env = _plugin(tmp_path, "[bpo_algos.algorithms]\nbroken = my_plugin:missing\n", "x = 1\n")
    done = subprocess.run([sys.executable, "-m", "bpo_experiments.compare", "--list-algorithms"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode != 0
    assert "entry point 'broken' (my_plugin:missing, from my-plugin) failed to load" in done.stderr

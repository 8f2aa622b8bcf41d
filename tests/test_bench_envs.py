"""bpo-bench --quick on TreeMDP and WebShop: output fields, and the tree's shared
prefixes (no timing asserts)."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

from bpo_envs.timing import (
    random_walk,
    replay_restore_ms,
    reset_ms,
    snapshot_restore_ms,
    walk_prefix,
)
from bpo_experiments import bench as bench_envs

COST_FIELDS = ("reset_ms", "step_ms", "steps_per_s", "snapshot_ms", "restore_ms", "depth",
               "replay_restore_ms", "replay_over_restore")  # fmt: skip
METER_FIELDS = ("leaves", "env_steps", "gen_tokens", "prefill_tokens", "policy_calls")


def test_bench_envs_quick(tmp_path):
    # no --llm-envs values: the tiny-LLM comparison is skipped (kept fast)
    bench_envs.main(["--out", str(tmp_path), "--quick", "--envs", "treemdp", "webshop", "--llm-envs"])
    report = json.loads((tmp_path / "bench_envs.json").read_text())
    assert set(report["envs"]) == {"treemdp", "webshop"}
    assert report["config"]["leaves"] == 8
    for name, env in report["envs"].items():
        if name == "webshop" and "skipped" in env:
            continue  # its extra is not installed
        assert "errors" not in env, env.get("errors")
        costs = env["costs"]
        for key in COST_FIELDS:
            assert costs[key] >= 0, key
        assert costs["depth"] >= 1 and costs["replay_over_restore"] > 0
        uniform = env["tree_vs_independent"]["uniform"]["algorithms"]
        assert len(uniform) == 3  # independent, wide tree, deep tree
        for row in uniform.values():
            for key in METER_FIELDS:
                assert row[key] > 0, key
        assert "skipped" in env["tree_vs_independent"]["tiny_llm"]

    rows = list(report["envs"]["treemdp"]["tree_vs_independent"]["uniform"]["algorithms"].values())
    independent, trees = rows[0], rows[1:]
    assert independent["config"]["group_size"] == 8
    for tree in trees:
        # equal leaves (every episode is long enough for every branch point) ...
        assert tree["leaves"] == independent["leaves"] and tree["leaves_per_tree"] == [8]
        # ... and fewer env steps: the backbone prefixes are shared
        assert tree["env_steps"] < independent["env_steps"]
        assert tree["ratio_to_independent"]["env_steps"] < 1

    text = (tmp_path / "bench_envs.md").read_text()
    assert "## Env costs" in text and "BPO-TreeMDP-v0" in text
    assert "uniform TabularPolicy" in text and "skipped" in text


def test_bench_helpers_on_tree_mdp():
    make = lambda: gym.make("BPO-TreeMDP-v0", depth=5, n_actions=3)  # noqa: E731
    env = make()
    walk = random_walk(env, 50, seed=0)
    assert walk.steps == 50 and walk.episodes == 10 and len(walk.step_seconds) == 50
    assert reset_ms(env, 3) >= 0
    actions, info = walk_prefix(env, 10, seed=0)
    assert len(actions) == 4 and env.unwrapped.elapsed_steps == 4  # stops before the leaf
    costs = snapshot_restore_ms(env, info, repeats=3)
    assert set(costs) == {"snapshot_ms", "restore_ms"}
    assert env.unwrapped.elapsed_steps == 4  # left at the snapshot's state
    assert replay_restore_ms(make, actions, repeats=2) >= 0
    with pytest.raises(ValueError, match="even number"):
        bench_envs.tree_shapes(5)

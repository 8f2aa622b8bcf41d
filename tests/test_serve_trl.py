"""TRL's GRPOTrainer playing served envs: ``environment_factory`` over ``BPO-Remote-v0``.

examples/trl_grpo.py end to end (2 GRPO updates of the tiny offline Qwen2, small) with every env
instance TRL makes being a session of a ``bpo-serve`` server on 127.0.0.1: the rows' tasks are
reset on the server, TRL's tool calls step it, and TRL's logged reward is the served return.
"""

from __future__ import annotations

import importlib.util
import json
import urllib.request

import pytest

pytest.importorskip("trl", reason="needs the trl extra: pip install 'bpo-gym[trl]'")
pytest.importorskip("openenv.core", reason="needs the serve extra: pip install 'bpo-gym[serve]'")

from serve_support import ROOT, served  # noqa: E402

GENERATIONS = 2


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env_id", "kwargs", "args", "stepped"),
    [
        # the case: WebShop (the tiny model rarely writes a valid call yet, as in process)
        ("BPO-WebShop-v0", {}, ["--max-completion-length", "512", "--max-turns", "2"], False),
        # short observations: the warm-started model calls act and the served leaves pay rewards
        ("BPO-TreeMDP-v0", {"depth": 2, "n_actions": 3}, ["--warm-turns", "2", "--max-completion-length", "512", "--max-turns", "4"], True),
    ],
    ids=["webshop", "treemdp"],
)
def test_trl_grpo_trains_on_a_served_env(tmp_path, env_id, kwargs, args, stepped):
    spec = importlib.util.spec_from_file_location("trl_grpo_example", ROOT / "examples" / "trl_grpo.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = tmp_path / "summary.json"
    with served(env_id, kwargs) as (url, _):
        example.main(["--env", "BPO-Remote-v0", "--env-kwargs", json.dumps({"base_url": url}), "--steps", "2",
                      "--tasks", "2", "--num-generations", str(GENERATIONS), "--warm-start", "20", *args,
                      "--out", str(out), "--output-dir", str(tmp_path / "run")])
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            health = json.loads(r.read())
    summary = json.loads(out.read_text())
    steps = [log for log in summary["logs"] if "loss" in log]
    episodes = summary["episodes"]
    assert len(steps) == 2 and len(episodes) == 2 * GENERATIONS  # one served episode per rollout
    assert summary["reward_column"] == "rewards/BPO_Remote_v0/mean"
    assert {e["task_id"] for e in episodes} <= {0, 1}  # reset on the server from the rows' task_ids
    for i, log in enumerate(steps):  # TRL's reward is the served env's return, rollout by rollout
        batch = episodes[GENERATIONS * i : GENERATIONS * (i + 1)]
        assert float(log[summary["reward_column"]]) == pytest.approx(sum(e["reward"] for e in batch) / GENERATIONS, abs=1e-4)
    answered = health["answered"]
    assert answered["reset"] >= len(episodes)  # every rollout began with a reset on the server
    assert answered.get("step", 0) >= sum(len(e["actions"]) for e in episodes)
    assert health["sessions_total"] >= len(episodes)  # TRL keeps its env objects (open sessions) until it drops them
    if stepped:  # TRL's tool calls stepped the served env, and its leaves paid
        assert sum(len(e["actions"]) for e in episodes) > 0 and answered["step"] > 0
        assert any(e["done"] for e in episodes) and any(e["reward"] > 0 for e in episodes)

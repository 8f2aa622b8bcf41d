"""TRL's GRPOTrainer playing a served WebShop: ``environment_factory`` over ``BPO-Remote-v0``.

examples/trl_grpo.py end to end (2 GRPO updates of the tiny offline Qwen2) with every env
instance TRL makes being a session of a ``bpo-serve`` server on 127.0.0.1: the rows' tasks are
reset on the server and TRL's logged reward is the served env's return.
"""

from __future__ import annotations

import importlib.util
import json
import urllib.request

import pytest

pytest.importorskip("trl", reason="needs the trl extra: pip install 'bpo-gym[trl]'")
pytest.importorskip("openenv.core", reason="needs the serve extra: pip install 'bpo-gym[serve]'")

from serve_support import ROOT, served  # noqa: E402


@pytest.mark.slow
def test_trl_grpo_trains_on_a_served_webshop(tmp_path):
    spec = importlib.util.spec_from_file_location("trl_grpo_example", ROOT / "examples" / "trl_grpo.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = tmp_path / "summary.json"
    with served("BPO-WebShop-v0") as (url, _):
        example.main(["--env", "BPO-Remote-v0", "--env-kwargs", json.dumps({"base_url": url}), "--steps", "2",
                      "--tasks", "4", "--out", str(out), "--output-dir", str(tmp_path / "run")])
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            health = json.loads(r.read())
    summary = json.loads(out.read_text())
    steps = [log for log in summary["logs"] if "loss" in log]
    episodes = summary["episodes"]
    assert len(steps) == 2 and len(episodes) == 2 * 4  # one served episode per rollout
    assert summary["reward_column"] == "rewards/BPO_Remote_v0/mean"
    assert {e["task_id"] for e in episodes} <= {0, 1, 2, 3}  # reset on the server from the rows' task_ids
    for i, log in enumerate(steps):  # TRL's reward is the served env's return, rollout by rollout
        batch = episodes[4 * i : 4 * i + 4]
        assert float(log[summary["reward_column"]]) == pytest.approx(sum(e["reward"] for e in batch) / 4, abs=1e-4)
    answered = health["answered"]
    assert answered["reset"] >= len(episodes)  # every rollout began with a reset on the server
    assert answered.get("step", 0) >= sum(len(e["actions"]) for e in episodes)
    assert health["sessions_total"] >= len(episodes) and health["sessions"] == 0

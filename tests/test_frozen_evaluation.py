"""A policy still in the warm start's very state is not evaluated again (docs/main-job.md,
"Scheduling"): the positive control ``frozen`` keeps its parameters bit for bit, so each of its
evaluations is the initial job's; played again, they give the same successes."""

from __future__ import annotations

import json

import pytest
import torch

from bpo_experiments import compare, runner

ARGS = ["--smoke", "--envs", "webshop", "--seeds", "0", "--algorithms", "bpo", "rloo", "frozen", "--positive-control", "frozen",
        "--calibration-control", "none", "--handicapped-control", "none", "--updates", "2", "--eval-every", "1", "--grad-seeds", "0",
        "--no-tune", "--no-progress", "--jobs", "1"]


def _evals(out, algorithm):
    return json.loads((out / "runs" / "webshop" / algorithm / "seed0" / "run.json").read_text())["evals"]


def test_state_digest_names_the_whole_state():
    layer = torch.nn.Linear(3, 2)
    before = runner.state_digest(layer)
    assert runner.state_digest(layer) == before
    with torch.no_grad():
        layer.bias[0] += 1e-7  # one float moved
    assert runner.state_digest(layer) != before
    assert runner.state_digest(object()) is None


@pytest.mark.slow
def test_frozen_reuses_the_warm_start_evaluation_and_replaying_it_agrees(tmp_path, monkeypatch):
    reused = tmp_path / "reused"
    compare.main([*ARGS, "--out", str(reused)])
    frozen = _evals(reused, "frozen")
    assert [e["update"] for e in frozen] == [0, 1, 2]
    assert all(e.get("warm_start_state") for e in frozen[1:]) and len({e["success"] for e in frozen}) == 1
    assert not any(e.get("warm_start_state") for e in _evals(reused, "rloo"))  # a learner moved
    # the equality on this seed: every evaluation played again gives the same successes
    monkeypatch.setattr(runner, "state_digest", lambda policy: None)
    played = tmp_path / "played"
    compare.main([*ARGS, "--out", str(played)])
    assert [e["success"] for e in _evals(played, "frozen")] == [e["success"] for e in frozen]
    assert not any(e.get("warm_start_state") for e in _evals(played, "frozen"))

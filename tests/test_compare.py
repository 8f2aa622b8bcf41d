"""scripts/compare.py end to end on a small TreeMDP: outputs, matched budgets, resume."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import compare  # noqa: E402

ARGS = ["--envs", "treemdp", "--seeds", "0", "1", "--updates", "3", "--budget", "200", "--grad-batches", "3", "--no-progress"]


def test_compare_writes_results_and_resumes(tmp_path):
    out = tmp_path / "cmp"
    results = compare.main(["--smoke", "--out", str(out), *ARGS])
    assert set(results["algorithms"]) == {"bpo", "grpo", "rloo"}
    saved = json.loads((out / "results.json").read_text())
    assert saved["budget_unit"] == "env_steps" and saved["seeds"] == [0, 1] and saved["envs"] == ["treemdp"]
    for row in saved["algorithms"].values():
        assert 0.0 <= row["success"] <= 1.0 and len(row["curve"]) == 3
        assert "env_steps" in row["compute"] and row["grad_norm_var"] >= 0
    per_env = saved["per_env"]["treemdp"]["algorithms"]
    used = [per_env[a]["compute"]["env_steps"] for a in ("bpo", "grpo", "rloo")]
    assert max(used) / min(used) < 1.25  # the same budget per update
    assert (out / "results.md").read_text().startswith("# BPO vs GRPO vs RLOO")
    assert (out / "success.png").stat().st_size > 0 and (out / "grad_norm_variance.png").stat().st_size > 0

    # an interrupted run: one run lost its result and the aggregate was never written
    shutil.rmtree(out / "runs" / "treemdp" / "rloo" / "seed1")
    (out / "results.json").unlink()
    with pytest.raises(SystemExit, match="--resume"):
        compare.main(["--smoke", "--out", str(out), *ARGS])
    resumed = compare.main(["--smoke", "--out", str(out), "--resume", *ARGS])
    assert resumed["per_env"]["treemdp"]["algorithms"]["bpo"] == results["per_env"]["treemdp"]["algorithms"]["bpo"]
    assert resumed["per_env"]["treemdp"]["algorithms"]["rloo"]["curve"] == results["per_env"]["treemdp"]["algorithms"]["rloo"]["curve"]


def test_compare_rejects_unknown_env(tmp_path):
    with pytest.raises(SystemExit, match="unknown env"):
        compare.main(["--smoke", "--out", str(tmp_path / "x"), "--envs", "atari"])

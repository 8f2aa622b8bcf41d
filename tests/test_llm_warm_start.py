"""``scripts/llm_warm_start.py``: an LLM policy behaviour-cloned once, saved, and loaded by
``bpo-diagnose --policy FOLDER --sft-epochs 0`` (docs/regime.md, "LLM policies")."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import llm_warm_start  # noqa: E402

from bpo_experiments import diagnose  # noqa: E402


def _weights(policy) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in policy.model.named_parameters()}


def test_the_saved_warm_start_is_what_the_diagnosis_loads(tmp_path: Path) -> None:
    # the tiny offline LLM cloned on one WebShop task's expert decisions, in batches of 2; the
    # saved folder, given to the diagnosis as its policy, is the cloned model (not a fresh one)
    folder, report_file = tmp_path / "warm", tmp_path / "warm_start.json"
    report = llm_warm_start.main([
        "BPO-WebShop-v0", "--preset", "cpu-llm", "--policy", "tiny", "--env-kwargs", '{"max_episode_steps": 4}',
        "--tasks", "1", "--sft-epochs", "2", "--sft-lr", "1e-3", "--sft-batch-size", "2", "--max-new-tokens", "16",
        "--no-reasoning", "--check-batches", "0", "--save", str(folder), "--json", str(report_file)])
    assert json.loads(report_file.read_text())["expert_decisions"] == report["expert_decisions"] > 0
    sft = report["sft"]
    assert sft["optimizer_steps"] == 2 * math.ceil(report["expert_decisions"] / 2)  # the free batch size, per epoch
    assert sft["loss_per_epoch"][1] < sft["loss_per_epoch"][0]  # the second epoch fits the same decisions better

    preset, _, setup = diagnose.find_setup("BPO-WebShop-v0", "cpu-llm")
    diagnose.apply_llm_flags(preset, setup, {"sft_epochs": 0, "max_new_tokens": 16, "reasoning": False})
    loaded = _weights(diagnose.build_policy(str(folder), preset, setup, 0, []))
    fresh = _weights(diagnose.build_policy("tiny", preset, setup, 0, []))
    assert loaded.keys() == fresh.keys()
    cloned = [name for name in loaded if not torch.equal(loaded[name], fresh[name])]
    assert cloned, "the diagnosis loaded an uncloned model"

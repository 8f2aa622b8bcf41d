"""scripts/device_check.sh on the CPU: the GPU path's one prepared check (gpu-lora settings:
LoRA over a bf16 base, KL, reasoning replies, probe entropy) runs at the tiny shape, its update
moves every weight that has a gradient, and its JSON has the figures the GPU run reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_device_check_runs_on_cpu_and_prints_json():
    env = {**os.environ, "PYTHON": sys.executable}
    out = subprocess.run(["bash", str(ROOT / "scripts/device_check.sh"), "--device", "cpu"], check=True, env=env, capture_output=True, text=True, timeout=900)
    result = json.loads(out.stdout)
    assert [(u["shape"], u["algorithm"]) for u in result["updates"]] == [("tiny", "bpo"), ("tiny", "rloo")]
    assert result["settings"]["decision_entropy"] == "probe" and result["settings"]["kl_coef"] == 0.01
    for update in result["updates"]:
        assert update["gradient_checkpointing"] and update["master_dtype"] == "torch.float32"
        assert update["weights_moved_share"] == 1.0 and update["weight_change_l2"] > 0
        assert update["generated_tokens_per_s"] > 0 and update["trained_tokens_per_s"] > 0
        assert update["plan_gb"] > 0 and update["peak_gpu_memory_gb"] is None  # no GPU here
        assert sum(update["phase_share"].values()) == pytest.approx(1.0, abs=0.05)
        assert update["phase_seconds"]["reference"] > 0  # the KL's reference pass (adapter off)
    bpo = result["updates"][0]
    assert bpo["score_tokens"] > 0 and bpo["phase_seconds"]["scoring"] > 0  # the probe, charged


def test_device_check_lists_what_is_missing(tmp_path):
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")  # no site-packages: nothing installed
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHON=str(fake), BPO_WHEELS=str(tmp_path / "none"))
    out = subprocess.run(["bash", str(ROOT / "scripts/device_check.sh"), "--device", "cpu"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 3
    assert "missing python packages" in out.stderr and "torch" in out.stderr and "pip download" in out.stderr


@pytest.mark.parametrize(("shape", "billions"), [("1.5b", 1.54), ("7b", 7.62)])
def test_device_check_builds_the_real_shapes_from_the_bundled_configs(shape, billions):
    """The GPU run's models (built on the meta device here: no memory) have the memory plan's
    parameter count: the plan it is measured against describes the model it runs."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from device_check import build_model

    from bpo_algos.memory_plan import ModelShape

    model, config = build_model(shape, "meta", None)
    count = sum(p.numel() for p in model.parameters())
    assert count == ModelShape.from_config(config).params()
    assert count / 1e9 == pytest.approx(billions, abs=0.01)

"""scripts/device_check.sh on the CPU: the GPU path's one prepared check runs and its update
moves every weight that has a gradient (bf16 compute, fp32 master weights, checkpointing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_device_check_runs_on_cpu_and_prints_json():
    env = {**os.environ, "PYTHON": sys.executable}
    out = subprocess.run(["bash", str(ROOT / "scripts/device_check.sh"), "--device", "cpu"], check=True, env=env, capture_output=True, text=True, timeout=600)
    result = json.loads(out.stdout)
    assert [u["algorithm"] for u in result["updates"]] == ["bpo", "rloo"]
    for update in result["updates"]:
        assert update["gradient_checkpointing"] and update["master_dtype"] == "torch.float32"
        assert update["weights_moved_share"] == 1.0 and update["weight_change_l2"] > 0
        assert update["generated_tokens_per_s"] > 0 and update["trained_tokens_per_s"] > 0

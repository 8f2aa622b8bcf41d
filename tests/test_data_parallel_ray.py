"""Data-parallel training with the envs on Ray: two torchrun ranks, each with its own
RayEnvPool on one shared Ray cluster, reproduce one process with a local pool."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'bpo-gym[distributed]'")

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster that other processes join through ``RAY_ADDRESS``."""
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_every_rank_steps_its_envs_on_ray(tmp_path, cluster):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    assert torchrun, "torchrun (ships with torch) not found"
    env = {**os.environ, "PYTHONPATH": str(HERE.parent), "OMP_NUM_THREADS": "1", "RAY_ADDRESS": cluster}
    env.pop("WORLD_SIZE", None)
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    subprocess.run([sys.executable, str(HERE / "dp_ray_train.py"), str(one), "local"], check=True, env=env, timeout=300)
    subprocess.run(
        [torchrun, "--nproc_per_node=2", "--standalone", str(HERE / "dp_ray_train.py"), str(two), "ray"],
        check=True, env=env, timeout=600,
    )
    a, b = torch.load(one), torch.load(two)
    assert [r["n_trees"] for r in b["history"]] == [4, 4]
    assert b["stats"]["local_restores"] + b["stats"]["moved_restores"] > 0  # the branches restored on Ray
    for x, y in zip(a["history"], b["history"], strict=True):
        assert x["compute"]["env_steps"] == y["compute"]["env_steps"]
    for key in a["params"]:
        torch.testing.assert_close(a["params"][key], b["params"][key], rtol=0, atol=1e-6)

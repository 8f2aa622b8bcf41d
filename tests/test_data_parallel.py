"""Data-parallel training: two gloo ranks under torchrun reproduce one process.

Trees are seeded per tree (update, index), split round robin over the ranks, and the loss of
each rank is divided by the global normaliser before the gradients are summed, so after three
SGD updates the parameters of 2 ranks equal those of 1 process up to float summation order.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bpo_algos import distributed as dp

HERE = Path(__file__).resolve().parent


def test_tree_seeds_and_shards_do_not_depend_on_the_rank_count():
    assert dp.tree_seed(1, 2, 3) == dp.tree_seed(1, 2, 3) != dp.tree_seed(1, 2, 4)
    assert dp.shard_indices(5, 0, 2) == [0, 2, 4] and dp.shard_indices(5, 1, 2) == [1, 3]
    assert sorted(dp.shard_indices(7, 0, 3) + dp.shard_indices(7, 1, 3) + dp.shard_indices(7, 2, 3)) == list(range(7))
    assert dp.all_reduce_sum([1.5, 2]) == [1.5, 2.0] and dp.world_size() == 1


@pytest.mark.slow
@pytest.mark.parametrize("aggregation", ["token-mean", "step-sum"])
def test_two_gloo_ranks_give_the_parameters_of_one_process(tmp_path, aggregation):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    assert torchrun, "torchrun (ships with torch) not found"
    env = {**os.environ, "PYTHONPATH": str(HERE.parent), "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    subprocess.run([sys.executable, str(HERE / "dp_train.py"), str(one), aggregation], check=True, env=env, timeout=300)
    subprocess.run(
        [torchrun, "--nproc_per_node=2", "--standalone", str(HERE / "dp_train.py"), str(two), aggregation],
        check=True,
        env=env,
        timeout=300,
    )
    a, b = torch.load(one), torch.load(two)
    assert [r["n_trees"] for r in a["history"]] == [r["n_trees"] for r in b["history"]] == [4, 4, 4]
    for x, y in zip(a["history"], b["history"], strict=True):
        assert x["compute"]["env_steps"] == y["compute"]["env_steps"]
        assert x["success"] == pytest.approx(y["success"]) and x["loss"] == pytest.approx(y["loss"], abs=1e-6)
    init = _init()
    assert max(float((a["params"][k] - init[k]).abs().max()) for k in init) > 1e-4  # training changed the parameters
    for key in a["params"]:
        torch.testing.assert_close(a["params"][key], b["params"][key], rtol=0, atol=1e-6)
    diff = max(float((a["params"][k] - b["params"][k]).abs().max()) for k in a["params"])
    print(f"max |theta_2proc - theta_1proc| after 3 updates ({aggregation}): {diff:.3g}")


def _init() -> dict[str, torch.Tensor]:
    from bpo_algos.policy.scorer import TextScorerPolicy

    return {k: v.clone() for k, v in TextScorerPolicy(buckets=512, dim=8, hidden=16, seed=3).state_dict().items()}


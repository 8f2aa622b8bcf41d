"""Train 2 updates (BPO, TextScorerPolicy on TreeMDP) with the envs on a Ray cluster and save
the parameters: run by ``torchrun --nproc_per_node=2`` and by one process (a local pool) in
``tests/test_data_parallel_ray.py``. Every rank joins the cluster ``RAY_ADDRESS`` names."""

from __future__ import annotations

import functools
import os
import sys

import gymnasium as gym
import torch

import bpo_envs  # noqa: F401
from bpo_algos import BPO, EnvPool, Trainer, TrainerConfig
from bpo_algos.policy.scorer import TextScorerPolicy

make = functools.partial(gym.make, "BPO-TreeMDP-v0", depth=3, n_actions=3, seed=4, n_tasks=6)


def main(out: str, pool_kind: str) -> None:
    torch.set_num_threads(1)
    if pool_kind == "ray":
        from bpo_envs.ray_pool import RayEnvPool

        pool = RayEnvPool(make, actors=1, envs_per_actor=2)
    else:
        pool = EnvPool([make, make])
    policy = TextScorerPolicy(buckets=512, dim=8, hidden=16, seed=3)
    config = TrainerConfig(updates=2, tasks_per_update=4, learning_rate=0.5, optimizer="sgd", seed=11, device="cpu")
    trainer = Trainer(BPO(backbones=2, branch_factor=2, entropy_threshold=None), policy, pool, list(range(6)), config)
    history = trainer.train()
    stats = dict(getattr(pool, "stats", {}))
    pool.close()
    if trainer.rank == 0:
        torch.save({"params": {k: v.detach().clone() for k, v in policy.state_dict().items()}, "history": history, "stats": stats}, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
    from bpo_algos.data_parallel import _leave_process_group

    _leave_process_group()  # see tests/dp_train.py: skip gloo's interpreter teardown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

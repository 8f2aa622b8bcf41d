"""Train 3 updates (BPO, TextScorerPolicy on TreeMDP) and save the parameters: run by
``torchrun --nproc_per_node=2`` (gloo) and by one process in ``tests/test_data_parallel.py``."""

from __future__ import annotations

import os
import sys

import gymnasium as gym
import torch

import bpo_envs  # noqa: F401
from bpo_algos import BPO, Trainer, TrainerConfig
from bpo_algos.policy.scorer import TextScorerPolicy


def make():
    return gym.make("BPO-TreeMDP-v0", depth=3, n_actions=3, seed=4, n_tasks=6)


def main(out: str, aggregation: str = "token-mean") -> None:
    torch.set_num_threads(1)
    policy = TextScorerPolicy(buckets=512, dim=8, hidden=16, seed=3)
    config = TrainerConfig(
        updates=3,
        tasks_per_update=4,
        learning_rate=0.5,
        optimizer="sgd",
        seed=11,
        seed_per_tree=True,
        micro_batch_tokens=16,
        device="cpu",
    )
    trainer = Trainer(BPO(backbones=2, branch_factor=2, entropy_threshold=None, aggregation=aggregation), policy, [make], list(range(6)), config)
    history = trainer.train()
    if trainer.rank == 0:
        torch.save({"params": {k: v.detach().clone() for k, v in policy.state_dict().items()}, "history": history}, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
    # torch 2.13 + gloo: a rank can abort in interpreter teardown ("terminate called without an
    # active exception") after all its work is done; leave the group and skip the teardown
    from bpo_algos.distributed import _leave_process_group

    _leave_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

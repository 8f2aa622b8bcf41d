"""One-process training updates, recorded: ``tests/test_declared_capabilities_algos.py`` compares
today's Trainer with ``tests/data/one_process_update_reference.json``.

The file was written by this script on the code before the data-parallel layer moved out of the
one-process loss path (then ``Trainer -> DataParallel -> Algorithm``; now ``Trainer ->
Algorithm``), and the numbers it holds were bitwise those of today's code on the machine that
wrote it (losses, gradient norms and a SHA-256 of the final parameters). Regenerate only on
purpose (``PYTHONPATH=. python tests/one_process_reference.py OUT.json``).
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import gymnasium as gym
import torch

import bpo_envs  # noqa: F401
from baselines import GRPO, RLOO
from bpo_algos import BPO, TabularPolicy, Trainer, TrainerConfig
from bpo_algos.policy.scorer import TextScorerPolicy

ROW_KEYS = ("loss", "grad_norm", "success", "return", "n_trees", "n_steps")


def make() -> gym.Env:
    return gym.make("BPO-TreeMDP-v0", depth=3, n_actions=3, seed=1, n_tasks=4)


def _scorer() -> TextScorerPolicy:
    return TextScorerPolicy(buckets=128, dim=4, hidden=8, seed=3)


CASES: dict[str, tuple[Any, Any, dict[str, Any]]] = {
    # no micro-batches: Algorithm.loss and one backward
    "bpo-tabular": (lambda: BPO(backbones=2, branch_factor=2, entropy_threshold=None), TabularPolicy, {}),
    # step-sum with clipping
    "rloo-stepsum-clip": (lambda: RLOO(group_size=3, aggregation="step-sum"), TabularPolicy, {"max_grad_norm": 0.05}),
    # micro-batches (Algorithm.backward) over two epochs
    "grpo-scorer-micro": (lambda: GRPO(group_size=3, seed=2), _scorer, {"micro_batch_tokens": 40, "epochs": 2}),
}


def run(name: str) -> dict[str, Any]:
    algorithm, policy, overrides = CASES[name]
    config = TrainerConfig(updates=3, tasks_per_update=3, checkpoint_every=0, **overrides)
    trainer = Trainer(algorithm(), policy(), [make, make], [0, 1, 2, 3], config)
    history = trainer.train()
    digest = hashlib.sha256()
    flat = []
    for key, value in sorted(trainer.policy.state_dict().items()):
        digest.update(key.encode())
        digest.update(value.detach().cpu().numpy().tobytes())
        flat.append(value.detach().double().reshape(-1))
    params = torch.cat(flat)
    return {
        "rows": [{k: row[k] for k in ROW_KEYS} for row in history],
        "param_sum": float(params.sum()),
        "param_norm": float(params.norm()),
        "params_sha256": digest.hexdigest(),
    }


if __name__ == "__main__":
    result = {name: run(name) for name in CASES}
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")

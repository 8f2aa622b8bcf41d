"""Train 3 updates data-parallel and save the parameters: run by ``torchrun --nproc_per_node=2``
or ``accelerate launch --num_processes 2 --cpu`` (gloo) and by one process in
``tests/test_data_parallel.py``.

``--policy scorer`` (default): BPO with a TextScorerPolicy on TreeMDP. ``--policy hf``: RLOO with
signed advantages on the tiny offline Qwen2, 3 trees an update (so the 2 ranks hold different
numbers of micro-batches); ``--fsdp`` shards it with FSDP2, ``--dtype float64`` leaves summation
order as the only difference from one process, and the other options set the TrainerConfig
field or algorithm argument of their name (``--lora`` and ``--kl-coef`` the policy's and RLOO's)."""

from __future__ import annotations

import argparse
import os

import gymnasium as gym
import torch

import bpo_envs  # noqa: F401
from bpo_algos import BPO, Trainer, TrainerConfig
from bpo_algos.policy.scorer import TextScorerPolicy


def make():
    return gym.make("BPO-TreeMDP-v0", depth=3, n_actions=3, seed=4, n_tasks=6)


def make_small():
    return gym.make("BPO-TreeMDP-v0", depth=2, n_actions=3, seed=1, n_tasks=4)


def signed_rloo(kl_coef: float = 0.0):
    """RLOO with advantages +-1 by step parity within a tree (an untrained model's rewards are
    all equal: a zero advantage would leave nothing to learn from)."""
    from baselines import RLOO
    from bpo_algos.advantages import as_batch

    class SignedRLOO(RLOO):
        def compute_advantages(self, trees):
            super().compute_advantages(trees)
            for tree in as_batch(trees):
                for i, edge in enumerate(tree.edges()):
                    edge.advantage = 1.0 if i % 2 else -1.0

    return SignedRLOO(group_size=2, seed=1, kl_coef=kl_coef)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("aggregation", nargs="?", default="token-mean")
    parser.add_argument("--policy", choices=["scorer", "hf"], default="scorer")
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-grad-norm", type=float, default=None)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--kl-coef", type=float, default=0.0)
    parser.add_argument("--defaults", action="store_true", help="RLOO, TrainerConfig(updates=3) and nothing else set")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.defaults:
        from baselines import RLOO

        policy = TextScorerPolicy(buckets=512, dim=8, hidden=16, seed=3)
        if args.dtype == "float64":
            policy.double()
        trainer = Trainer(RLOO(), policy, [make], list(range(6)), TrainerConfig(updates=args.updates))
        history = trainer.train()
        if trainer.rank == 0:
            torch.save({"params": {k: v.detach().clone() for k, v in policy.state_dict().items()}, "history": history}, args.out)
        return
    if args.policy == "scorer":
        policy = TextScorerPolicy(buckets=512, dim=8, hidden=16, seed=3)
        algorithm = BPO(backbones=2, branch_factor=2, entropy_threshold=None, aggregation=args.aggregation)
        env, tasks, lr, per_update, tokens = make, list(range(6)), 0.5, 4, 16
    else:
        from bpo_algos.policy import HFPolicy
        from bpo_algos.policy.tiny import tiny_model_path

        torch.manual_seed(0)  # LoRA's adapters are initialised from torch's generator
        policy = HFPolicy(tiny_model_path(), max_new_tokens=3, device="cpu", seed=0, train_batch_size=8, dtype=getattr(torch, args.dtype), lora=args.lora or None)
        algorithm = signed_rloo(args.kl_coef)
        # 3 trees on 2 ranks: rank 1 has fewer micro-batches (zero passes under FSDP)
        env, tasks, lr, per_update, tokens = make_small, list(range(4)), 0.02, 3, 400
        if args.optimizer != "sgd":
            lr = 1e-3
    config = TrainerConfig(
        updates=args.updates,
        tasks_per_update=per_update,
        learning_rate=lr,
        optimizer=args.optimizer,
        seed=11,
        micro_batch_tokens=tokens,
        device="cpu",
        fsdp=args.fsdp,
        out_dir=args.out_dir,
        precision=args.precision,
        epochs=args.epochs,
        max_grad_norm=args.max_grad_norm,
        gradient_checkpointing=args.gradient_checkpointing,
    )
    trainer = Trainer(algorithm, policy, [env], tasks, config)
    history = trainer.train()
    probe_error = None
    if trainer.fsdp:  # the gradient probe refuses a sharded policy
        from bpo_algos.diagnostics import gradient_samples

        try:
            gradient_samples(algorithm, policy, [env], tasks[:1], 1)
        except RuntimeError as exc:
            probe_error = str(exc)
    params = trainer.policy_state_dict()  # every rank (a gather under FSDP)
    if trainer.rank == 0:
        state = {"params": {k: v.detach().clone() for k, v in params.items()}, "history": history}
        state["world_size"], state["fsdp"], state["probe_error"] = trainer.world_size, trainer.fsdp, probe_error
        torch.save(state, args.out)


if __name__ == "__main__":
    main()
    # torch 2.13 + gloo: a rank can abort in interpreter teardown ("terminate called without an
    # active exception") after all its work is done; leave the group and skip the teardown
    import sys

    from bpo_algos.data_parallel import _leave_process_group

    _leave_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

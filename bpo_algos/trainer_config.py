"""``TrainerConfig``: every setting of :class:`~bpo_algos.trainer.Trainer`, with its default."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from bpo_algos.compute import Budget

OPTIMIZERS = ("adam", "adamw", "sgd")
DEVICES = ("auto", "cuda", "cpu")
PRECISIONS = ("fp32", "bf16")
TASK_DRAWS = ("independent", "unseen-first")


@dataclass
class TrainerConfig:
    """Training settings (defaults suit a tabular policy on TreeMDP).

    Attributes:
        updates: number of collect -> update iterations.
        tasks_per_update: tasks drawn per update (one tree each; cycled while a budget remains).
        task_draw: how an update's tasks are drawn. ``independent``: each update draws
            ``tasks_per_update`` distinct tasks afresh (a task may come back in the next update).
            ``unseen-first``: the tasks are walked in a seeded permutation and each update
            starts where the last one's trees stopped, so no task is trained on twice before
            every task has been trained on once (then a new permutation; docs/alfworld.md,
            "Many training games").
        budget: per-batch budget in one compute unit (``Budget``, ``(unit, amount)`` or None).
        learning_rate: optimizer step size.
        optimizer: ``adam``, ``adamw`` or ``sgd``.
        weight_decay: optimizer weight decay.
        max_grad_norm: clip the gradient norm to this (None: no clipping; the norm is logged).
        epochs: optimizer steps per collected batch (PPO-style reuse; 1 = on-policy).
        seed: seeds task sampling, the trees' random streams (with the update and the tree's
            index: the same on one process and on N ranks) and torch.
        out_dir: where metrics.jsonl and checkpoint.pt go (None: keep in memory only).
        checkpoint_every: write a checkpoint every this many updates (0: never).
        resume: continue from ``out_dir/checkpoint.pt`` when it exists.
        tensorboard: also log to TensorBoard (needs the ``tensorboard`` package).
        wandb_project: also log to this W&B project (needs ``wandb``).
        wandb_name: the W&B run's name (e.g. ``env/algorithm/seed``).
        wandb_group: the W&B group (e.g. one comparison), so its runs are read together.
        wandb_config: the run's configuration shown in W&B (e.g. the preset).
        progress: show a progress bar.
        save_trees_every: every this many updates (and at the last), save the batch's rollout
            trees to ``out_dir/trees/updateNNNNN.json.gz`` (0: never); ``bpo-trees`` draws them.
        device: ``auto`` (the policy's own device: where it was loaded, CPU for a policy with
            no parameters yet), ``cuda`` (``cuda:LOCAL_RANK`` under torchrun) or ``cpu``; the
            policy is moved there.
        precision: ``fp32``, or ``bf16``: bfloat16 compute (autocast) with fp32 master weights
            (trainable parameters held in fp32 are what the optimizer updates).
        micro_batch_tokens: back-propagate at most this many prompt + action tokens at once
            (None: the whole batch in one backward).
        gradient_checkpointing: have the policy recompute activations in the backward pass
            (``policy.enable_gradient_checkpointing()``; an error when the policy has none).
        fsdp: under a multi-rank launch, shard ``policy.model`` (a transformers model) with
            FSDP2 (:func:`~bpo_algos.data_parallel.shard_model`; bf16 gathered weights when
            ``precision="bf16"``). The full weights are gathered once before collection and
            kept through the update (rollouts and micro-batches run without collectives, like
            verl's hybrid engine), gradients are reduce-scattered per micro-batch into shards,
            and the fp32 master weights and optimizer state stay sharded: per rank, full
            weights + sharded gradients, weights and optimizer state (+ one layer's full
            gradient). With a KL term and no LoRA the frozen reference is a full copy on
            every rank. Checkpoints hold the full state (gathered to rank 0). Ignored, with
            a warning, on one process.
    """

    updates: int = 50
    tasks_per_update: int = 8
    task_draw: str = "independent"
    budget: Budget | tuple[str, float] | dict[str, Any] | None = None
    learning_rate: float = 0.1
    optimizer: str = "adam"
    weight_decay: float = 0.0
    max_grad_norm: float | None = None
    epochs: int = 1
    seed: int = 0
    out_dir: str | os.PathLike[str] | None = None
    checkpoint_every: int = 1
    resume: bool = True
    tensorboard: bool = False
    wandb_project: str | None = None
    wandb_name: str | None = None
    wandb_group: str | None = None
    wandb_config: dict[str, Any] | None = None
    progress: bool = False
    save_trees_every: int = 0
    device: str = "auto"
    precision: str = "fp32"
    micro_batch_tokens: int | None = None
    gradient_checkpointing: bool = False
    fsdp: bool = False

    def __post_init__(self) -> None:
        for name in ("updates", "tasks_per_update", "epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.task_draw not in TASK_DRAWS:
            raise ValueError(f"task_draw must be one of {TASK_DRAWS}, got {self.task_draw!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {self.max_grad_norm}")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0, got {self.checkpoint_every}")
        if isinstance(self.save_trees_every, bool) or not isinstance(self.save_trees_every, int) or self.save_trees_every < 0:
            raise ValueError(f"save_trees_every must be an int >= 0, got {self.save_trees_every!r}")
        if self.device not in DEVICES and not str(self.device).startswith("cuda:"):
            raise ValueError(f"device must be one of {DEVICES} (or cuda:N), got {self.device!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.micro_batch_tokens is not None and (
            isinstance(self.micro_batch_tokens, bool) or not isinstance(self.micro_batch_tokens, int) or self.micro_batch_tokens < 1
        ):
            raise ValueError(f"micro_batch_tokens must be an int >= 1 or None, got {self.micro_batch_tokens!r}")
        if not isinstance(self.fsdp, bool):
            raise ValueError(f"fsdp must be a bool, got {self.fsdp!r}")
        self.budget = Budget.parse(self.budget)

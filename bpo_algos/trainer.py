"""``Trainer``: collect -> update for any algorithm, with the same optimizer, budget and seeds.

Per update it draws tasks with its own seeded generator (so every algorithm sees the same task
sequence for the same seed), collects a batch within the budget, takes ``epochs`` optimizer
steps on the algorithm's loss, and appends one JSON line to ``out_dir/metrics.jsonl``: success
rate, mean return, loss, gradient norm (before clipping), entropy, how the trees branched
(:meth:`~bpo_algos.algorithm.Batch.shape_stats`), the compute meter of the batch and the
running total. TensorBoard and W&B receive the same scalars when asked for and
installed.

Scale (the README's GPU section): ``device`` places the policy; ``precision="bf16"`` computes in
bfloat16 under autocast while the optimizer updates fp32 master weights (an AdamW step of 1e-6
on a bf16 weight rounds away); ``micro_batch_tokens`` back-propagates the loss one micro-batch at
a time with the whole batch's normaliser (the same gradient, memory bounded by a micro-batch);
``gradient_checkpointing`` asks the policy to recompute activations. Under ``torchrun`` the same
code trains data-parallel (:mod:`bpo_algos.distributed`): trees split across ranks and seeded
per tree, one global normaliser, gradients summed, meters all-reduced, files from rank 0;
``fsdp=True`` shards the model with FSDP2 there.

Checkpoints (``out_dir/checkpoint.pt``: policy, optimizer, RNG states, algorithm state such as
BPO's adaptive threshold, the metrics so far) are written atomically after each update, so a run
killed at any moment resumes (``resume=True``) losing at most the update in progress.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bpo_algos import distributed as dp
from bpo_algos.algorithm import Algorithm, Batch, merge_batches
from bpo_algos.compute import Budget, ComputeMeter, cost_flops, policy_parameters
from bpo_algos.engine import EnvFn, EnvPool
from bpo_algos.policy.base import Policy
from bpo_algos.tree import save_trees

OPTIMIZERS = ("adam", "adamw", "sgd")
DEVICES = ("auto", "cuda", "cpu")
PRECISIONS = ("fp32", "bf16")
log = logging.getLogger(__name__)


@dataclass
class TrainerConfig:
    """Training settings (defaults suit a tabular policy on TreeMDP).

    Attributes:
        updates: number of collect -> update iterations.
        tasks_per_update: tasks drawn per update (one tree each; cycled while a budget remains).
        budget: per-batch budget in one compute unit (``Budget``, ``(unit, amount)`` or None).
        learning_rate: optimizer step size.
        optimizer: ``adam``, ``adamw`` or ``sgd``.
        weight_decay: optimizer weight decay.
        max_grad_norm: clip the gradient norm to this (None: no clipping; the norm is logged).
        epochs: optimizer steps per collected batch (PPO-style reuse; 1 = on-policy).
        seed: seeds task sampling, the policy's sampling and torch.
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
        seed_per_tree: seed the policy and the engine per tree (by update and tree index)
            instead of per batch; trees are then collected one by one. None: on exactly when
            data-parallel, which is what makes N ranks reproduce one process (set it True on
            the one process to compare).
        fsdp: under a multi-rank launch, shard ``policy.model`` (a transformers model) with
            FSDP2 (:func:`~bpo_algos.distributed.shard_model`; bf16 gathered weights when
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
    seed_per_tree: bool | None = None
    fsdp: bool = False

    def __post_init__(self) -> None:
        for name in ("updates", "tasks_per_update", "epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
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


def policy_device(policy: Any) -> torch.device:
    """Where ``policy`` computes: its ``device`` attribute, else its first parameter's device,
    else the CPU."""
    device = getattr(policy, "device", None)
    if device is not None:
        return torch.device(device)
    if isinstance(policy, torch.nn.Module):
        for p in policy.parameters():
            return p.device
    return torch.device("cpu")


def resolve_device(name: str, policy: Any) -> torch.device:
    """The device ``TrainerConfig.device`` names for ``policy`` (see :class:`TrainerConfig`)."""
    if name == "auto":
        return policy_device(policy)
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(f"device={name!r} but CUDA is not available (torch.cuda.is_available() is False)")
    if name == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) if dp.is_distributed() else torch.cuda.current_device())
    return torch.device(name)


def upcast_trainable(parameters: Sequence[torch.nn.Parameter]) -> int:
    """Hold trainable parameters in fp32 (master weights), in place; returns how many changed.

    A bf16 weight ``w`` cannot move by less than about ``|w| / 256``: an lr-1e-6 step leaves most
    weights unchanged. In fp32 the step lands, and autocast still runs the matmuls in bf16."""
    changed = 0
    for p in parameters:
        if p.dtype in (torch.bfloat16, torch.float16):
            p.data = p.data.float()
            changed += 1
    return changed

def gradient_norm(parameters: Sequence[torch.nn.Parameter]) -> float:
    """L2 norm of all gradients together (accumulated in float64: a float32 sum over millions
    of squares is off in the fourth digit)."""
    norms = [torch.linalg.vector_norm(p.grad.detach(), dtype=torch.float64) for p in parameters if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


def _atomic_write(path: Path, write: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class Trainer:
    """Runs ``algorithm`` on ``policy`` over ``tasks`` (see the module docstring)."""

    def __init__(
        self,
        algorithm: Algorithm,
        policy: Policy,
        env_fns: Sequence[EnvFn] | EnvPool,
        tasks: Sequence[Any],
        config: TrainerConfig | None = None,
        **overrides: Any,
    ) -> None:
        """``overrides`` set :class:`TrainerConfig` fields directly (``Trainer(..., updates=5)``)."""
        if overrides:
            unknown = set(overrides) - set(TrainerConfig.__dataclass_fields__)
            if unknown:
                raise TypeError(f"unknown Trainer option(s) {sorted(unknown)}; see TrainerConfig")
            config = dataclasses.replace(config or TrainerConfig(), **overrides)
        if not tasks:
            raise ValueError("tasks must not be empty")
        if not isinstance(policy, torch.nn.Module):
            raise TypeError("Trainer needs a policy that is a torch.nn.Module (it owns the parameters)")
        self.algorithm = algorithm
        self.policy = policy
        self.pool = env_fns if isinstance(env_fns, EnvPool) else EnvPool(env_fns)
        self.tasks = list(tasks)
        self.config = config or TrainerConfig()
        dp.init_from_env()
        self.rank, self.world_size = dp.rank(), dp.world_size()
        self.seed_per_tree = self.config.seed_per_tree if self.config.seed_per_tree is not None else self.world_size > 1
        self.device = resolve_device(self.config.device, policy)
        if policy_device(policy) != self.device:
            policy.to(self.device)
        if self.config.precision == "bf16":
            upcast_trainable(self._trainable())
        if self.config.gradient_checkpointing:
            enable = getattr(policy, "enable_gradient_checkpointing", None)
            if not callable(enable):
                raise TypeError(f"gradient_checkpointing=True but {type(policy).__name__} has no enable_gradient_checkpointing()")
            enable()
        self.update = 0
        self.history: list[dict[str, Any]] = []
        self.total_compute = ComputeMeter()
        self._rng = np.random.default_rng(self.config.seed)
        self._anchor = torch.nn.Parameter(torch.zeros(0))
        torch.manual_seed(self.config.seed)
        if hasattr(policy, "seed"):
            policy.seed(self.config.seed)
        if self.world_size > 1:
            dp.broadcast_parameters(policy)
        self.fsdp = self._shard()
        self.optimizer = self._make_optimizer()
        # every rank keeps the history; only rank 0 writes files
        self.out_dir = Path(self.config.out_dir) if self.config.out_dir is not None and self.rank == 0 else None
        self._resume_dir = Path(self.config.out_dir) if self.config.out_dir is not None else None
        self._writers: list[Any] = []
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        dp.barrier()
        if self._resume_dir is not None and self.config.resume and (self._resume_dir / "checkpoint.pt").exists():
            self.load_checkpoint(self._resume_dir / "checkpoint.pt")  # every rank: the same state
        elif self.out_dir is not None:
            if (self.out_dir / "metrics.jsonl").exists():
                # rows without a checkpoint: a run killed during its first update, or an old run
                # this one replaces; either way they are not part of this run's history
                _atomic_write(self.out_dir / "metrics.jsonl", lambda fh: None)
        dp.barrier()

    # ---- FSDP ----------------------------------------------------------------------------
    def _shard(self) -> bool:
        """Shard ``policy.model`` when ``fsdp=True`` on several ranks (see :class:`TrainerConfig`)."""
        if not self.config.fsdp:
            return False
        if self.world_size == 1:
            log.warning("fsdp=True on one process: nothing to shard, the model trains unsharded")
            return False
        model = getattr(self.policy, "model", None)
        if not isinstance(model, torch.nn.Module) or getattr(model, "config", None) is None:
            raise TypeError(f"fsdp=True shards policy.model, a transformers model; {type(self.policy).__name__} has none")
        if getattr(self.algorithm, "kl_coef", 0.0) and callable(getattr(self.policy, "set_reference", None)):
            # the frozen reference is copied before sharding: a plain replicated copy whose
            # forwards are no collectives (LoRA needs none: its base model is the reference)
            self.policy.set_reference()
        dp.shard_model(model, mixed_precision=torch.bfloat16 if self.config.precision == "bf16" else None)
        # a micro-batch must be exactly one forward pass through the sharded model on every rank
        # (its backward is one reduce-scatter per layer): at most the rows of one forward
        self._fsdp_steps = getattr(self.policy, "train_batch_size", None)
        self._fsdp_forwards = 0
        self._fsdp_counting = False
        model.register_forward_pre_hook(self._count_forward)
        return True

    def _count_forward(self, module: torch.nn.Module, args: Any) -> None:
        if not (self._fsdp_counting and torch.is_grad_enabled()):
            return
        self._fsdp_forwards += 1
        if self._fsdp_forwards > 1:
            raise RuntimeError(
                f"fsdp=True: one micro-batch ran more than one forward pass through the sharded model "
                f"({type(self.policy).__name__} splits a micro-batch of <= {self._fsdp_steps} steps); "
                "ranks would issue different numbers of gradient reduce-scatters"
            )

    def _new_micro_batch(self) -> None:
        self._fsdp_forwards = 0

    def _zero_pass(self) -> None:
        """One forward/backward of a one-token input with zero weight: this rank's share of a
        micro-batch another rank has and it has not (the same collectives, no gradient)."""
        self._new_micro_batch()
        model = self.policy.model  # type: ignore[attr-defined]
        out = model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=self.device), use_cache=False)
        logits = out.logits if hasattr(out, "logits") else out[0]
        (logits.float().sum() * 0.0).backward()

    def _fsdp_backward(self, batch: Batch, normaliser: float) -> float:
        """Back-propagate this rank's micro-batches, then zero passes up to the largest count
        over ranks, so every rank issues the same reduce-scatters; returns this rank's loss."""
        cfg = self.config
        groups = batch.micro_batches(cfg.micro_batch_tokens, self._fsdp_steps) if batch.steps else []
        most = dp.all_reduce_max(len(groups))
        loss_value = 0.0
        self._fsdp_counting = True
        try:
            if batch.steps:
                loss_value = self.algorithm.backward(
                    self.policy,
                    batch,
                    micro_batch_tokens=cfg.micro_batch_tokens,
                    micro_batch_steps=self._fsdp_steps,
                    normaliser=normaliser,
                    before_micro_batch=self._new_micro_batch,
                )
            for _ in range(most - len(groups)):
                self._zero_pass()
        finally:
            self._fsdp_counting = False
        return loss_value

    # ---- optimizer -----------------------------------------------------------------------
    def _trainable(self) -> list[torch.nn.Parameter]:
        explicit = getattr(self.policy, "trainable_parameters", None)
        params = explicit() if callable(explicit) else self.policy.parameters()
        return [p for p in params if p.requires_grad]

    def _make_optimizer(self) -> torch.optim.Optimizer:
        # A tabular policy starts with no entries and grows; an empty anchor keeps the param
        # group non-empty and the saved optimizer state aligned with a rebuilt one on resume.
        # (under FSDP every parameter must belong to the policy: the checkpoint names them)
        params = [*self._trainable()] if self.fsdp else [self._anchor, *self._trainable()]
        cfg = self.config
        if cfg.optimizer == "adam":
            return torch.optim.Adam(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        if cfg.optimizer == "adamw":
            return torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        return torch.optim.SGD(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)

    def _sync_optimizer(self) -> None:
        """Add parameters created since the last step (new tabular entries) to the optimizer."""
        known = {id(p) for group in self.optimizer.param_groups for p in group["params"]}
        new = [p for p in self._trainable() if id(p) not in known]
        if new:
            self.optimizer.param_groups[0]["params"].extend(new)

    # ---- one update ----------------------------------------------------------------------
    def draw_tasks(self) -> list[Any]:
        k = self.config.tasks_per_update
        idx = self._rng.choice(len(self.tasks), size=k, replace=len(self.tasks) < k)
        return [self.tasks[int(i)] for i in idx]

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.config.precision != "bf16":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def _collect(self, tasks: list[Any]) -> Batch:
        """This rank's trees of the update (all of them on one process)."""
        budget = self.config.budget
        if budget is not None and self.world_size > 1:
            budget = Budget(budget.unit, budget.amount / self.world_size)
        own = dp.shard_indices(len(tasks), self.rank, self.world_size)
        if not self.seed_per_tree:
            return self.algorithm.collect(self.policy, self.pool, [tasks[i] for i in own], budget)
        parts: list[Batch] = []
        spent = 0.0
        index = iter(own) if budget is None else (self.rank + k * self.world_size for k in range(1 << 30))
        for i in index:
            if budget is not None and spent >= budget.amount:
                break
            seed = dp.tree_seed(self.config.seed, self.update, i)
            if hasattr(self.policy, "seed"):
                self.policy.seed(seed)
            part = self.algorithm.collect(self.policy, self.pool, [tasks[i % len(tasks)]], None, seed=seed, finish=False)
            parts.append(part)
            if budget is not None:
                spent += part.compute.get(budget.unit)
        batch = merge_batches(parts)
        self.algorithm.end_batch(self._global_entropies(batch, [len(p.entropies) for p in parts], own))
        return batch

    def _global_entropies(self, batch: Batch, counts: list[int], own: list[int]) -> Batch:
        """A batch carrying every rank's decision entropies in tree order (for adaptive state)."""
        if self.world_size == 1:
            return batch
        mine, start = [], 0
        for i, c in zip(own, counts, strict=False):
            mine.append((i, batch.entropies[start : start + c]))
            start += c
        pieces = sorted((item for part in dp.all_gather_objects(mine) for item in part), key=lambda t: t[0])
        return Batch(batch.algorithm, [], batch.compute, [e for _, es in pieces for e in es])

    def step(self) -> dict[str, Any]:
        """Collect one batch and update the policy on it. Returns the logged row."""
        start = time.perf_counter()
        tasks = self.draw_tasks()
        if isinstance(self.policy, torch.nn.Module):
            self.policy.eval()
        if self.fsdp:
            dp.unshard(self.policy)  # full weights for the rollouts: their forwards are local
        with self._autocast():
            batch = self._collect(tasks)
        self.policy.train()
        cfg = self.config
        distributed = self.world_size > 1
        plain = cfg.micro_batch_tokens is None and not distributed
        losses, norms = [], []
        for _ in range(cfg.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            if self.fsdp:
                dp.unshard(self.policy)  # (re)gathered after the previous epoch's step
            with self._autocast():
                if plain:
                    loss = self.algorithm.loss(self.policy, batch)
                    loss.backward()
                    loss_value = float(loss.detach())
                else:
                    z_local = self.algorithm.loss_normaliser(batch) if batch.steps else 0.0
                    trees_local = float(batch.n_trees)
                    z, n_trees = dp.all_reduce_sum([z_local, trees_local])
                    if self.algorithm.aggregation == "step-sum":
                        z = n_trees
                    if self.fsdp:
                        loss_value = self._fsdp_backward(batch, z)
                    else:
                        loss_value = (
                            self.algorithm.backward(self.policy, batch, micro_batch_tokens=cfg.micro_batch_tokens, normaliser=z)
                            if batch.steps
                            else 0.0
                        )
            if self.fsdp:
                dp.reshard(self.policy)  # the sharded parameters (and their gradients) again
            self._sync_optimizer()
            params = self._trainable()
            if self.fsdp:
                # sharded gradients are summed by FSDP; any other trainable tensor here
                dp.all_reduce_gradients([p for p in params if not dp.is_dtensor(p)])
                (loss_value,) = dp.all_reduce_sum([loss_value])
                norms.append(dp.sharded_gradient_norm(params))
                if cfg.max_grad_norm is not None:
                    dp.clip_gradients_(params, cfg.max_grad_norm, norms[-1])
            else:
                if distributed:
                    dp.check_same_parameters(params)
                    dp.all_reduce_gradients(params)
                    (loss_value,) = dp.all_reduce_sum([loss_value])
                norms.append(gradient_norm(params))
                if cfg.max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            self.optimizer.step()
            losses.append(loss_value)
        if self.fsdp and callable(getattr(self.policy, "clear_cache", None)):
            self.policy.clear_cache()  # prompt KV of the old weights
        if cfg.epochs > 1:
            # the engine charged one learner pass per recorded step; every further epoch is another
            extra = (cfg.epochs - 1) * batch.compute.train_tokens
            batch.compute.train_tokens += extra
            batch.compute.flops += cost_flops(policy_parameters(self.policy), train_tokens=extra)
        self.update += 1
        compute = self._global_compute(batch.compute) if distributed else batch.compute
        self.total_compute.add(compute)
        row = self._row(batch, losses, norms, time.perf_counter() - start)
        if distributed:
            row.update(self._global_row(batch, compute))
        self.history.append(row)
        self._log(row)
        every = self.config.save_trees_every
        if self.out_dir is not None and every and (self.update % every == 0 or self.update == self.config.updates):
            save_trees(batch.trees, self.out_dir / "trees" / f"update{self.update:05d}.json.gz")
        if self.config.checkpoint_every and self.update % self.config.checkpoint_every == 0:
            if self.out_dir is not None and not self.fsdp:
                self.save_checkpoint(self.out_dir / "checkpoint.pt")
            elif self.fsdp and self._resume_dir is not None:
                self.save_checkpoint(self._resume_dir / "checkpoint.pt")  # every rank: a gather
        dp.barrier()
        return row

    @staticmethod
    def _global_compute(meter: ComputeMeter) -> ComputeMeter:
        names = [f.name for f in fields(meter)]
        summed = dp.all_reduce_sum([getattr(meter, n) for n in names])
        return ComputeMeter(**{n: (int(v) if isinstance(getattr(meter, n), int) else v) for n, v in zip(names, summed, strict=True)})

    @staticmethod
    def _global_row(batch: Batch, compute: ComputeMeter) -> dict[str, Any]:
        """The row's batch statistics over every rank's trees (means over trees and steps)."""
        success = sum(t.success_rate() for t in batch.trees)
        returns = sum(t.mean_return() for t in batch.trees)
        neg_lp = sum(-e.action.logprob for e in batch.steps)
        ent = sum(batch.entropies)
        n_trees, n_steps, s, r, lp, e_sum, n_ent = dp.all_reduce_sum(
            [batch.n_trees, len(batch.steps), success, returns, neg_lp, ent, len(batch.entropies)]
        )
        return {
            "success": s / max(n_trees, 1),
            "return": r / max(n_trees, 1),
            "entropy": lp / n_steps if n_steps else 0.0,
            "decision_entropy": e_sum / n_ent if n_ent else None,
            "n_trees": int(n_trees),
            "n_steps": int(n_steps),
            "compute": compute.to_dict(),
        }

    def train(self, after_update: Callable[[Trainer], None] | None = None) -> list[dict[str, Any]]:
        """Run the remaining updates (all of them, or what a resumed run has left).

        ``after_update(trainer)`` is called before the first remaining update and after every
        update (with ``trainer.update`` the number of updates done): the hook for evaluations and
        probes along training. It must leave the policy's parameters and sampling RNG as it found
        them, so that what it measures does not change the run."""
        remaining = range(self.update, self.config.updates)
        if after_update is not None:
            after_update(self)
        bar = None
        if self.config.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.config.updates, initial=self.update, desc=self.algorithm.name)
        try:
            for _ in remaining:
                row = self.step()
                if after_update is not None:
                    after_update(self)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(success=f"{row['success']:.2f}", ret=f"{row['return']:.3f}")
        finally:
            if bar is not None:
                bar.close()
            for writer in self._writers:
                if hasattr(writer, "close"):
                    writer.close()
            self._writers = []
        return self.history

    def _row(self, batch: Batch, losses: list[float], norms: list[float], seconds: float) -> dict[str, Any]:
        row: dict[str, Any] = {
            "update": self.update,
            "algorithm": self.algorithm.name,
            "success": batch.success_rate(),
            "return": batch.mean_return(),
            "loss": float(np.mean(losses)),
            "grad_norm": norms[0],
            "entropy": batch.sampled_entropy(),
            "decision_entropy": float(np.mean(batch.entropies)) if batch.entropies else None,
            "n_trees": batch.n_trees,
            "n_steps": len(batch.steps),
            **batch.shape_stats(),
            "compute": batch.compute.to_dict(),
            "compute_total": self.total_compute.to_dict(),
            "seconds": seconds,
            **{k: v for k, v in self.algorithm.last_loss_stats.items()},
        }
        threshold = getattr(self.algorithm, "threshold", None)
        if threshold is not None:
            row["entropy_threshold"] = threshold
        return row

    # ---- logging -------------------------------------------------------------------------
    def _open_writers(self) -> None:
        if self._writers or self.out_dir is None:
            return
        if self.config.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise ImportError("tensorboard=True needs `pip install tensorboard`") from exc
            self._writers.append(SummaryWriter(str(self.out_dir / "tensorboard")))
        if self.config.wandb_project:
            try:
                import wandb
            except ImportError as exc:  # pragma: no cover
                raise ImportError("wandb_project needs `pip install wandb`") from exc
            # the run id lives in out_dir, so a resumed run continues the same W&B run
            id_file = self.out_dir / "wandb_id.txt"
            if not id_file.exists():
                run_id = wandb.util.generate_id().encode()
                _atomic_write(id_file, lambda fh: fh.write(run_id))
            self._writers.append(
                wandb.init(
                    project=self.config.wandb_project,
                    id=id_file.read_text().strip(),
                    name=self.config.wandb_name,
                    group=self.config.wandb_group,
                    config={"algorithm": self.algorithm.config(), **(self.config.wandb_config or {})},
                    dir=str(self.out_dir),
                    resume="allow",
                )
            )

    def _log(self, row: dict[str, Any]) -> None:
        if self.out_dir is None:
            return
        with open(self.out_dir / "metrics.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
        self._open_writers()
        scalars = {k: v for k, v in row.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        scalars.update({f"compute/{k}": v for k, v in row["compute_total"].items()})
        for writer in self._writers:
            if hasattr(writer, "add_scalar"):
                for key, value in scalars.items():
                    writer.add_scalar(key, value, self.update)
            else:
                writer.log(scalars, step=self.update)

    # ---- checkpoints ---------------------------------------------------------------------
    def policy_state_dict(self) -> dict[str, Any]:
        """The policy's full state dict (``policy.state_dict()``; under FSDP gathered to rank 0,
        empty on the other ranks, and every rank must call it)."""
        if self.fsdp:
            return dp.full_state_dicts(self.policy, self.optimizer)[0]
        return self.policy.state_dict()

    def save_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Write everything needed to resume, atomically.

        Under FSDP every rank must call it (the full weights and optimizer state are gathered
        to rank 0, which writes; the weights' keys are those of the unsharded policy)."""
        if self.fsdp:
            policy_state, optimizer_state = dp.full_state_dicts(self.policy, self.optimizer)
            if self.rank != 0:
                return
        else:
            policy_state, optimizer_state = self.policy.state_dict(), self.optimizer.state_dict()
        state = {
            "update": self.update,
            "algorithm_name": self.algorithm.name,
            "fsdp": self.fsdp,
            "policy": policy_state,
            "optimizer": optimizer_state,
            "algorithm": self.algorithm.state_dict(),
            "trainer_rng": self._rng.bit_generator.state,
            "policy_rng": self.policy.rng_state() if hasattr(self.policy, "rng_state") else None,
            "torch_rng": torch.get_rng_state(),
            "history": self.history,
            "total_compute": self.total_compute.to_dict(),
            "config": {k: (v.to_dict() if isinstance(v, Budget) else v) for k, v in vars(self.config).items() if k != "out_dir"},
        }
        _atomic_write(Path(path), lambda fh: torch.save(state, fh))

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Restore a checkpoint written by :meth:`save_checkpoint`."""
        state = torch.load(path, map_location="cpu", weights_only=False)
        if state.get("algorithm_name") != self.algorithm.name:
            raise ValueError(
                f"{path} is a checkpoint of {state.get('algorithm_name')!r}, not of "
                f"{self.algorithm.name!r}: use another out_dir or resume=False"
            )
        if bool(state.get("fsdp", False)) != self.fsdp:
            raise ValueError(
                f"{path} was written {'with' if state.get('fsdp') else 'without'} FSDP sharding and this "
                f"run is {'sharded' if self.fsdp else 'not sharded'}: their optimizer states differ in "
                "form; resume with the same fsdp setting and number of ranks > 1, or resume=False"
            )
        if self.fsdp:
            self.optimizer = self._make_optimizer()
            dp.load_full_state_dicts(self.policy, self.optimizer, state["policy"], state["optimizer"])
        else:
            self.policy.load_state_dict(state["policy"])  # first: a tabular policy grows entries here
            self.optimizer = self._make_optimizer()
            self.optimizer.load_state_dict(state["optimizer"])
        self.algorithm.load_state_dict(state["algorithm"])
        self._rng.bit_generator.state = state["trainer_rng"]
        if state["policy_rng"] is not None:
            self.policy.set_rng_state(state["policy_rng"])
        torch.set_rng_state(state["torch_rng"])
        self.update = state["update"]
        self.history = list(state["history"])
        self.total_compute = ComputeMeter.from_dict(state["total_compute"])
        if self.out_dir is not None:
            # rows logged after the checkpoint belong to an update that will be redone
            lines = "".join(json.dumps(row) + "\n" for row in self.history)
            _atomic_write(self.out_dir / "metrics.jsonl", lambda fh: fh.write(lines.encode()))

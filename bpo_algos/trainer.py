"""``Trainer``: collect -> update for any algorithm, with the same optimizer, budget and seeds.

Per update it draws tasks with its own seeded generator (so every algorithm sees the same task
sequence for the same seed), collects a batch within the budget, takes ``epochs`` optimizer
steps on the algorithm's loss, and appends one JSON line to ``out_dir/metrics.jsonl``: success
rate, mean return, loss, gradient norm (before clipping), entropy, how the trees branched
(:meth:`~bpo_algos.algorithm.Batch.shape_stats`), the compute meter of the batch and the
running total. TensorBoard and W&B receive the same scalars when asked for and
installed.

Checkpoints (``out_dir/checkpoint.pt``: policy, optimizer, RNG states, algorithm state such as
BPO's adaptive threshold, the metrics so far) are written atomically after each update, so a run
killed at any moment resumes (``resume=True``) losing at most the update in progress.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bpo_algos.algorithm import Algorithm, Batch
from bpo_algos.compute import Budget, ComputeMeter
from bpo_algos.engine import EnvFn, EnvPool
from bpo_algos.policy.base import Policy
from bpo_algos.tree import save_trees

OPTIMIZERS = ("adam", "adamw", "sgd")


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
        self.budget = Budget.parse(self.budget)


def gradient_norm(parameters: Sequence[torch.nn.Parameter]) -> float:
    """L2 norm of all gradients together."""
    grads = [p.grad.detach().flatten() for p in parameters if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.cat(grads))) if grads else 0.0


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
        self.update = 0
        self.history: list[dict[str, Any]] = []
        self.total_compute = ComputeMeter()
        self._rng = np.random.default_rng(self.config.seed)
        self._anchor = torch.nn.Parameter(torch.zeros(0))
        torch.manual_seed(self.config.seed)
        if hasattr(policy, "seed"):
            policy.seed(self.config.seed)
        self.optimizer = self._make_optimizer()
        self.out_dir = Path(self.config.out_dir) if self.config.out_dir is not None else None
        self._writers: list[Any] = []
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            if self.config.resume and (self.out_dir / "checkpoint.pt").exists():
                self.load_checkpoint(self.out_dir / "checkpoint.pt")
            elif (self.out_dir / "metrics.jsonl").exists():
                # rows without a checkpoint: a run killed during its first update, or an old run
                # this one replaces; either way they are not part of this run's history
                _atomic_write(self.out_dir / "metrics.jsonl", lambda fh: None)

    # ---- optimizer -----------------------------------------------------------------------
    def _trainable(self) -> list[torch.nn.Parameter]:
        explicit = getattr(self.policy, "trainable_parameters", None)
        params = explicit() if callable(explicit) else self.policy.parameters()
        return [p for p in params if p.requires_grad]

    def _make_optimizer(self) -> torch.optim.Optimizer:
        # A tabular policy starts with no entries and grows; an empty anchor keeps the param
        # group non-empty and the saved optimizer state aligned with a rebuilt one on resume.
        params = [self._anchor, *self._trainable()]
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

    def step(self) -> dict[str, Any]:
        """Collect one batch and update the policy on it. Returns the logged row."""
        start = time.perf_counter()
        tasks = self.draw_tasks()
        if isinstance(self.policy, torch.nn.Module):
            self.policy.eval()
        batch = self.algorithm.collect(self.policy, self.pool, tasks, self.config.budget)
        self.policy.train()
        losses, norms = [], []
        for _ in range(self.config.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.algorithm.loss(self.policy, batch)
            loss.backward()
            self._sync_optimizer()
            params = self._trainable()
            norms.append(gradient_norm(params))
            if self.config.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm)
            self.optimizer.step()
            losses.append(float(loss.detach()))
        self.update += 1
        self.total_compute.add(batch.compute)
        row = self._row(batch, losses, norms, time.perf_counter() - start)
        self.history.append(row)
        self._log(row)
        every = self.config.save_trees_every
        if self.out_dir is not None and every and (self.update % every == 0 or self.update == self.config.updates):
            save_trees(batch.trees, self.out_dir / "trees" / f"update{self.update:05d}.json.gz")
        if self.out_dir is not None and self.config.checkpoint_every and self.update % self.config.checkpoint_every == 0:
            self.save_checkpoint(self.out_dir / "checkpoint.pt")
        return row

    def train(self) -> list[dict[str, Any]]:
        """Run the remaining updates (all of them, or what a resumed run has left)."""
        remaining = range(self.update, self.config.updates)
        bar = None
        if self.config.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.config.updates, initial=self.update, desc=self.algorithm.name)
        try:
            for _ in remaining:
                row = self.step()
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
    def save_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Write everything needed to resume, atomically."""
        state = {
            "update": self.update,
            "algorithm_name": self.algorithm.name,
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
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
        self.policy.load_state_dict(state["policy"])
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

"""``Trainer``: collect -> update for any algorithm, with the same optimizer, budget and seeds.

Per update it draws tasks with its own seeded generator (so every algorithm sees the same task
sequence for the same seed), collects a batch within the budget, takes ``epochs`` optimizer
steps on the algorithm's loss, and appends one JSON line to ``out_dir/metrics.jsonl``: success
rate, mean return, loss, gradient norm (before clipping), entropy, how the trees branched
(:meth:`~bpo_algos.algorithm.Batch.shape_stats`), the compute meter of the batch and the
running total. TensorBoard and W&B receive the same scalars when asked for and
installed. An algorithm whose loss is zero by construction (the positive control ``frozen``) may
skip the collection of every update after a checked first one, its budget reported as spent
(:meth:`Trainer.train`'s ``skip_zero_loss_collection``).

Scale (the README's GPU section): ``device`` places the policy; ``precision="bf16"`` computes in
bfloat16 under autocast while the optimizer updates fp32 master weights (an AdamW step of 1e-6
on a bf16 weight rounds away); ``micro_batch_tokens`` back-propagates the loss one micro-batch at
a time with the whole batch's normaliser (the same gradient, memory bounded by a micro-batch);
``gradient_checkpointing`` asks the policy to recompute activations. Under ``torchrun`` the same
code trains data-parallel (:mod:`bpo_algos.data_parallel`): trees split across ranks, each
with its own random stream as on one process (:meth:`Trainer.collect`), one global normaliser, gradients summed, meters all-reduced, files from rank 0;
``fsdp=True`` shards the model with FSDP2 there.

The loss path: on one process :meth:`Trainer.optimize` calls the algorithm directly
(``Algorithm.loss`` and one backward, or ``Algorithm.backward`` per micro-batch) and takes the
gradient norm and clipping itself; nothing of :mod:`bpo_algos.data_parallel` runs. On several
ranks a :class:`~bpo_algos.data_parallel.DataParallel` wraps that same algorithm call (global
normaliser before, summed gradients after); docs/training.md.

Reading guide: ``# ALGO LOGIC: ...`` / ``# end ALGO LOGIC`` banners mark the algorithm's own
rules (which tasks, the loss, the optimizer step); the rest is metering, logging, data
parallelism and checkpoints.

Settings: :class:`~bpo_algos.trainer_config.TrainerConfig`. Logs: :mod:`bpo_algos.run_log`.
Checkpoints (:mod:`bpo_algos.checkpoints`) are written atomically after each update, so a run
killed at any moment resumes (``resume=True``) losing at most the update in progress.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bpo_algos import checkpoints
from bpo_algos import data_parallel as dp
from bpo_algos.algorithm import Algorithm, Batch
from bpo_algos.compute import Budget, ComputeMeter, cost_flops
from bpo_algos.devices import autocast, policy_device, resolve_device, upcast_trainable
from bpo_algos.losses import gradient_norm
from bpo_algos.policy.base import Policy
from bpo_algos.policy.weights import state_digest
from bpo_algos.rollout import EnvFn, EnvPool, tree_entropies
from bpo_algos.run_log import RunLog
from bpo_algos.trainer_config import TrainerConfig
from bpo_algos.tree import save_trees

__all__ = ["Trainer", "TrainerConfig", "ZERO_STEP_OPTIMIZERS"]

ZERO_STEP_OPTIMIZERS = ("adam", "adamw", "sgd")
"""Optimizers whose step at a zero gradient, without weight decay and from zero moments (a
zero-loss run's: its gradient was always zero), is zero: Adam's ``m / (sqrt(v) + eps)`` with
``m = v = 0``, SGD's ``lr * g``. :meth:`Trainer.skip_refusal` asks for one of them."""

log = logging.getLogger(__name__)


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
        self.config = cfg = config or TrainerConfig()
        dp.init_from_env()  # first: under torchrun, device="cuda" means this rank's GPU
        # where the policy computes, in which precision
        self.device = resolve_device(cfg.device, policy)
        if policy_device(policy) != self.device:
            policy.to(self.device)
        if cfg.precision == "bf16":
            upcast_trainable(self.trainable())
        if cfg.gradient_checkpointing:
            policy.enable_gradient_checkpointing()
        # the run's state, seeded
        self.update = 0
        self.history: list[dict[str, Any]] = []
        self.total_compute = ComputeMeter()
        self.last_batch: Batch | None = None
        """The batch of the last update (its advantages written): what measurements of the
        training data read (the main job's mechanism, docs/mechanism.md)."""
        self._last_collected: ComputeMeter | None = None  # the last collected batch's meter (skipped_step)
        self._collected_digest: str | None = None  # set by the update train checks
        self._rng = np.random.default_rng(cfg.seed)
        self._task_order: list[int] = []  # task_draw="unseen-first": the walk through the tasks
        self._task_cursor = 0
        torch.manual_seed(cfg.seed)
        policy.seed(cfg.seed)
        # one process: no data-parallel layer at all; N ranks: one around the algorithm's loss
        # (the same weights everywhere, maybe sharded)
        self.rank, self.world_size = dp.rank(), dp.world_size()
        self.parallel: dp.DataParallel | None = None
        if self.world_size > 1:
            self.parallel = dp.DataParallel(policy, algorithm, fsdp=cfg.fsdp, precision=cfg.precision, device=self.device)
        elif cfg.fsdp:
            log.warning("fsdp=True on one process: nothing to shard, the model trains unsharded")
        self.fsdp = self.parallel is not None and self.parallel.fsdp
        # an empty tensor keeps the optimizer's parameter group non-empty while a tabular
        # policy has no entries yet, and a rebuilt optimizer aligned with a saved one on resume
        # (not under FSDP: there every optimized parameter belongs to the policy's checkpoint)
        self._placeholder = torch.nn.Parameter(torch.zeros(0))
        self.optimizer = self.make_optimizer()
        # files: every rank keeps the history; rank 0 writes
        self._resume_dir = Path(cfg.out_dir) if cfg.out_dir is not None else None
        self.out_dir = self._resume_dir if self.rank == 0 else None
        self.log = RunLog(
            self.out_dir, tensorboard=cfg.tensorboard, wandb_project=cfg.wandb_project, wandb_name=cfg.wandb_name,
            wandb_group=cfg.wandb_group, wandb_config={"algorithm": algorithm.config(), **(cfg.wandb_config or {})},
        )
        dp.barrier()
        resumed = False
        if self._resume_dir is not None and cfg.resume and (self._resume_dir / "checkpoint.pt").exists():
            try:
                self.load_checkpoint(self._resume_dir / "checkpoint.pt")  # every rank: the same state
                resumed = True
            except checkpoints.CheckpointUnreadableError as exc:
                # as a bad policy.pt: the run is redone from its start (nothing was loaded)
                warnings.warn(f"{exc}; redoing this run from its start", RuntimeWarning, stacklevel=2)
        if not resumed and self.log.path is not None and self.log.path.exists():
            # rows without a checkpoint: a run killed during its first update, or an old run
            # this one replaces; either way they are not part of this run's history
            self.log.rewrite([])
        dp.barrier()

    # ---- the loop ------------------------------------------------------------------------
    def train(self, after_update: Callable[[Trainer], None] | None = None, *,
              skip_zero_loss_collection: bool = False) -> list[dict[str, Any]]:
        """Run the remaining updates (all of them, or what a resumed run has left).

        ``after_update(trainer)`` is called before the first remaining update and after every
        update (with ``trainer.update`` the number of updates done): the hook for evaluations and
        probes along training. It must leave the policy's parameters and sampling RNG as it found
        them, so that what it measures does not change the run.

        ``skip_zero_loss_collection``: where :meth:`skip_refusal` finds nothing against it (an
        algorithm whose loss is zero by construction, :attr:`Algorithm.zero_loss`; an optimizer
        step that leaves the weights as they are at a zero gradient; a per-update budget), the
        first update of this call collects and trains as usual and is checked
        (:meth:`_check_unchanged`): the policy's whole state
        (:func:`~bpo_algos.policy.weights.state_digest`) the same before it, after its
        collection and after its step, loss and gradient norm exactly 0. Then every later update
        collects nothing (:meth:`skipped_step`): the policy, and so every evaluation of it, is
        what collecting would have left, ``S_{u+1} = S_u``. A step that moved the state raises
        :class:`RuntimeError` (the algorithm's zero loss is false); a collection that changed
        it (a tabular policy's new entries), or anything :meth:`skip_refusal` names, leaves
        every update collecting (logged)."""
        refusal = self.skip_refusal() if skip_zero_loss_collection else "not asked"
        if skip_zero_loss_collection and refusal is not None:
            log.info("%s collects every update: %s", self.algorithm.name, refusal)
        checked = False
        if after_update is not None:
            after_update(self)
        bar = None
        if self.config.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.config.updates, initial=self.update, desc=self.algorithm.name)
        try:
            while self.update < self.config.updates:
                if refusal is None and checked:
                    row = self.skipped_step()
                elif refusal is None:
                    before = state_digest(self.policy)
                    self._collected_digest = ""  # not None: step records the state its collection left
                    row = self.step()
                    refusal = self._check_unchanged(before, row)
                    checked = True
                else:
                    row = self.step()
                if after_update is not None:
                    after_update(self)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(success=f"{row['success']:.2f}", ret=f"{row['return']:.3f}")
        finally:
            if bar is not None:
                bar.close()
            self.log.close()
        return self.history

    def skip_refusal(self) -> str | None:
        """Why updates of this run may not skip their collection (``train``'s
        ``skip_zero_loss_collection``), or None when they may: the algorithm's loss is zero by
        construction (:attr:`Algorithm.zero_loss`); the optimizer's step at a zero gradient is
        zero (Adam, AdamW and SGD without weight decay: AdamW's decoupled decay ``theta -= lr
        wd theta`` moves the weights whatever the gradient); one process; a per-update budget
        in a metered unit (what a skipped update reports as spent); a policy whose whole state
        has a digest (:func:`~bpo_algos.policy.weights.state_digest`; not an LLM policy)."""
        cfg = self.config
        if not self.algorithm.zero_loss:
            return f"{self.algorithm.name}'s loss is not zero by construction"
        if cfg.weight_decay:
            return f"weight decay {cfg.weight_decay} moves the weights at a zero gradient"
        if cfg.optimizer not in ZERO_STEP_OPTIMIZERS:
            return f"optimizer {cfg.optimizer!r} is not known to leave the weights at a zero gradient"
        if self.world_size > 1:
            return "data-parallel training (the check is made on one process)"
        if cfg.budget is None or cfg.budget.unit not in {f.name for f in dataclasses.fields(ComputeMeter)}:
            return "no per-update budget in a metered unit to report as spent"
        if state_digest(self.policy) is None:
            return "the policy's state has no digest (an LLM policy: its evaluation depends on more)"
        return None

    def _check_unchanged(self, before: str | None, row: dict[str, Any]) -> str | None:
        """After the update a skipping run checks: None when the skip may go on (the state
        ``before`` the update, the one its collection left and the one after its step are the
        same, loss and gradient norm 0), a refusal when the collection itself changed the state
        (a tabular policy adds entries as it meets states: a run that skips would end in
        another state), RuntimeError when the step did (the algorithm's zero loss is false).
        The collected batch's trees are saved now when trees are saved (the last a skipping run
        collects)."""
        collected, self._collected_digest = self._collected_digest, None
        if collected != before:
            log.info("%s collects every update: its collection changed the policy's state", self.algorithm.name)
            return "the collection changes the policy's state"
        after = state_digest(self.policy)
        if after != collected or row["loss"] != 0.0 or row["grad_norm"] != 0.0:
            raise RuntimeError(
                f"{self.algorithm.name} declares a zero loss (Algorithm.zero_loss) but update {self.update} had loss {row['loss']}, "
                f"gradient norm {row['grad_norm']} and {'moved' if after != collected else 'kept'} the policy: its collection cannot be skipped"
            )
        every = self.config.save_trees_every
        if self.out_dir is not None and every and self.last_batch is not None and not (self.update % every == 0 or self.update == self.config.updates):
            save_trees(self.last_batch.trees, self.out_dir / "trees" / f"update{self.update:05d}.json.gz")
        return None

    def skipped_step(self) -> dict[str, Any]:
        """One update of a zero-loss algorithm without collection (``train``'s
        ``skip_zero_loss_collection``, after the checked update): the policy and the optimizer
        are left as they are (a zero-gradient step is zero), no tasks are drawn, no mechanism
        batch is kept (:attr:`last_batch` None). It reports its budget as spent: the last
        collected batch's meter ``m`` scaled to the per-update budget ``B`` in its unit ``k``,
        ``m * B / m_k`` (the budget unit exactly ``B``, known before collecting; every other
        meter, which only collecting measures, in the proportions of a batch of the same
        algorithm on the same policy). The row's ``success`` and ``return`` (of a training batch)
        are NaN and ``"collected"`` is False; loss and gradient norm are 0. Returns the row."""
        start = time.perf_counter()
        budget, measured = self.config.budget, self._last_collected
        spent = measured.get(budget.unit) if measured is not None and budget is not None else 0
        if budget is None or measured is None or not spent > 0:
            raise RuntimeError("a skipped update reports the last collected batch's cost scaled to the budget: none was collected")
        scale = budget.amount / spent
        compute = ComputeMeter(**{f.name: getattr(measured, f.name) * scale for f in dataclasses.fields(ComputeMeter)})
        setattr(compute, budget.unit, budget.amount)  # exactly, not up to the scaling's rounding
        self.update += 1
        self.last_batch = None
        self.total_compute.add(compute)
        nan = float("nan")
        row: dict[str, Any] = {
            "update": self.update, "algorithm": self.algorithm.name, "collected": False, "success": nan, "return": nan,
            "loss": 0.0, "grad_norm": 0.0, "compute": compute.to_dict(), "compute_total": self.total_compute.to_dict(),
            "seconds": time.perf_counter() - start,
        }
        self.history.append(row)
        self.log.write(row, self.update)
        cfg = self.config
        if cfg.checkpoint_every and self.update % cfg.checkpoint_every == 0 and self.out_dir is not None:
            self.save_checkpoint(self.out_dir / "checkpoint.pt")
        return row

    def step(self) -> dict[str, Any]:
        """One update: collect -> advantages -> micro-batched update -> log -> checkpoint.
        Returns the logged row."""
        start = time.perf_counter()
        tasks = self.draw_tasks()
        self.policy.eval()
        self.gather_weights()
        with autocast(self.config.precision, self.device):
            batch = self.collect(tasks)  # the algorithm writes the advantages
        self._advance_tasks(batch, len(tasks))
        if self._collected_digest is not None:  # train's check: the state the collection left
            self._collected_digest = state_digest(self.policy)
        self.policy.train()
        losses, norms = [], []
        # ALGO LOGIC: ``epochs`` optimizer steps on the batch (Trainer.optimize)
        for _ in range(self.config.epochs):
            loss, norm = self.optimize(batch)
            losses.append(loss)
            norms.append(norm)
        # end ALGO LOGIC
        if self.parallel is not None:
            self.parallel.clear_cache()
        if self.config.epochs > 1:
            # the engine charged one learner pass per recorded step; every further epoch is another
            extra = (self.config.epochs - 1) * batch.compute.train_tokens
            batch.compute.train_tokens += extra
            batch.compute.flops += cost_flops(self.policy.flops_parameters(), train_tokens=extra)
        self.update += 1
        self.last_batch = batch
        compute = batch.compute if self.parallel is None else self.parallel.global_compute(batch.compute)
        self._last_collected = compute.copy()
        self.total_compute.add(compute)
        row = self._row(batch, losses, norms, time.perf_counter() - start)
        if self.parallel is not None:
            row.update(self.parallel.global_row(batch, compute))
        self.history.append(row)
        self.log.write(row, self.update)
        self._save(batch)
        dp.barrier()
        return row

    def draw_tasks(self) -> list[Any]:
        """The update's tasks, drawn with the trainer's own seeded generator (the same sequence
        for every algorithm, and on every rank); see :attr:`TrainerConfig.task_draw`."""
        k = self.config.tasks_per_update
        if self.config.task_draw == "unseen-first":
            # enough of the walk for k tasks, a new permutation appended when it runs out
            while len(self._task_order) - self._task_cursor < min(k, len(self.tasks)):
                self._task_order = self._task_order[self._task_cursor :] + [int(i) for i in self._rng.permutation(len(self.tasks))]
                self._task_cursor = 0
            idx = self._task_order[self._task_cursor : self._task_cursor + k]
            return [self.tasks[i] for i in idx]
        idx = self._rng.choice(len(self.tasks), size=k, replace=len(self.tasks) < k)
        return [self.tasks[int(i)] for i in idx]

    def _advance_tasks(self, batch: Batch, drawn: int) -> None:
        """``unseen-first``: move the walk past the tasks this update's trees were built on
        (tree ``i`` is on drawn task ``i % drawn``; a budget decides how many start)."""
        if self.config.task_draw != "unseen-first" or not batch.trees:
            return
        per_task = max(1, int(self.algorithm.trees_per_task))
        used = max(t.index // per_task for t in batch.trees) + 1
        if self.world_size > 1:
            used = dp.all_reduce_max(used)
        self._task_cursor += min(used, drawn)

    def collect(self, tasks: list[Any]) -> Batch:
        """This rank's trees of the update (all of them on one process).

        One rule for every launch: tree ``i`` of update ``u`` has the random stream
        ``(seed, u, i)`` (:mod:`bpo_algos.rollout`), rank ``r`` of ``N`` builds the trees
        ``i = r, r + N, ...`` (all of them on one process) in one collection, policy calls
        batched over the trees in flight, and the algorithm's budget start rule decides how
        many start (each rank on its ``1/N`` share of the budget). Without a budget the batch is
        the same on 1, 2 or 8 ranks; the adaptive state (:meth:`Algorithm.end_batch`) sees every
        rank's decision entropies in tree order."""
        budget = self.config.budget
        if budget is not None and self.world_size > 1:
            budget = Budget(budget.unit, budget.amount / self.world_size)
        if budget is None:
            indices: Any = dp.shard_indices(len(tasks), self.rank, self.world_size)
        else:
            indices = itertools.count(self.rank, self.world_size)
        seed = dp.update_seed(self.config.seed, self.update)
        # ALGO LOGIC: the batch (Algorithm.collect: the topology builds the trees, the estimator
        # writes the advantages) and the adaptive state later batches branch by (end_batch)
        batch = self.algorithm.collect(self.policy, self.pool, tasks, budget, seed=seed, tree_indices=indices, finish=False)
        if self.parallel is None:
            self.algorithm.end_batch(batch)
        else:
            entropies = self.parallel.global_entropies([(t.index, tree_entropies(t)) for t in batch.trees])
            self.algorithm.end_batch(Batch(batch.algorithm, batch.trees, batch.compute, entropies))
        # end ALGO LOGIC
        return batch

    def optimize(self, batch: Batch) -> tuple[float, float]:
        """One optimizer step on ``batch``; returns the loss and the gradient norm before
        clipping.

        One process: ``Trainer -> Algorithm`` (:meth:`backward`), then the norm and clipping
        here. Several ranks: the data-parallel layer wraps the same algorithm call
        (:meth:`~bpo_algos.data_parallel.DataParallel.gradient`: the global normaliser before
        it, the gradients summed after it), so the step sees the whole batch's gradient."""
        cfg = self.config
        self.optimizer.zero_grad(set_to_none=True)
        if self.parallel is None:
            with autocast(cfg.precision, self.device):
                loss = self.backward(batch)
            params = self._parameters_to_step()
            norm = gradient_norm(params)
            if cfg.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        else:
            loss, norm = self.parallel.gradient(
                batch, cfg.micro_batch_tokens, cfg.max_grad_norm, self._parameters_to_step,
                lambda: autocast(cfg.precision, self.device),
            )
        # ALGO LOGIC: the policy update (one optimizer step on the whole batch's clipped gradient)
        self.optimizer.step()
        # end ALGO LOGIC
        return loss, norm

    def backward(self, batch: Batch) -> float:
        """One process: accumulate ``d loss / d theta`` of the whole ``batch``; returns the loss.

        Without micro-batches the algorithm's :meth:`~bpo_algos.algorithm.Algorithm.loss` and one
        backward; with ``micro_batch_tokens`` its :meth:`~bpo_algos.algorithm.Algorithm.backward`,
        one micro-batch at a time over the batch's own normaliser (a batch with no steps then
        has no gradient and loss 0)."""
        tokens = self.config.micro_batch_tokens
        # ALGO LOGIC: the loss (clipped surrogate + KL, weights of rule 3; bpo_algos.losses)
        if tokens is None:
            loss = self.algorithm.loss(self.policy, batch)
            loss.backward()
            value = float(loss.detach())
        elif not batch.steps:
            value = 0.0
        else:
            value = self.algorithm.backward(self.policy, batch, micro_batch_tokens=tokens)
        # end ALGO LOGIC
        return value

    def _parameters_to_step(self) -> list[torch.nn.Parameter]:
        """The parameters the step updates, new tabular entries added to the optimizer first."""
        self._add_new_parameters()
        return self.trainable()

    def gather_weights(self) -> None:
        """Under FSDP, the full weights on every rank for forwards that are not collectives
        (collection, evaluation); a no-op otherwise."""
        if self.parallel is not None:
            self.parallel.gather_weights()

    def shard_weights(self) -> None:
        """Under FSDP, the sharded parameters again after :meth:`gather_weights`; a no-op otherwise."""
        if self.parallel is not None:
            self.parallel.shard_weights()

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
            **self.algorithm.last_loss_stats,
        }
        if self.algorithm.threshold is not None:
            row["entropy_threshold"] = self.algorithm.threshold
        return row

    def _save(self, batch: Batch) -> None:
        """The batch's trees when due, and the checkpoint (under FSDP every rank: a gather)."""
        cfg = self.config
        every = cfg.save_trees_every
        if self.out_dir is not None and every and (self.update % every == 0 or self.update == cfg.updates):
            save_trees(batch.trees, self.out_dir / "trees" / f"update{self.update:05d}.json.gz")
        if cfg.checkpoint_every and self.update % cfg.checkpoint_every == 0:
            if self.out_dir is not None and not self.fsdp:
                self.save_checkpoint(self.out_dir / "checkpoint.pt")
            elif self.fsdp and self._resume_dir is not None:
                self.save_checkpoint(self._resume_dir / "checkpoint.pt")

    # ---- optimizer -----------------------------------------------------------------------
    def trainable(self) -> list[torch.nn.Parameter]:
        """The parameters the optimizer updates (``policy.trainable_parameters()``)."""
        return [p for p in self.policy.trainable_parameters() if p.requires_grad]

    _trainable = trainable

    def make_optimizer(self) -> torch.optim.Optimizer:
        params = self.trainable() if self.fsdp else [self._placeholder, *self.trainable()]
        cfg = self.config
        optimizer = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[cfg.optimizer]
        return optimizer(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)

    def _add_new_parameters(self) -> None:
        """Add parameters created since the last step (new tabular entries) to the optimizer."""
        known = {id(p) for group in self.optimizer.param_groups for p in group["params"]}
        new = [p for p in self.trainable() if id(p) not in known]
        if new:
            self.optimizer.param_groups[0]["params"].extend(new)

    # ---- checkpoints (bpo_algos.checkpoints) ---------------------------------------------
    def policy_state_dict(self) -> dict[str, Any]:
        """The policy's full state dict (under FSDP gathered to rank 0; every rank calls it)."""
        return checkpoints.policy_state_dict(self)

    def save_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Write everything needed to resume, atomically (under FSDP every rank calls it)."""
        checkpoints.save_checkpoint(self, path)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Restore a checkpoint written by :meth:`save_checkpoint`."""
        checkpoints.load_checkpoint(self, path)

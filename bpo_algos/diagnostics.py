"""Gradient diagnostics shared by ``scripts/variance.py``, ``scripts/compare.py`` and the tests.

At fixed parameters, every algorithm's gradient estimate is measured the same way: collect a
batch, back-propagate its loss, read minus the gradient (the ascent direction), repeat with
fresh randomness. From those samples:

* bias: z-scores of the sample mean against a known gradient, along the true gradient's
  direction and a few random unit directions (coordinates alone are too skewed);
* variance: ``tr Cov(g)`` (the expected squared distance to the mean), the variance along the
  true gradient's direction, and the variance of ``||g||``;
* noise-to-signal: ``tr Cov(g) / ||E g||^2``, with ``||E g||^2`` estimated without bias as
  ``||mean||^2 - tr Cov(g) / n``. Scale-free: GRPO's std-divided advantages inflate its
  gradient (and its variances) by a constant, not its noise-to-signal ratio;
* per unit of compute: variance x mean cost per sample. Averaging ``B / c`` independent samples
  of cost ``c`` within a budget ``B`` gives variance ``var * c / B``, so ``var * c`` is the
  budget-free figure of merit (lower is better).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bpo_algos.algorithm import Algorithm
from bpo_algos.compute import Budget
from bpo_algos.engine import EnvFn, EnvPool


def flat_gradient(parameters: Sequence[torch.nn.Parameter]) -> torch.Tensor:
    """All gradients as one vector (zeros where a parameter has none)."""
    if not parameters:
        return torch.zeros(0)
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in parameters])


@dataclass
class GradientSamples:
    """Independent gradient estimates at fixed parameters, with what each cost."""

    grads: torch.Tensor  # [n, n_params], ascent direction (minus the loss gradient)
    costs: list[dict[str, float]]  # compute meter of each sample's batch
    n_trees: list[int]

    def mean_cost(self, unit: str) -> float:
        return float(np.mean([c[unit] for c in self.costs]))


def gradient_samples(
    algorithm: Algorithm,
    policy: Any,
    env_fns: Sequence[EnvFn] | EnvPool,
    tasks: Sequence[Any],
    n: int,
    budget: Budget | None = None,
    sampler: Any | None = None,
) -> GradientSamples:
    """``n`` gradient estimates of ``algorithm`` at ``policy``'s current parameters.

    Each sample is one ``collect`` (one tree per task, or as many as ``budget`` allows) and one
    backward pass of the algorithm's loss. ``sampler`` (default ``policy``) collects; the
    gradient is taken with respect to ``policy``'s parameters. A policy that appends parameters
    while collecting (new tabular entries) is handled: earlier estimates are zero on them, which
    is what their gradient was.
    """
    pool = env_fns if isinstance(env_fns, EnvPool) else EnvPool(env_fns)
    rows: list[torch.Tensor] = []
    costs: list[dict[str, float]] = []
    trees: list[int] = []
    params: list[torch.nn.Parameter] = []
    try:
        for _ in range(n):
            batch = algorithm.collect(sampler or policy, pool, tasks, budget)
            params = [p for p in policy.parameters() if p.requires_grad]
            for p in params:
                p.grad = None
            algorithm.loss(policy, batch).backward()
            rows.append(-flat_gradient(params))
            costs.append(batch.compute.to_dict())
            trees.append(batch.n_trees)
    finally:
        for p in params:
            p.grad = None
        if not isinstance(env_fns, EnvPool):
            pool.close()
    size = max((r.numel() for r in rows), default=0)
    grads = torch.zeros(len(rows), size)
    for i, row in enumerate(rows):
        grads[i, : row.numel()] = row
    return GradientSamples(grads, costs, trees)


def projection_z_scores(samples: torch.Tensor, truth: torch.Tensor, n_random: int = 3, seed: int = 0) -> list[float]:
    """z-scores of the sample mean minus ``truth`` along ``truth``'s direction and
    ``n_random`` seeded random unit directions."""
    gen = torch.Generator().manual_seed(seed)
    truth = truth.double()
    directions = [truth / truth.norm()]
    for _ in range(n_random):
        d = torch.randn(truth.shape[0], generator=gen, dtype=torch.float64)
        directions.append(d / d.norm())
    out = []
    x_all = samples.double()
    for d in directions:
        x = (x_all @ d).numpy()
        se = x.std(ddof=1) / np.sqrt(len(x))
        out.append(float((x.mean() - float(truth @ d)) / se) if se > 0 else 0.0)
    return out


def variance_summary(samples: GradientSamples, truth: torch.Tensor | None = None) -> dict[str, Any]:
    """Bias and variance figures of ``samples`` (see the module docstring)."""
    g = samples.grads.double()
    mean = g.mean(0)
    total_var = float(((g - mean) ** 2).sum(1).mean() * len(g) / max(len(g) - 1, 1))
    norms = g.norm(dim=1)
    out: dict[str, Any] = {
        "samples": len(g),
        "trees_per_sample": float(np.mean(samples.n_trees)),
        "cost": {unit: samples.mean_cost(unit) for unit in ("env_steps", "leaves", "gen_tokens", "restores", "snapshots")},
        "trace_var": total_var,
        "grad_norm_mean": float(norms.mean()),
        "grad_norm_var": float(norms.var(unbiased=True)),
        # ||E g||^2 without the upward bias of the sample mean's norm: E||mean||^2 = ||E g||^2 + tr Cov / n
        "signal": float(mean.norm() ** 2) - total_var / len(g),
    }
    out["noise_to_signal"] = total_var / out["signal"] if out["signal"] > 0 else float("inf")
    out["trace_var_x_env_steps"] = total_var * out["cost"]["env_steps"]
    out["trace_var_x_leaves"] = total_var * out["cost"]["leaves"]
    if truth is not None:
        truth = truth.double()
        direction = truth / truth.norm()
        along = (g @ direction).numpy()
        out["var_along_truth"] = float(along.var(ddof=1))
        out["var_along_truth_x_env_steps"] = out["var_along_truth"] * out["cost"]["env_steps"]
        out["z_scores"] = projection_z_scores(samples.grads, truth)
        out["max_abs_z"] = max(abs(z) for z in out["z_scores"])
        out["relative_bias_along_truth"] = float((along.mean() - float(truth @ direction)) / float(truth.norm()))
    return out

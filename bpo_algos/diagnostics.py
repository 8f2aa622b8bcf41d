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

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bpo_algos.algorithm import Algorithm
from bpo_algos.compute import Budget
from bpo_algos.data_parallel import is_sharded
from bpo_algos.rollout import EnvFn, EnvPool

log = logging.getLogger(__name__)


def flat_gradient(parameters: Sequence[torch.nn.Parameter]) -> torch.Tensor:
    """All gradients as one vector (zeros where a parameter has none)."""
    if not parameters:
        return torch.zeros(0)
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in parameters])


def _directions(truth: torch.Tensor, n_random: int, seed: int) -> list[torch.Tensor]:
    """``truth``'s unit direction and ``n_random`` seeded random unit directions (float64, CPU)."""
    gen = torch.Generator().manual_seed(seed)
    truth = truth.detach().cpu().double()
    directions = [truth / truth.norm()]
    for _ in range(n_random):
        d = torch.randn(truth.shape[0], generator=gen, dtype=torch.float64)
        directions.append(d / d.norm())
    return directions


class GradientMoments:
    """Running sums of gradient samples: memory ``O(P)`` whatever the number of samples.

    Keeps ``sum_i g_i`` (float64, on the gradients' device), ``sum_i ||g_i||^2``, each sample's
    norm and, when ``truth`` is given, each sample's projections on ``truth``'s direction and on
    ``n_random`` seeded random unit directions (the directions :func:`projection_z_scores`
    uses). From these, :func:`variance_summary` computes the same figures as from the full
    ``[n, P]`` matrix: ``tr Cov = (sum ||g||^2 - n ||mean||^2) / (n - 1)``.

    Samples shorter than the longest (a policy that grew parameters) count as zero-padded.
    """

    def __init__(self, truth: torch.Tensor | None = None, n_random: int = 3, seed: int = 0) -> None:
        self.n = 0
        self.total: torch.Tensor | None = None
        self.sq_norm_sum = 0.0
        self.norms: list[float] = []
        self.truth = None if truth is None else truth.detach().cpu().double()
        self._directions = _directions(truth, n_random, seed) if truth is not None else []
        self.projections: list[list[float]] = [[] for _ in self._directions]
        self.n_random, self.seed = n_random, seed

    def add(self, g: torch.Tensor) -> None:
        """Add one sample (a 1-D gradient, any device)."""
        g = g.detach().reshape(-1).double()
        if self.total is None:
            self.total = torch.zeros_like(g)
        if g.numel() > self.total.numel():
            self.total = torch.nn.functional.pad(self.total, (0, g.numel() - self.total.numel()))
        self.total[: g.numel()] += g.to(self.total.device)
        sq = float(g @ g)
        self.sq_norm_sum += sq
        self.norms.append(sq**0.5)
        for d, out in zip(self._directions, self.projections, strict=True):
            if g.numel() > d.numel():
                raise ValueError(f"a gradient sample has {g.numel()} entries, the truth {d.numel()}")
            d = d.to(g.device)
            out.append(float(g @ d[: g.numel()]))
        self.n += 1

    def mean(self) -> torch.Tensor:
        if self.total is None:
            raise ValueError("no gradient samples")
        return self.total / self.n

    def trace_var(self) -> float:
        """``tr Cov(g)`` (unbiased): the expected squared distance of a sample to the mean."""
        mean = self.mean()
        return (self.sq_norm_sum - self.n * float(mean @ mean)) / max(self.n - 1, 1)


@dataclass
class GradientSamples:
    """Independent gradient estimates at fixed parameters, with what each cost.

    ``moments`` always holds the running sums; ``grads`` (``[n, n_params]``, ascent direction)
    only when the samples were kept (``keep_grads``), since for a large model it is the memory
    of ``n`` models."""

    grads_kept: torch.Tensor | None
    costs: list[dict[str, float]]  # compute meter of each sample's batch
    n_trees: list[int]
    moments: GradientMoments | None = None

    @property
    def grads(self) -> torch.Tensor:
        if self.grads_kept is None:
            raise ValueError(
                "these gradient samples were streamed (keep_grads=False): use .moments, and pass "
                "truth= to gradient_samples for projections on it"
            )
        return self.grads_kept

    def mean_cost(self, unit: str) -> float:
        return float(np.mean([c[unit] for c in self.costs]))


KEEP_GRADS_BYTES = 256 << 20
"""``keep_grads=None`` keeps the ``[n, P]`` samples only while they take at most this much."""


def gradient_samples(
    algorithm: Algorithm,
    policy: Any,
    env_fns: Sequence[EnvFn] | EnvPool,
    tasks: Sequence[Any],
    n: int,
    budget: Budget | None = None,
    sampler: Any | None = None,
    *,
    truth: torch.Tensor | None = None,
    keep_grads: bool | None = None,
) -> GradientSamples:
    """``n`` gradient estimates of ``algorithm`` at ``policy``'s current parameters.

    Each sample is one ``collect`` (one tree per task, or as many as ``budget`` allows) and one
    backward pass of the algorithm's loss. ``sampler`` (default ``policy``) collects; the
    gradient is taken with respect to ``policy``'s parameters. A policy that appends parameters
    while collecting (new tabular entries) is handled: earlier estimates are zero on them, which
    is what their gradient was.

    Every sample goes into running sums (:class:`GradientMoments`, with ``truth``'s projections
    when given). ``keep_grads``: also keep the full samples (True), never (False), or while
    ``n x P`` float32 values fit :data:`KEEP_GRADS_BYTES` (None; logged when they do not).
    """
    if isinstance(policy, torch.nn.Module) and is_sharded(policy):
        raise RuntimeError(
            "gradient_samples needs an unsharded policy: under FSDP each rank holds a shard of "
            "every gradient and collects its own samples; probe a copy on one process"
        )
    pool = env_fns if isinstance(env_fns, EnvPool) else EnvPool(env_fns)
    rows: list[torch.Tensor] = []
    costs: list[dict[str, float]] = []
    trees: list[int] = []
    params: list[torch.nn.Parameter] = []
    moments = GradientMoments(truth)
    keep = keep_grads
    try:
        for _ in range(n):
            batch = algorithm.collect(sampler or policy, pool, tasks, budget)
            params = [p for p in policy.parameters() if p.requires_grad]
            for p in params:
                p.grad = None
            algorithm.loss(policy, batch).backward()
            g = -flat_gradient(params)
            if keep is None:
                keep = n * g.numel() * 4 <= KEEP_GRADS_BYTES
                if not keep:
                    log.info("gradient samples streamed: %d x %d values would not fit %d bytes", n, g.numel(), KEEP_GRADS_BYTES)
            moments.add(g)
            if keep:
                rows.append(g.cpu())
            costs.append(batch.compute.to_dict())
            trees.append(batch.n_trees)
    finally:
        for p in params:
            p.grad = None
        if not isinstance(env_fns, EnvPool):
            pool.close()
    grads = None
    if keep:
        size = max((r.numel() for r in rows), default=0)
        grads = torch.zeros(len(rows), size)
        for i, row in enumerate(rows):
            grads[i, : row.numel()] = row
    return GradientSamples(grads, costs, trees, moments)


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
    """Bias and variance figures of ``samples`` (see the module docstring).

    Computed from the running sums (:class:`GradientMoments`); with ``truth``, the projections
    come from the moments when they were taken against the same ``truth``, else from the kept
    samples."""
    m = samples.moments
    if m is None or m.n == 0:
        m = GradientMoments(truth)
        for row in samples.grads:
            m.add(row)
    n = m.n
    total_var = m.trace_var()
    mean = m.mean()
    norms = np.asarray(m.norms)
    out: dict[str, Any] = {
        "samples": n,
        "trees_per_sample": float(np.mean(samples.n_trees)),
        "cost": {unit: samples.mean_cost(unit) for unit in ("env_steps", "leaves", "gen_tokens", "restores", "snapshots")},
        "trace_var": total_var,
        "grad_norm_mean": float(norms.mean()),
        "grad_norm_var": float(norms.var(ddof=1)) if n > 1 else float("nan"),
        # ||E g||^2 without the upward bias of the sample mean's norm: E||mean||^2 = ||E g||^2 + tr Cov / n
        "signal": float(mean @ mean) - total_var / n,
    }
    out["noise_to_signal"] = total_var / out["signal"] if out["signal"] > 0 else float("inf")
    out["trace_var_x_env_steps"] = total_var * out["cost"]["env_steps"]
    out["trace_var_x_leaves"] = total_var * out["cost"]["leaves"]
    if truth is not None:
        truth = truth.detach().cpu().double()
        if m.truth is None or m.truth.shape != truth.shape or not torch.equal(m.truth, truth):
            m = GradientMoments(truth)
            for row in samples.grads:
                m.add(row)
        along = np.asarray(m.projections[0])
        norm = float(truth.norm())
        out["var_along_truth"] = float(along.var(ddof=1))
        out["var_along_truth_x_env_steps"] = out["var_along_truth"] * out["cost"]["env_steps"]
        out["z_scores"] = _z_from_projections(m, truth)
        out["max_abs_z"] = max(abs(z) for z in out["z_scores"])
        out["relative_bias_along_truth"] = float((along.mean() - norm) / norm)
    return out


def _z_from_projections(m: GradientMoments, truth: torch.Tensor) -> list[float]:
    out = []
    for d, proj in zip(m._directions, m.projections, strict=True):
        x = np.asarray(proj)
        se = x.std(ddof=1) / np.sqrt(len(x))
        out.append(float((x.mean() - float(truth @ d)) / se) if se > 0 else 0.0)
    return out

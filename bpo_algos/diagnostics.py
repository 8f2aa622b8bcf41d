"""Gradient diagnostics shared by the estimator study (``bpo-variance``,
:mod:`bpo_experiments.variance`), the main job (``bpo-compare``,
:mod:`bpo_experiments.runner`) and the tests.

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
* signal-to-noise (:func:`signal_to_noise`, what the main job reports): the same ratio the other
  way up, ``signal / tr Cov(g)``, finite and possibly negative (the ratio of noisy estimates is
  only safe with the unbiased signal in the numerator), with a bootstrap interval over the
  batches and, against a reference gradient, the cosine of the mean direction;
* per unit of compute: variance x mean cost per sample. Averaging ``B / c`` independent samples
  of cost ``c`` within a budget ``B`` gives variance ``var * c / B``, so ``var * c`` is the
  budget-free figure of merit (lower is better).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bpo_algos.algorithm import Algorithm, Batch
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
    pools: Sequence[EnvPool] = (),
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

    ``pools`` (two or more pools like ``env_fns``, none of them it): the batches are collected
    ``len(pools)`` at a time in lock step (:meth:`~bpo_algos.algorithm.Algorithm.collect_together`:
    one policy pass per engine step over all of them), each then back-propagated in order as
    above. Each batch is then the one ``collect`` builds from the algorithm's state at the
    start of its group (its tree-cost estimate and branching state held within the group,
    where one after the other each batch would read the one before it), so the samples of a
    group are independent given that state; without ``pools``, one batch at a time.
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
    if len(pools) == 1 or any(p is pool for p in pools):
        raise ValueError("pools: two or more pools besides env_fns' (or none)")
    together = list(pools)

    def batches() -> Iterator[Batch]:
        left = n
        while left > 0:
            if together and left > 1:
                group = together[:left]
                yield from algorithm.collect_together(sampler or policy, group, tasks, budget)
                left -= len(group)
            else:
                yield algorithm.collect(sampler or policy, pool, tasks, budget)
                left -= 1

    try:
        for batch in batches():
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


def _pair_moments(gram: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(signal, trace_var)`` of the samples taken ``counts[..., i]`` times each (one row of
    counts per resample), from the Gram matrix ``gram[i, j] = g_i . g_j``, as U-statistics over
    pairs of *distinct* samples: ``signal`` = mean of ``g_i . g_j`` over pairs ``i != j``
    (unbiased for ``||E g||^2``), ``trace_var`` = mean ``||g_i||^2`` minus ``signal`` (unbiased
    for ``tr Cov(g)``). With all counts 1 these are exactly ``||mean||^2 - tr Cov / n`` and the
    ``n - 1`` sample trace variance; in a bootstrap resample the pairs of a sample with its own
    copy are left out (they would add ``||g_i||^2`` as if it were signal)."""
    counts = np.atleast_2d(counts)
    diag = np.diag(gram)
    total = counts.sum(axis=1)
    pairs = total**2 - (counts * counts).sum(axis=1)
    quadratic = np.einsum("bi,ij,bj->b", counts, gram, counts)
    signal = (quadratic - (counts * counts) @ diag) / pairs
    return signal, counts @ diag / total - signal


_GRAMS: dict[int, tuple[weakref.ref[torch.Tensor], int, np.ndarray]] = {}
_KEPT_GRAMS = 8


def gram_matrix(rows: torch.Tensor, double: torch.Tensor | None = None) -> np.ndarray:
    """``G[i, j] = g_i . g_j`` of the rows of ``rows`` (``[n, P]``, any float dtype), in float64:
    ``g @ g.T`` with ``g = rows.double()`` (``double``: that matrix, when the caller has it).

    Remembered for the last few row tensors, by identity and in-place version (a changed or
    freed tensor is computed afresh): a probe's rows are read by its signal-to-noise ratio and
    again to size the next probe, and a reference pool's by its ratio and its error, each time
    an ``[n, P]`` conversion to float64 and an ``n x n x P`` product. Returns a copy."""
    hit = _GRAMS.get(id(rows))
    if hit is not None and hit[0]() is rows and hit[1] == rows._version:
        return hit[2].copy()
    g = rows.detach().double().cpu() if double is None else double
    gram = (g @ g.T).numpy()
    while len(_GRAMS) >= _KEPT_GRAMS:
        del _GRAMS[next(iter(_GRAMS))]
    _GRAMS[id(rows)] = (weakref.ref(rows), rows._version, gram)
    return gram.copy()


def _padded(x: torch.Tensor, width: int) -> torch.Tensor:
    """``x`` zero-padded on its last dimension to ``width`` entries (``x`` itself when it has
    them: no copy of a ``[n, P]`` matrix to pad it by nothing)."""
    return x if x.shape[-1] == width else torch.nn.functional.pad(x, (0, width - x.shape[-1]))


def signal_to_noise(
    samples: GradientSamples | torch.Tensor,
    reference: GradientSamples | torch.Tensor | tuple[torch.Tensor, float] | None = None,
    *,
    resamples: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """Signal-to-noise ratio of a gradient estimator, with a bootstrap interval over its batches.

    With ``n`` independent batch gradients ``g_i`` (the rows of ``samples``, ascent direction):

    * ``signal``: ``||mean||^2 - tr Cov(g) / n`` = the mean of ``g_i . g_j`` over pairs
      ``i != j``, an unbiased estimate of ``||E g||^2`` (negative when the noise swamps the
      signal: then it says so instead of dividing by it);
    * ``trace_var``: ``tr Cov(g)``, the unbiased ``sum ||g_i - mean||^2 / (n - 1)``;
    * ``snr`` = ``signal / trace_var``: finite whenever the samples differ (``nan`` when all are
      equal, e.g. a frozen learner's zero gradient). A batch of ``1 / snr`` times this size has
      a mean gradient as long as its noise.

    ``snr_ci95``: the 2.5% and 97.5% percentiles of ``snr`` over ``resamples`` seeded bootstrap
    resamples of the batches, each computed from pairs of distinct batches
    (:func:`_pair_moments`; resampled duplicates would count a batch's own norm as signal).
    Its coverage on simulated Gaussian gradients (32 batches) is about 95% at an SNR of 0.1-1
    and higher (conservative) near 0 (tests/test_main_job_stats.py).

    ``reference``: another estimator's gradients at the same parameters, e.g. a large pool of
    RLOO's unbiased batches (a ``GradientSamples``/tensor of rows, or ``(mean, signal)``). Then
    ``cosine`` = ``mean . ref_mean / sqrt(signal * ref_signal)``: the cosine between the two
    expected gradients, with both lengths taken from the unbiased ``signal`` (the lengths of
    the noisy means would pull it towards 0; noise can put it slightly past +-1), and its
    bootstrap interval over this estimator's batches (the reference held fixed).
    """
    grads = samples.grads if isinstance(samples, GradientSamples) else samples
    n = grads.shape[0]
    if n < 2:
        raise ValueError(f"signal_to_noise needs at least 2 gradient samples, got {n}")
    g = grads.detach().double().cpu() if reference is not None else None  # the cosine reads the rows themselves
    gram = gram_matrix(grads, g)
    ones = np.ones((1, n))
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, n, size=(resamples, n))
    counts = np.zeros((resamples, n))
    np.add.at(counts, (np.repeat(np.arange(resamples), n), picks.reshape(-1)), 1.0)
    counts = counts[(counts > 0).sum(axis=1) >= 2]  # a pair of distinct batches is needed

    def snr_of(c: np.ndarray) -> np.ndarray:
        signal, trace_var = _pair_moments(gram, c)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(trace_var > 0, signal / np.where(trace_var > 0, trace_var, 1.0), np.nan)

    def interval(values: np.ndarray) -> list[float]:
        values = values[np.isfinite(values)]
        return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))] if values.size else [float("nan")] * 2

    signal, trace_var = (float(v[0]) for v in _pair_moments(gram, ones))
    out: dict[str, Any] = {"batches": n, "snr": float(snr_of(ones)[0]), "signal": signal, "trace_var": trace_var}
    out["snr_ci95"] = interval(snr_of(counts))
    if reference is not None:
        if isinstance(reference, tuple):
            ref_mean, ref_signal = reference[0].detach().double().cpu().reshape(-1), float(reference[1])
        else:
            ref_grads = reference.grads if isinstance(reference, GradientSamples) else reference
            rows = ref_grads.detach().double().cpu()
            ref_mean = rows.mean(dim=0)
            # remembered under the caller's tensor (``rows`` is a new one at every call)
            ref_signal = float(_pair_moments(gram_matrix(ref_grads, rows), np.ones((1, rows.shape[0])))[0][0])
        width = max(ref_mean.numel(), g.shape[1])
        r = _padded(ref_mean, width).numpy()
        along = _padded(g, width).numpy() @ r  # g_i . ref_mean

        def cosine(c: np.ndarray) -> np.ndarray:
            own = _pair_moments(gram, c)[0]
            if ref_signal <= 0:
                return np.full(len(c), np.nan)
            with np.errstate(invalid="ignore"):
                return np.where(own > 0, (c @ along) / c.sum(axis=1) / np.sqrt(np.abs(own) * ref_signal), np.nan)

        out["cosine"] = float(cosine(ones)[0])
        out["cosine_ci95"] = interval(cosine(counts))
        out["reference_signal"] = ref_signal
    return out

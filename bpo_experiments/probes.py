"""What a run measures beside training: gradient probes (where: ``run_config.EnvConfig``) and the mechanism.

The gradient probes: signal-to-noise against a reference RLOO gradient
(:func:`~bpo_algos.diagnostics.signal_to_noise`); the mechanism: :mod:`bpo_algos.mechanism`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bpo_algos.algorithm import Algorithm
from bpo_algos.compute import Budget
from bpo_algos.diagnostics import GradientSamples, gradient_samples, gram_matrix, signal_to_noise
from bpo_algos.rollout import EnvPool

if TYPE_CHECKING:
    from bpo_experiments.run_config import AlgorithmSpec

from bpo_experiments.streams import (
    PROBE_POINTS,
    REFERENCE,
    stream_seed,
)


class _RNGGuard:
    """Puts the policy's sampling RNG and torch's global RNG back after a measurement."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def __enter__(self) -> None:
        self.policy_state = self.policy.rng_state()
        self.torch_state = torch.get_rng_state()

    def __exit__(self, *exc: object) -> None:
        self.policy.set_rng_state(self.policy_state)
        torch.set_rng_state(self.torch_state)


PILOT_BATCHES = 4
"""Batches a probe collects to size itself (:func:`sized_batches`) when nothing independent of it
has measured its estimator yet; the first of them also warms its adaptive state (what one
discarded batch did before). They are not part of the estimate."""

MIN_BATCHES = 4
"""The fewest batches a precision-targeted probe keeps (the jackknife needs a few)."""


def _moments(gram: np.ndarray) -> tuple[float, float]:
    """``(signal, trace_var)`` of the batches whose Gram matrix is ``gram``: the mean of
    ``g_i . g_j`` over pairs ``i != j`` and the mean ``||g_i||^2`` minus it (as
    :func:`~bpo_algos.diagnostics.signal_to_noise`)."""
    m = gram.shape[0]
    diag = float(np.trace(gram))
    signal = (float(gram.sum()) - diag) / (m * (m - 1))
    return signal, diag / m - signal


def snr_relative_error(rows: torch.Tensor) -> float:
    """The jackknife relative standard error of the signal-to-noise ratio of ``rows`` (``[m, P]``
    batch gradients): ``sqrt((m - 1) / m * sum_i (snr_(i) - mean_i snr_(i))^2) / snr``, each
    leave-one-out ``snr_(i)`` from the Gram matrix; ``inf`` when the ratio (or a leave-one-out
    one) is not positive and finite, since then nothing can be predicted."""
    m = rows.shape[0]
    if m < 3:
        return float("inf")
    gram = gram_matrix(rows)
    signal, trace = _moments(gram)
    if not (signal > 0 and trace > 0):
        return float("inf")
    diag = np.diag(gram)
    # leaving batch i out: the pair sum loses row and column i, the diagonal loses gram[i, i]
    pair_sums = gram.sum() - 2 * gram.sum(axis=1) + diag - (diag.sum() - diag)
    loo_signal = pair_sums / ((m - 1) * (m - 2))
    loo_trace = (diag.sum() - diag) / (m - 1) - loo_signal
    if not np.all(loo_trace > 0):
        return float("inf")
    loo = loo_signal / loo_trace
    se = float(np.sqrt((m - 1) / m * np.sum((loo - loo.mean()) ** 2)))
    return se / (signal / trace)


def batches_for_error(relative_error: float, measured: int, target: float, most: int, least: int = MIN_BATCHES) -> int:
    """Batches whose signal-to-noise ratio has a relative standard error of at most ``target``,
    given the error ``relative_error`` measured on ``measured`` batches (the error scales as
    ``1 / sqrt(n)``): ``n = ceil(measured (relative_error / target)^2)`` within ``[least, most]``
    (``most`` when the measured error is not finite)."""
    if not math.isfinite(relative_error):
        return most
    return int(min(most, max(least, math.ceil(measured * (relative_error / target) ** 2))))


def sized_batches(rows: torch.Tensor, target: float, most: int, least: int = MIN_BATCHES) -> int:
    """:func:`batches_for_error` with the jackknife error of ``rows``' batches
    (:func:`snr_relative_error`)."""
    return batches_for_error(snr_relative_error(rows), rows.shape[0], target, most, least)


def reference_batches_for(rows: torch.Tensor, target: float, most: int, least: int = MIN_BATCHES) -> int:
    """Batches whose mean gradient holds noise of at most ``target^2`` of its signal:
    ``tr Cov(mean) / ||E g||^2 = 1 / (n snr) <= target^2``, so ``n = ceil(1 / (target^2 snr))``,
    ``snr`` measured on ``rows`` (independent batches of the same estimator), within
    ``[least, most]`` (``most`` when the measured ratio is not positive)."""
    if rows.shape[0] < 2:
        return most
    signal, trace = _moments(gram_matrix(rows))
    if not (signal > 0 and trace > 0):
        return most
    return int(min(most, max(least, math.ceil(trace / (target**2 * signal)))))


def gradient_rows(probe: Algorithm, policy: Any, pool: EnvPool, tasks: list[Any], budget: Budget, n: int,
                  precision: Callable[[torch.Tensor], int] | None = None, sizing: torch.Tensor | int | None = None,
                  pools: Sequence[EnvPool] = ()) -> tuple[GradientSamples, dict[str, Any]]:
    """Gradient samples of the algorithm ``probe`` (built on the probe's own stream) at ``policy``
    (kept: the bootstrap needs their Gram matrix). The probe is the estimator that trains: same
    settings, its adaptive state (BPO's threshold, the budget's tree-cost estimate) warmed by one
    discarded batch.

    ``precision`` None and ``sizing`` None: ``n`` batches. ``sizing`` an int: that many batches
    (a count already set from evidence independent of this probe's batches). Else the number of
    batches is ``precision(rows)`` (at most ``n``: :func:`sized_batches`,
    :func:`reference_batches_for`), ``rows`` being ``sizing`` (batch gradients of this estimator
    independent of this probe's, e.g. its earlier probe) or, without them,
    :data:`PILOT_BATCHES` pilot batches of this probe whose first is the warm-up. Either way
    the estimate is made of fresh batches only and their number was fixed before they were drawn,
    so every unbiased figure (signal, trace variance, mean) stays unbiased: the count is set by
    the precision target, never by the batches it is measured on. Returns the samples and how
    their number was set.

    ``pools``: the probe's batches after the warm-up are collected ``len(pools)`` at a time in
    lock step, each group from the state the batches before it left
    (:func:`~bpo_algos.diagnostics.gradient_samples`' ``pools``); the warm-up batch always alone."""
    with _RNGGuard(policy):
        policy.seed(probe.seed)
        if isinstance(sizing, int) or precision is None:
            count = n if sizing is None else int(sizing)
            probe.collect(policy, pool, tasks, budget)
            found = {"batches": count, "most": n, "sized_on": "fixed" if sizing is None else "given", "pilot_batches": 0}
            return gradient_samples(probe, policy, pool, tasks, count, budget, keep_grads=True, pools=pools), found
        if sizing is None:
            # the first pilot batch is the warm-up: alone, so that the others start from its state
            first = gradient_samples(probe, policy, pool, tasks, 1, budget, keep_grads=True).grads
            rest = gradient_samples(probe, policy, pool, tasks, PILOT_BATCHES - 1, budget, keep_grads=True, pools=pools).grads
            width = max(first.shape[1], rest.shape[1])  # a policy that grew parameters: zeros on them
            pilot = torch.cat([torch.nn.functional.pad(g, (0, width - g.shape[1])) for g in (first, rest)])
            source = "pilot"
        else:
            probe.collect(policy, pool, tasks, budget)
            pilot, source = sizing, "earlier probe"
        count = max(2, precision(pilot))
        samples = gradient_samples(probe, policy, pool, tasks, count, budget, keep_grads=True, pools=pools)
    return samples, {"batches": count, "most": n, "sized_on": source, "sizing_batches": int(pilot.shape[0]),
                     "pilot_batches": PILOT_BATCHES if sizing is None else 0}


def reference_gradient(reference: AlgorithmSpec, n: int, seed: int, policy: Any, pool: EnvPool, tasks: list[Any], budget: Budget,
                       point: str = "initial", precision: float | None = None,
                       pools: Sequence[EnvPool] = ()) -> tuple[torch.Tensor, float, dict[str, Any]]:
    """``(mean, signal, sizing)`` of at most ``n`` (``reference_batches``) batches of the
    reference estimator (:data:`~bpo_experiments.run_config.REFERENCE_ALGORITHM` as ``reference`` builds it) at ``policy`` (the
    seed's reference stream at probe ``point``): the reference the cosine of
    :func:`~bpo_algos.diagnostics.signal_to_noise` is taken against. ``precision`` (the
    preset's ``reference_precision``): as many batches as make the mean's noise at most
    ``precision^2`` of its signal (:func:`reference_batches_for`, on a pilot); None: ``n``.
    ``sizing`` also holds the jackknife relative error of the pool's signal-to-noise ratio
    (:func:`snr_relative_error`), on which the probes at the same point are sized. ``pools``:
    as :func:`gradient_rows`'."""
    key = stream_seed(seed, REFERENCE, PROBE_POINTS[point])
    probe = reference.build(seed=key)
    rule = None if precision is None else partial(reference_batches_for, target=precision, most=n)
    samples, sizing = gradient_rows(probe, policy, pool, tasks, budget, n, rule, pools=pools)
    rows = samples.grads.double()
    moments = signal_to_noise(rows, resamples=1)
    sizing["snr_relative_error"] = snr_relative_error(rows)  # what the probes at this point size on
    return rows.mean(dim=0).float(), float(moments["signal"]), sizing

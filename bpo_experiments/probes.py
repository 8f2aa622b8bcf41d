"""What a run measures beside training: gradient probes and the mechanism, and where each is taken.

The gradient probes: signal-to-noise against a reference RLOO gradient
(:func:`~bpo_algos.diagnostics.signal_to_noise`); the mechanism: :mod:`bpo_algos.mechanism`.
"""

from __future__ import annotations

from typing import Any

import torch

from bpo_algos.algorithm import Algorithm
from bpo_algos.compute import Budget
from bpo_algos.diagnostics import gradient_samples, signal_to_noise
from bpo_algos.registry import make_algorithm
from bpo_algos.rollout import EnvPool
from bpo_experiments.presets import Preset
from bpo_experiments.streams import (
    PROBE_POINTS,
    REFERENCE,
    stream_seed,
)


def probe_points(preset: Preset, env_name: str) -> dict[str, int]:
    """Where a run probes its gradient: ``{"initial": 0, "mid": updates // 2}``."""
    return {"initial": 0, "mid": preset.trainer_for(env_name).updates // 2}


def probes_on(preset: Preset, env_name: str, seed: int) -> bool:
    """Whether the (env, seed)'s runs probe their gradients: the first ``grad_seeds`` seeds
    (all when None), and only with at least 2 batches."""
    if preset.for_env("grad_batches", env_name) < 2:
        return False
    seeds = list(preset.for_env("seeds", env_name))
    count = preset.for_env("grad_seeds", env_name)
    return seed in (seeds if count is None else seeds[:count])


def mechanism_points(preset: Preset, env_name: str) -> dict[str, int]:
    """Where a run measures the mechanism (:mod:`bpo_algos.mechanism`) on its own training batch:
    ``{"warm": 1, "mid": updates // 2 + 1}``, the batches collected by the warm-start policy and
    by the policy after ``updates // 2`` updates (the gradient probes' points)."""
    return {"warm": 1, "mid": preset.trainer_for(env_name).updates // 2 + 1}


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


def gradient_rows(probe: Algorithm, policy: Any, pool: EnvPool, tasks: list[Any], budget: Budget, n: int) -> Any:
    """``n`` gradient samples of the algorithm ``probe`` (built on the probe's own stream) at
    ``policy`` (kept: the bootstrap needs their Gram matrix). The probe is the estimator that
    trains: same settings, its adaptive state (BPO's threshold, the budget's tree-cost estimate)
    warmed by one discarded batch."""
    with _RNGGuard(policy):
        policy.seed(probe.seed)
        probe.collect(policy, pool, tasks, budget)
        samples = gradient_samples(probe, policy, pool, tasks, n, budget, keep_grads=True)
    return samples


REFERENCE_ALGORITHM = "rloo"
"""The unbiased estimator whose large pool of batches gives the reference gradient."""


def reference_gradient(options: dict[str, Any], n: int, seed: int, policy: Any, pool: EnvPool, tasks: list[Any], budget: Budget,
                       point: str = "initial") -> tuple[torch.Tensor, float]:
    """``(mean, signal)`` of ``n`` (``reference_batches``) batches of the reference estimator
    (:data:`REFERENCE_ALGORITHM`, built with ``options``) at ``policy`` (the seed's reference
    stream at probe ``point``): the reference the cosine of
    :func:`~bpo_algos.diagnostics.signal_to_noise` is taken against."""
    key = stream_seed(seed, REFERENCE, PROBE_POINTS[point])
    probe = make_algorithm(REFERENCE_ALGORITHM, **{**options, "seed": key})
    samples = gradient_rows(probe, policy, pool, tasks, budget, n)
    rows = samples.grads.double()
    moments = signal_to_noise(rows, resamples=1)
    return rows.mean(dim=0).float(), float(moments["signal"])

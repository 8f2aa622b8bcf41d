"""The gradient probes at a precision target (docs/main-job.md, "Gradient probes"): their batches
are today's estimator's batches, their count is set before they are drawn, so the estimates
keep their expectation; the count follows the stated target."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch
from gradcheck import exact_gradient, random_policy, tree_env

from baselines import RLOO
from bpo_algos import EnvPool
from bpo_algos.diagnostics import gradient_samples, signal_to_noise
from bpo_experiments.probes import (
    PILOT_BATCHES,
    batches_for_error,
    gradient_rows,
    reference_batches_for,
    sized_batches,
    snr_relative_error,
)

TREE = {"depth": 3, "n_actions": 3, "seed": 5}


def _setting():
    env = tree_env(**TREE)
    policy = random_policy(env, seed=1)
    pool = EnvPool([lambda: tree_env(**TREE)])
    return env, policy, pool


def _today(policy, pool, n: int, seed: int):
    """The probe before precision targets: one discarded warm-up batch, then ``n`` batches."""
    probe = RLOO(group_size=3, aggregation="step-sum", seed=seed)
    policy.seed(probe.seed)
    probe.collect(policy, pool, [0], None)
    return gradient_samples(probe, policy, pool, [0], n, None, keep_grads=True)


def test_jackknife_error_matches_leave_one_out_by_brute_force():
    rng = np.random.default_rng(0)
    rows = torch.tensor(rng.normal(0.3, 1.0, size=(9, 40)))
    loo = []
    for i in range(9):
        kept = torch.cat([rows[:i], rows[i + 1 :]])
        loo.append(signal_to_noise(kept, resamples=1)["snr"])
    loo = np.array(loo)
    full = signal_to_noise(rows, resamples=1)["snr"]
    expected = np.sqrt(8 / 9 * np.sum((loo - loo.mean()) ** 2)) / full
    assert snr_relative_error(rows) == pytest.approx(expected, rel=1e-9)
    # no positive signal measured: nothing to predict, so the most batches
    assert snr_relative_error(torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]])) == float("inf")
    assert batches_for_error(float("inf"), 6, 0.25, 16) == 16


def test_counts_follow_the_target():
    # se 0.5 measured on 4 batches: 0.25 needs 4 x 4 = 16, 0.5 the 4 already enough
    assert batches_for_error(0.5, 4, 0.25, 32) == 16
    assert batches_for_error(0.5, 4, 0.5, 32) == 4
    assert batches_for_error(0.5, 4, 0.1, 32) == 32  # capped at the preset's count
    # reference: snr = signal / trace_var; the mean's noise share 1 / (n snr) <= target^2
    rows = torch.tensor([[1.0, 0.0], [1.0, 2.0], [1.0, -2.0], [1.0, 0.0]], dtype=torch.float64)
    signal = (1 + 1 + 1 - 3 + 1 + 1) / 6  # the mean of g_i . g_j over the 6 distinct pairs
    trace = float(np.mean([1, 5, 5, 1])) - signal  # 8/3: snr 1/8, so 1 / (0.25 / 8) = 32 batches
    assert reference_batches_for(rows, 0.5, 64, least=1) == 32 == round(trace / (0.25 * signal))
    # a tighter target asks more of the same estimator
    rng = np.random.default_rng(1)
    noisy = torch.tensor(rng.normal(0.2, 1.0, size=(8, 50)))
    assert sized_batches(noisy, 0.1, 10_000) >= sized_batches(noisy, 0.4, 10_000)


def test_the_probe_batches_are_todays_estimator_batches():
    """On the same stream, a probe of a given count is today's probe of that count, and a
    piloted probe's estimate is made of the batches after the pilot: the same rows, the same
    signal-to-noise figures, the pilot left out."""
    _, policy, pool = _setting()
    try:
        today = _today(policy, pool, PILOT_BATCHES - 1 + 6, seed=11)
        given, sizing = gradient_rows(RLOO(group_size=3, aggregation="step-sum", seed=11), policy, pool, [0], None, 16, sizing=6)
        assert sizing["batches"] == 6 and sizing["pilot_batches"] == 0
        assert torch.equal(given.grads, today.grads[:6])
        piloted, sizing = gradient_rows(RLOO(group_size=3, aggregation="step-sum", seed=11), policy, pool, [0], None, 16,
                                        precision=lambda rows: 6)
        assert sizing == {"batches": 6, "most": 16, "sized_on": "pilot", "sizing_batches": PILOT_BATCHES, "pilot_batches": PILOT_BATCHES}
        # the pilot's first batch is today's warm-up, the next PILOT_BATCHES - 1 come before the estimate
        assert torch.equal(piloted.grads, today.grads[PILOT_BATCHES - 1 :])
        assert signal_to_noise(piloted, resamples=50) == signal_to_noise(today.grads[PILOT_BATCHES - 1 :], resamples=50)
    finally:
        pool.close()


@pytest.mark.slow
def test_precision_targeted_probes_keep_their_expectation():
    """Over independent probes, each sized on its own pilot, the mean of the estimates is the
    exact gradient and the mean signal is its squared length: the count is set before the
    estimate's batches are drawn. z-tests at |z| < 4.5 (two-sided error 7e-6 per figure)."""
    env, policy, pool = _setting()
    truth = exact_gradient(env, policy).double()
    means, signals, counts = [], [], []
    rule = partial(sized_batches, target=0.5, most=12, least=3)
    try:
        for seed in range(120):
            samples, sizing = gradient_rows(RLOO(group_size=3, aggregation="step-sum", seed=1000 + seed), policy, pool, [0], None, 12,
                                            precision=rule)
            rows = samples.grads.double()
            means.append(rows.mean(0))
            signals.append(signal_to_noise(rows, resamples=1)["signal"])
            counts.append(sizing["batches"])
    finally:
        pool.close()
    assert len(set(counts)) > 1  # the count did vary with the pilots
    direction = truth / truth.norm()
    along = torch.stack(means) @ direction
    z = (float(along.mean()) - float(truth.norm())) / (float(along.std()) / np.sqrt(len(along)))
    assert abs(z) < 4.5, z
    s = np.array(signals)
    z_signal = (s.mean() - float(truth @ truth)) / (s.std(ddof=1) / np.sqrt(len(s)))
    assert abs(z_signal) < 4.5, z_signal

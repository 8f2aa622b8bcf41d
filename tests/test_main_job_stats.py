"""The main job's statistics: paired intervals, the minimal detectable effect, curve metrics,
the gradient signal-to-noise bootstrap, and the cost model on a hand-computed case.

The statistical tests are seeded simulations with a stated error rate: each checks a rate
(coverage, power) over R replications against a band several standard errors wide, so a
correct implementation fails it with probability well under 1e-3 (and, being seeded, never
flakes)."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

import bpo_envs  # noqa: F401
from baselines import GRPO
from bpo_algos import BPO, Budget
from bpo_algos.compute import cost_flops
from bpo_algos.diagnostics import signal_to_noise
from bpo_algos.policy.choice import ChoicePolicy
from bpo_experiments.plan import calibration_power
from bpo_experiments.presets import PRESETS
from bpo_experiments.run_config import comparison_config, env_config
from bpo_experiments.significance import (
    minimal_detectable_effect,
    paired_p_value,
    power,
    t_cdf,
    t_quantile,
)
from bpo_experiments.stats import curve_metrics, paired_difference


def test_t_quantiles_match_the_tables():
    assert t_quantile(0.975, 1) == pytest.approx(12.706, abs=1e-3)
    assert t_quantile(0.975, 5) == pytest.approx(2.571, abs=1e-3)
    assert t_quantile(0.8, 5) == pytest.approx(0.920, abs=1e-3)
    assert t_quantile(0.975, 1000) == pytest.approx(1.962, abs=1e-3)


def test_paired_interval_covers_the_true_difference_95_percent_of_the_time():
    """R = 4000 paired experiments of 6 seeds: coverage has standard error 0.0034, the band
    [0.935, 0.965] is 4.4 standard errors wide each side (error rate < 1e-4)."""
    rng = np.random.default_rng(0)
    truth, covered = 0.03, 0
    for _ in range(4000):
        seed_effect = rng.normal(0.5, 0.1, size=6)  # shared by both arms: cancels in the pairs
        treatment = seed_effect + truth + rng.normal(0, 0.02, size=6)
        comparator = seed_effect + rng.normal(0, 0.02, size=6)
        d = paired_difference(treatment - comparator)
        covered += abs(d["diff"] - truth) <= d["diff_ci95"]
    assert 0.935 <= covered / 4000 <= 0.965


def test_mde_is_the_effect_detected_with_80_percent_power():
    """At a true difference equal to the MDE of the true spread, the paired t-test rejects with
    probability 0.80 (the formula's approximation of the noncentral t: about 0.79 at 6 seeds).
    R = 4000: standard error 0.0064; band [0.75, 0.83] (error rate < 1e-4). With no
    difference it rejects 5% of the time (band [0.04, 0.06], standard error 0.0034)."""
    rng = np.random.default_rng(1)
    n, sd = 6, 0.02
    effect = minimal_detectable_effect(sd, n)
    assert effect == pytest.approx((2.5706 + 0.9195) * sd / math.sqrt(n), rel=1e-3)
    detected = sum(paired_difference(rng.normal(effect, sd, size=n))["detected"] for _ in range(4000))
    assert 0.75 <= detected / 4000 <= 0.83
    false = sum(paired_difference(rng.normal(0.0, sd, size=n))["detected"] for _ in range(4000))
    assert 0.04 <= false / 4000 <= 0.06
    # reported beside every difference, from the per-seed spread
    d = paired_difference([0.01, 0.03, -0.01, 0.02])
    assert d["mde"] == pytest.approx(minimal_detectable_effect(float(np.std([0.01, 0.03, -0.01, 0.02], ddof=1)), 4))
    assert math.isnan(paired_difference([0.1])["mde"])


def test_power_is_the_rate_at_which_the_paired_test_detects_an_effect():
    """At 0.6 MDE over 6 seeds the noncentral t gives 0.397 (the shifted-t approximation the
    MDE uses, the broken case, 0.33); R = 4000 simulated experiments (standard error 0.008) must
    land within 0.03 of it (error rate < 2e-4). The paired p-value agrees with the interval: p <
    0.05 exactly when the interval excludes 0."""
    rng = np.random.default_rng(2)
    n, sd = 6, 0.02
    effect = 0.6 * minimal_detectable_effect(sd, n)
    expected = power(effect, sd, n)
    assert expected == pytest.approx(0.397, abs=0.005) and power(0.0, sd, n) == pytest.approx(0.05)
    samples = [rng.normal(effect, sd, size=n) for _ in range(4000)]
    rate = sum(paired_difference(x)["detected"] for x in samples) / 4000
    assert abs(rate - expected) < 0.03
    shifted = 1 - t_cdf(t_quantile(0.975, n - 1) - effect * math.sqrt(n) / sd, n - 1)
    assert shifted == pytest.approx(0.33, abs=0.005) and abs(rate - shifted) > 0.03
    assert all((paired_p_value(x) < 0.05) == paired_difference(x)["detected"] for x in samples[:500])
    assert math.isnan(power(0.01, 0.0, 6)) and math.isnan(power(0.01, 0.02, 1))


def test_the_plan_states_the_power_to_detect_the_calibration_effect():
    # the CPU default's record: rloo-2x − rloo +0.0069 AUC; bpo − rloo's spread gives an MDE of
    # 0.011 at 20 seeds, so the headline sees an effect of the calibration's size with power 0.42
    sd = 0.011 * math.sqrt(20) / (t_quantile(0.975, 19) + t_quantile(0.8, 19))
    record = {"vs_comparator": {"bpo": {"auc": {"sd": sd, "diff": -0.006}}, "rloo-2x": {"auc": {"sd": 0.02, "diff": 0.0069}}}}
    cpu = comparison_config(PRESETS["cpu"])
    out = calibration_power(cpu, record, 20)
    assert out["mde"] == pytest.approx(0.011) and out["effect"] == 0.0069 and out["power"] == pytest.approx(0.42, abs=0.01)
    # more seeds, more power; the broken case (the calibration's own spread) would read another power
    assert calibration_power(cpu, record, 40)["power"] > 0.6
    assert power(0.0069, 0.02, 20) != pytest.approx(out["power"], abs=0.05)
    assert calibration_power(cpu, {"vs_comparator": {"bpo": {"auc": {"sd": sd}}}}, 20) is None


def test_every_preset_evaluates_each_run_at_least_six_times():
    """The AUC integrates the evaluated curve: with 3 points it is mostly the middle evaluation
    (docs/main-job.md, "Evaluation points"). Presets with fewer than 5 updates (the CI path
    checks ``smoke`` and ``cpu-swe``) cannot have 6 points and are left out."""
    checked = 0
    for name, preset in PRESETS.items():
        for env in preset.envs:
            settings = env_config(preset, env)
            if settings.trainer.updates < 5:
                continue
            checked += 1
            assert len(settings.eval_points) >= 6, (name, env, settings.eval_points)
    assert checked >= 8
    assert env_config(PRESETS["cpu"], "alfworld").eval_points == (0, 2, 4, 6, 8, 10, 12)
    # the broken case: the former CPU default (WebShop every 10 of 20 updates) had 3 points
    import copy
    old = copy.deepcopy(PRESETS["cpu"])
    old.envs["webshop"].eval_every, old.envs["alfworld"].eval_every = 10, 6
    assert env_config(old, "webshop").eval_points == (0, 10, 20)


def test_curve_metrics_by_hand():
    # evaluations at 0, 100, 200, 300 units; horizon 300
    m = curve_metrics([0, 100, 200, 300], [0.2, 0.4, 0.6, 0.6], horizon=300, threshold=0.5)
    # trapezoids: (0.2+0.4)/2*100 + (0.4+0.6)/2*100 + 0.6*100 = 30 + 50 + 60 = 140 -> 140/300
    assert m["auc"] == pytest.approx(140 / 300)
    assert m["final"] == 0.6 and m["reached"]
    assert m["compute_to_threshold"] == pytest.approx(150.0)  # halfway from 0.4 to 0.6
    # a run that ended short of the horizon keeps its last value; one that never reaches the
    # threshold is censored at its whole compute
    short = curve_metrics([0, 100, 290], [0.2, 0.2, 0.2], horizon=300, threshold=0.5)
    assert short["auc"] == pytest.approx(0.2) and not short["reached"] and short["compute_to_threshold"] == 290
    with pytest.raises(ValueError, match="starts at compute 0"):
        curve_metrics([5, 10], [0.1, 0.2], horizon=10, threshold=0.5)


def test_snr_bootstrap_interval_covers_on_simulated_gradients():
    """32 batches of 100-dim Gaussian gradients with mean 0.3 per coordinate and unit noise:
    true SNR ||E g||^2 / tr Cov = 9 / 100. The bootstrap interval's coverage over R = 200
    simulations is about 0.95 (standard error 0.015); band [0.88, 0.995] (error rate < 1e-3)."""
    rng = np.random.default_rng(2)
    covered = 0
    for r in range(200):
        g = torch.from_numpy(rng.normal(0.3, 1.0, size=(32, 100)))
        out = signal_to_noise(g, resamples=400, seed=r)
        lo, hi = out["snr_ci95"]
        covered += lo <= 0.09 <= hi
        assert math.isfinite(out["snr"])
    assert 0.88 <= covered / 200 <= 0.995
    # no signal at all: finite and about 0 (may be negative), never infinite
    noise = signal_to_noise(torch.from_numpy(rng.normal(0.0, 1.0, size=(32, 100))), resamples=200)
    assert math.isfinite(noise["snr"]) and abs(noise["snr"]) < 0.05
    # a zero gradient (a frozen learner) has no noise: nan, not infinity
    assert math.isnan(signal_to_noise(torch.zeros(8, 5), resamples=50)["snr"])


def test_cosine_to_reference():
    rng = np.random.default_rng(3)
    mean = np.zeros(200)
    mean[:10] = 1.0
    g = torch.from_numpy(rng.normal(0, 1, size=(32, 200)) + mean)
    ref = torch.from_numpy(rng.normal(0, 1, size=(64, 200)) + mean)
    out = signal_to_noise(g, ref, resamples=300)
    assert out["cosine"] == pytest.approx(1.0, abs=0.2)
    lo, hi = out["cosine_ci95"]
    assert lo < 1.0 < hi + 0.05
    orthogonal = np.zeros(200)
    orthogonal[10:20] = 1.0
    ref2 = torch.from_numpy(rng.normal(0, 1, size=(64, 200)) + orthogonal)
    assert abs(signal_to_noise(g, ref2, resamples=300)["cosine"]) < 0.3


class TenWeights(ChoicePolicy):
    """A choice policy with exactly 10 parameters (P = 10 in the cost model)."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.w = torch.nn.Parameter(torch.zeros(10))

    def scores(self, contexts):
        return [self.w[: len(c.admissible_actions)] * 1.0 for c in contexts]


def tree(depth=3, n_actions=3):
    return lambda: gym.make("BPO-TreeMDP-v0", depth=depth, n_actions=n_actions, seed=1)


def test_cost_model_on_a_hand_computed_case():
    """GRPO, group 4, one task of a depth-3 TreeMDP with 3 actions, one env: 1 sample call at the
    root (4 samples) + 2 decisions on each of the 4 paths = 9 forward passes over a context and
    its 3 candidates (4 tokens each) = 36 prefill tokens; 12 sampled actions; 12 trained steps
    of 4 tokens = 48 train tokens. flops = 2 P (36 + 12) + 6 P 48 = 384 P = 3840 for P = 10."""
    c = GRPO(group_size=4).collect(TenWeights(), [tree()], [0]).compute
    assert (c.prefill_tokens, c.gen_tokens, c.score_tokens, c.train_tokens) == (36, 12, 0, 48)
    assert c.flops == pytest.approx(3840) == cost_flops(10, prefill_tokens=36, gen_tokens=12, train_tokens=48)
    # a scoring pass is charged exactly what a sample's forward pass is: the context + |A|
    b = BPO(backbones=2, branch_factor=3, entropy_threshold=0.0, max_branch_points=1).collect(TenWeights(), [tree()], [0])
    calls_with_entropy = len(b.entropies)
    assert b.compute.score_tokens == 4 * calls_with_entropy
    assert b.compute.flops == pytest.approx(
        cost_flops(10, prefill_tokens=b.compute.prefill_tokens, gen_tokens=b.compute.gen_tokens,
                   score_tokens=b.compute.score_tokens, train_tokens=b.compute.train_tokens)
    )
    # the trees' meters add up to the batch's
    assert sum(t.compute.flops for t in b.trees) == pytest.approx(b.compute.flops)


def test_flops_is_a_budget_unit():
    budget = Budget("flops", 20_000)
    batch = GRPO(group_size=4).collect(TenWeights(), [tree()] * 2, [0, 1, 2], budget)
    largest = max(t.compute.flops for t in batch.trees)
    assert abs(batch.compute.flops - 20_000) <= max(0.05 * 20_000, largest)


def test_trainer_meters_each_epoch_of_the_learner():
    from bpo_algos import Trainer

    one = Trainer(GRPO(group_size=4, seed=0), TenWeights(), [tree()], [0], updates=1, epochs=1, seed=0).train()[0]["compute"]
    three = Trainer(GRPO(group_size=4, seed=0), TenWeights(), [tree()], [0], updates=1, epochs=3, seed=0).train()[0]["compute"]
    assert three["train_tokens"] == 3 * one["train_tokens"]
    assert three["flops"] - one["flops"] == pytest.approx(6 * 10 * 2 * one["train_tokens"])

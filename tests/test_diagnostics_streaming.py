"""Streaming gradient statistics (running sums, O(P) memory) give the numbers of the full
``[n, P]`` sample matrix, which is what the probe kept before."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gradcheck import exact_gradient, random_policy, tree_env

from baselines import RLOO
from bpo_algos.diagnostics import (
    GradientMoments,
    gradient_samples,
    projection_z_scores,
    variance_summary,
)

TREE = {"depth": 3, "n_actions": 3, "seed": 5}


def _matrix_summary(g: torch.Tensor, truth: torch.Tensor) -> dict[str, float]:
    """The figures computed from the whole sample matrix, as the probe did before streaming."""
    g = g.double()
    mean = g.mean(0)
    total_var = float(((g - mean) ** 2).sum(1).mean() * len(g) / (len(g) - 1))
    norms = g.norm(dim=1)
    direction = truth.double() / truth.double().norm()
    along = (g @ direction).numpy()
    return {
        "trace_var": total_var,
        "grad_norm_mean": float(norms.mean()),
        "grad_norm_var": float(norms.var(unbiased=True)),
        "signal": float(mean.norm() ** 2) - total_var / len(g),
        "var_along_truth": float(along.var(ddof=1)),
        "relative_bias_along_truth": float((along.mean() - float(truth.double() @ direction)) / float(truth.double().norm())),
    }


def _samples(keep: bool, truth=None):
    env = tree_env(**TREE)
    policy = random_policy(env, seed=1)
    make = lambda: tree_env(**TREE)  # noqa: E731
    algorithm = RLOO(group_size=3, aggregation="step-sum", seed=2)
    policy.seed(3)
    return gradient_samples(algorithm, policy, [make], [0], 12, truth=truth, keep_grads=keep), exact_gradient(env, policy)


def test_streamed_statistics_equal_the_sample_matrix_ones():
    kept, truth = _samples(keep=True)
    streamed, _ = _samples(keep=False, truth=truth)
    with pytest.raises(ValueError, match="streamed"):
        streamed.grads  # noqa: B018
    reference = _matrix_summary(kept.grads, truth)
    got = variance_summary(streamed, truth)
    assert got["trace_var"] > 0
    for key, value in reference.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    assert got["z_scores"] == pytest.approx(projection_z_scores(kept.grads, truth), rel=1e-9, abs=1e-12)
    assert variance_summary(kept, truth)["z_scores"] == pytest.approx(got["z_scores"], rel=1e-9, abs=1e-12)


def test_moments_handle_growing_parameters_as_zero_padding():
    rng = np.random.default_rng(0)
    rows = [torch.tensor(rng.normal(size=k)) for k in (3, 5, 5, 4)]
    m = GradientMoments()
    for r in rows:
        m.add(r)
    full = torch.zeros(4, 5, dtype=torch.float64)
    for i, r in enumerate(rows):
        full[i, : len(r)] = r
    torch.testing.assert_close(m.mean(), full.mean(0))
    assert m.trace_var() == pytest.approx(float(((full - full.mean(0)) ** 2).sum(1).sum() / 3))


def test_gram_matrix_is_remembered_only_for_the_same_unchanged_rows():
    """The Gram matrix equals ``g @ g.T`` of the float64 rows on a first and a repeated call; an
    in-place change of the rows is computed afresh; a caller changing its copy changes nothing
    remembered."""
    from bpo_algos.diagnostics import gram_matrix

    rows = torch.randn(6, 1000, generator=torch.Generator().manual_seed(0))
    fresh = (rows.double() @ rows.double().T).numpy()
    first = gram_matrix(rows)
    assert np.array_equal(first, fresh)
    first[0, 0] = -1.0
    assert np.array_equal(gram_matrix(rows), fresh)  # remembered, and not the caller's copy
    rows[0] *= 2.0  # in place: the version changes
    changed = gram_matrix(rows)
    assert np.array_equal(changed, (rows.double() @ rows.double().T).numpy())
    assert not np.array_equal(changed, fresh)  # the broken case a stale memo would give

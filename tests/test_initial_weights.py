"""InitialWeights: one saved copy of the trainable weights, restored in place per run."""

from __future__ import annotations

import pytest
import torch

from bpo_algos.policy.scorer import TextScorerPolicy
from bpo_algos.policy.weights import InitialWeights, fresh_copy


@pytest.mark.parametrize("on_disk", [False, True])
def test_restore_puts_back_the_initial_weights_and_rng_in_place(tmp_path, on_disk):
    policy = TextScorerPolicy(buckets=128, dim=4, hidden=8, seed=0)
    start = {k: v.clone() for k, v in policy.state_dict().items()}
    saved = InitialWeights(policy, tmp_path / "init.pt" if on_disk else None)
    rng = policy.rng_state()
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(1.0)
    policy.seed(99)
    same = fresh_copy(policy, saved)
    assert same is policy
    for k, v in policy.state_dict().items():
        torch.testing.assert_close(v, start[k], rtol=0, atol=0)
    assert policy.rng_state() == rng


def test_restore_refuses_another_model():
    saved = InitialWeights(TextScorerPolicy(buckets=128, dim=4, hidden=8))
    other = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="lacks saved parameters"):
        saved.restore(other)

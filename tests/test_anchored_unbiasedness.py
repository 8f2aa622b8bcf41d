"""Exact-gradient checks of the state-anchored baselines (docs/unbiasedness.md, rule 6).

On a state-observed TreeMDP (``observe="state"``: every path at one depth shares a state before
the decisive level, so anchors match often) with a fixed TabularPolicy, the mean of the
``step-sum`` estimates of RLOO and BPO with ``baseline="anchored"`` / ``"anchored+history"``
must equal the exact gradient. Each check is a z-test along the true gradient and 3 seeded
random directions (2,000 batches, |z| < 4 per direction: a correct estimator fails one check
with probability about 4 x 6.3e-5 = 2.5e-4). Two planted violations of rule 6 run through the
same test and must be caught (|z| > 4 somewhere): a baseline that includes the step itself, and
one that includes the step's ancestors and descendants (a key without the depth, so a path's
own routine steps share it); measured, they reach |z| = 32 and 21. The history and coarse-key
variants are marked slow.
"""

from __future__ import annotations

import re

import pytest
from gradcheck import exact_gradient, random_policy, tree_env, tree_samples

from baselines import RLOO
from bpo_algos import BPO
from bpo_algos.advantages import anchored_baselines, estimate_advantages, register_advantage
from bpo_algos.diagnostics import projection_z_scores

BATCHES = 2000
Z_MAX = 4.0
STATE_TREE = {"depth": 4, "n_actions": 2, "seed": 3, "decisive_levels": (2,), "observe": "state"}


def depthless_key(tree, node):
    """A coarser key: the state without its depth, so a path's routine steps share one key."""
    return (tree.task_id, re.sub(r"\(depth \d+ of \d+\)|\[\d+; ", "", node.observation))


def _z(algorithm, policy_seed=2):
    env = tree_env(**STATE_TREE)
    policy = random_policy(env, scale=1.0, seed=policy_seed)
    truth = exact_gradient(env, policy)
    samples = tree_samples(algorithm, policy, STATE_TREE, BATCHES)
    return projection_z_scores(samples.grads, truth)


SLOW = {"rloo-anchored+history", "rloo-anchored-depthless-key", "bpo-anchored+history"}
CONFIGS = {
    "rloo-anchored": lambda: RLOO(group_size=4, baseline="anchored", aggregation="step-sum", seed=11),
    "rloo-anchored+history": lambda: RLOO(group_size=3, baseline="anchored+history", history_window=3, aggregation="step-sum", seed=12),
    "rloo-anchored-depthless-key": lambda: RLOO(group_size=4, baseline="anchored", anchor_key=depthless_key, aggregation="step-sum", seed=13),
    "bpo-anchored": lambda: BPO(backbones=2, branch_factor=3, entropy_threshold=0.0, max_branch_points=2, baseline="anchored", aggregation="step-sum", seed=14),
    "rloo-anchored-min3": lambda: RLOO(group_size=4, baseline="anchored", min_matches=3, aggregation="step-sum", seed=16),
    "bpo-anchored+history": lambda: BPO(backbones=2, branch_factor=2, entropy_threshold=None, entropy_quantile=0.5, baseline="anchored+history", aggregation="step-sum", seed=15),
}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(CONFIGS)]
)
def test_anchored_baseline_is_unbiased(name):
    zs = _z(CONFIGS[name]())
    assert max(abs(z) for z in zs) < Z_MAX, f"{name}: z-scores {zs}"


def _broken(name, **flags):
    @register_advantage(name, overwrite=True)
    def broken(trees, *, anchor_key):
        estimate_advantages("rloo", trees)
        for tree in trees:
            for edge, baseline in anchored_baselines(tree, anchor_key, **flags):
                if baseline is not None:
                    edge.advantage = edge.q - baseline

    class BrokenRLOO(RLOO):
        def estimator(self, trees):
            return name, {"anchor_key": self.baseline_choice.anchor_key}

    return BrokenRLOO


def test_a_baseline_that_includes_the_step_itself_is_caught():
    cls = _broken("test-anchored-with-self", include_self=True)
    zs = _z(cls(group_size=4, baseline="anchored", aggregation="step-sum", seed=21))
    assert max(abs(z) for z in zs) > Z_MAX, f"the broken variant went undetected: z-scores {zs}"


def test_a_baseline_that_includes_the_lineage_is_caught():
    cls = _broken("test-anchored-with-lineage", exclude_lineage=False)
    zs = _z(cls(group_size=4, baseline="anchored", anchor_key=depthless_key, aggregation="step-sum", seed=22))
    assert max(abs(z) for z in zs) > Z_MAX, f"the broken variant went undetected: z-scores {zs}"

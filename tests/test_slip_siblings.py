"""BPO's siblings on a TreeMDP with slip: i.i.d. samples from the policy given the forked state
(docs/unbiasedness.md, rule 2) that share only what the snapshot carries, the slip nonce, so the
variance among them is the exact ``variance_by_depth(siblings=True)`` (docs/mechanism.md, "How η
is estimated").

The cell: depth 3, 2 actions, binary reward decided by the *executed* action at level 1 (one of
the two wins), slip 0.8. Given the nonce at depth 1, a sibling choosing ``a`` executes a fixed
``e_a``, equal to ``a`` with probability 0.6; so ``Var(R | s_1)`` is 1/4 when ``e_0 != e_1``
(probability 0.6² + 0.4² = 0.52) and 0 otherwise: ``E Var(R | s_1) = 0.13``, where siblings that
drew their own slips would see the marginal 0.25, and siblings sampling in lockstep (one stream)
0. The second cell is decided one step later (level 2): siblings that chose the same action at
depth 1 go on with one nonce and share the slip of the same action at depth 2, so
``E Var(R | s_1) = 1/2 - (0.37 + 0.25) / 2 = 0.19`` (``E[XY]`` is 0.25 + (0.25 - 0.13) = 0.37 for
a pair that chose alike at depth 1, 0.25 for one that did not; marginal 0.25): the sharing that
the exact model's recursion carries below the branch node. BPO 2 x 4 with threshold 0 forks every
backbone at depth 1.

Error rates: the engine's mean group variance is within 4 standard errors of the exact one
(normal approximation over 400 groups, clustered by tree: a false alarm about 6e-5); the pair agreements
are binomial with mean 1/2, checked at 4.5 standard errors. The broken cases: the marginal 0.25
(nonce not shared: 15 and 8.8 standard errors off at these seeds, 14 and 8 expected; asserted at
4, so a correct engine fails it with probability about 3e-5) and a lockstep sampler (rule 2
broken: variance 0 in the first cell) are caught.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from bpo_algos import BPO, TabularPolicy
from bpo_algos.policy.base import Action, Context
from bpo_algos.rollout import EnvPool
from bpo_envs import TreeMDPEnv
from bpo_envs.seeding import key_seed

CELL = {"depth": 3, "n_actions": 2, "seed": 0, "decisive_levels": (1,), "reward": "binary", "success_rate": 0.5, "slip": 0.8}
LATER = {**CELL, "decisive_levels": (2,)}
EXACT = {(1,): 0.25 * (0.6**2 + 0.4**2), (2,): 0.5 - (0.25 + (0.25 - 0.13) + 0.25) / 2}
"""``E Var(R | s_1)`` by hand (the module docstring), by the cell's decisive level."""
SIBLINGS = 4
GROUPS = 400


class LockstepPolicy(TabularPolicy):
    """The broken case of rule 2: a branch node's ``n`` siblings all get the one action drawn
    (as if they shared one sampling stream)."""

    def sample(self, contexts: Sequence[Context], n: int, rngs: Sequence[np.random.Generator] | None) -> list[list[Action]]:
        return [row * n for row in super().sample(contexts, 1, rngs)]


def sibling_groups(policy: TabularPolicy, seed: int, cell: dict = CELL) -> list[list[list[tuple[str, float]]]]:
    """``GROUPS`` depth-1 sibling groups (or more) of ``cell``, grouped by tree: each sibling's
    ``[(action, reward), ...]`` from the branch node on."""
    pool = EnvPool([lambda: TreeMDPEnv(**cell)] * 2)
    bpo = BPO(backbones=2, branch_factor=SIBLINGS, entropy_threshold=0.0, seed=key_seed(seed, 0))
    trees: list[list[list[tuple[str, float]]]] = []
    try:
        for batch in itertools.count():
            for tree in bpo.collect(policy, pool, [0] * 25, seed=key_seed(seed, 1, batch)).trees:
                groups = []
                for node in tree.nodes():
                    if node.depth == 1 and len(node.children) > 1:
                        group = []
                        for edge in node.children:
                            steps = [(edge.action.command, edge.reward)]
                            while edge.child.children:
                                assert len(edge.child.children) == 1  # flat siblings
                                edge = edge.child.children[0]
                                steps.append((edge.action.command, edge.reward))
                            group.append(steps)
                        assert len(group) == SIBLINGS
                        groups.append(group)
                trees.append(groups)
            if sum(map(len, trees)) >= GROUPS:
                return trees
    finally:
        pool.close()
    raise AssertionError("unreachable")


def mean_group_variance(trees: list[list[list[tuple[str, float]]]]) -> tuple[float, float]:
    """The mean over groups of the siblings' sample variance (``ddof=1``: unbiased for
    ``Var(R | s_1)``) and its standard error, clustered by tree (a tree's backbones share the
    reset nonce, so its two groups are not independent)."""
    sums = np.array([sum(np.var([sum(r for _, r in s) for s in g], ddof=1) for g in groups) for groups in trees])
    counts = np.array([len(groups) for groups in trees], float)
    mean = sums.sum() / counts.sum()
    n = len(trees)
    return float(mean), float(np.sqrt(n / (n - 1) * np.sum((sums - mean * counts) ** 2)) / counts.sum())


@pytest.mark.parametrize("cell", [CELL, LATER], ids=["decided-at-the-fork", "decided-one-later"])
def test_exact_sibling_variance_by_hand(cell: dict) -> None:
    env = TreeMDPEnv(**cell)
    policy = TabularPolicy()
    with torch.no_grad():
        siblings = env.variance_by_depth(policy.log_probs, siblings=True)
        marginal = env.variance_by_depth(policy.log_probs)
    assert siblings[1] == pytest.approx(EXACT[cell["decisive_levels"]])
    assert marginal[1] == pytest.approx(0.25)
    if cell is LATER:  # from depth 2 on, the first cell's fork one step later
        assert siblings[2] == pytest.approx(EXACT[(1,)]) and marginal[2] == pytest.approx(0.25)
    else:
        assert siblings[2] == pytest.approx(0.0, abs=1e-9) and marginal[2] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("cell", [CELL, LATER], ids=["decided-at-the-fork", "decided-one-later"])
def test_engine_siblings_vary_as_the_exact_sibling_variance(cell: dict) -> None:
    exact, marginal = EXACT[cell["decisive_levels"]], 0.25
    mean, se = mean_group_variance(sibling_groups(TabularPolicy(), seed=0, cell=cell))
    assert abs(mean - exact) < 4 * se, (mean, se, exact)
    # the broken case "every sibling draws its own slips": the marginal variance, far off
    assert abs(mean - marginal) > 4 * se, (mean, se, marginal)


def test_engine_siblings_sample_independently() -> None:
    """Two siblings choose the same action at the branch node, and again one step later where
    they chose the same one (one state, one nonce), each with probability 1/2: i.i.d. draws. The
    same for the pairs with the backbone (its continuation is the first child) as for the rest."""
    groups = [g for groups in sibling_groups(TabularPolicy(), seed=1) for g in groups]
    for pairs in ([(0, 1), (0, 2), (0, 3)], [(1, 2), (1, 3), (2, 3)]):
        first = second = same_first = 0
        for group in groups:
            for i, j in pairs:
                a, b = group[i], group[j]
                first += 1
                if a[0][0] == b[0][0]:
                    same_first += 1
                    second += a[1][0] == b[1][0]
        for agree, n in ((same_first, first), (second, same_first)):
            # a group's pairs are dependent: 4.5 standard errors of one independent pair a group
            effective = n / len(pairs)
            assert abs(agree / n - 0.5) < 4.5 * np.sqrt(0.25 / effective), (pairs, agree, n)


def test_lockstep_siblings_are_caught() -> None:
    mean, se = mean_group_variance(sibling_groups(LockstepPolicy(), seed=0))
    exact = EXACT[(1,)]
    assert mean == 0.0 or abs(mean - exact) > 8 * se, (mean, se)

"""Distinct siblings (docs/unbiasedness.md, rule 7) and the measured branch rule.

Exact parts: the set weights against a brute-force sum over orderings, and the unordered-set
estimator's expectation over every possible set (no sampling). Statistical parts: the
exact-gradient z-test of tests/test_unbiasedness.py (the sample mean along the true gradient and 3
random directions; |z| < 4 per direction, so a correct estimator fails a check with probability
about 4 x 6.3e-5 = 2.5e-4), each correct configuration next to a broken one that must give
|z| > 4 (the 1/K weights with distinct draws, the baseline without its (1 - p_k) factor, a branch
rule that peeks at the sampled action).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from gradcheck import exact_gradient, random_policy, tree_env, tree_samples
from test_unbiasedness import PeekingPolicy

from bpo_algos import BPO, TabularPolicy
from bpo_algos.advantages import register_advantage
from bpo_algos.diagnostics import projection_z_scores
from bpo_algos.policy.base import Context, Policy
from bpo_algos.policy.choice import gumbel_top_k
from bpo_algos.siblings import distinct_node, leave_one_out_weights, node_set, set_weights

Z_MAX = 4.0
SMALL = {"depth": 2, "n_actions": 4, "seed": 5}
"""16 leaves: fast, and with 4 actions a draw of 2 or 3 leaves actions out, so the weights matter."""
RANDOM_TREE = {"depth": 3, "n_actions": 3, "seed": 7}
AGENT_TREE = {"depth": 5, "n_actions": 3, "seed": 3, "decisive_levels": (3,)}


def _z(algorithm, tree_kwargs, batches, *, scale=2.0, sampler_wrapper=None, policy_seed=0):
    env = tree_env(**tree_kwargs)
    policy = random_policy(env, scale=scale, seed=policy_seed)
    truth = exact_gradient(env, policy)
    sampler = sampler_wrapper(policy) if sampler_wrapper else None
    samples = tree_samples(algorithm, policy, tree_kwargs, batches, sampler=sampler)
    return projection_z_scores(samples.grads, truth)


def _sequence_probability(p, order):
    out, left = 1.0, 1.0
    for i in order:
        out *= p[i] / left
        left -= p[i]
    return out


# ---- exact ---------------------------------------------------------------------------------
def test_set_weights_are_first_draw_probabilities_given_the_set():
    p = np.random.default_rng(0).dirichlet(np.ones(6))
    for members in [(0, 2, 5), (1, 3), (0, 1, 2, 3), tuple(range(6))]:
        orders = list(itertools.permutations(members))
        total = sum(_sequence_probability(p, o) for o in orders)
        brute = [sum(_sequence_probability(p, o) for o in orders if o[0] == s) / total for s in members]
        idx = list(members)
        got = set_weights(np.log(p[idx]), 1.0 - p[idx].sum())
        np.testing.assert_allclose(got, brute, rtol=1e-10)
        assert got.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_unordered_set_gradient_is_exact_over_every_set_and_needs_its_factor(k):
    """``sum_S P(S) sum_{s in S} w_S(s) (1 - p_s)(f_s - C_{-s}) grad log p_s`` equals
    ``sum_s grad p_s f_s`` (softmax logits) to rounding; dropping ``1 - p_s`` does not."""
    rng = np.random.default_rng(k)
    p = rng.dirichlet(np.ones(5))
    f = rng.normal(size=5)
    jac = np.diag(p) - np.outer(p, p)  # row s: grad of p_s with respect to the logits
    truth = jac.T @ f
    with_factor, without = np.zeros(5), np.zeros(5)
    value = 0.0
    for members in itertools.combinations(range(5), k):
        idx = list(members)
        prob = sum(_sequence_probability(p, o) for o in itertools.permutations(members))
        logp, rest = np.log(p[idx]), 1.0 - p[idx].sum()
        w = set_weights(logp, rest)
        others = leave_one_out_weights(logp, rest) @ f[idx]
        value += prob * float(w @ f[idx])
        for i, s in enumerate(idx):
            score = jac[s] / p[s]
            with_factor += prob * w[i] * (1 - p[s]) * (f[s] - others[i]) * score
            without += prob * w[i] * (f[s] - others[i]) * score
    assert value == pytest.approx(float(p @ f), abs=1e-12)
    np.testing.assert_allclose(with_factor, truth, atol=1e-12)
    assert np.abs(without - truth).max() > 1e-3


def test_gumbel_top_k_draws_distinct_actions_first_from_the_policy():
    """The first of the drawn set follows ``p`` (chi-square test, 20,000 seeded draws; the bound is
    the 1 - 1e-6 quantile of chi2 with 4 degrees of freedom: error rate 1e-6)."""
    p = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
    rng = np.random.default_rng(1)
    n = 20_000
    counts = np.zeros(5)
    for _ in range(n):
        picks = gumbel_top_k(np.log(p), 3, rng)
        assert len(set(picks.tolist())) == 3
        counts[picks[0]] += 1
    chi2 = float(((counts - n * p) ** 2 / (n * p)).sum())
    assert chi2 < 33.4, (chi2, counts / n)
    assert len(gumbel_top_k(np.log([0.3, 0.7]), 4, rng)) == 2  # fewer admissible than K: all of them


def test_choice_policy_samples_distinct_and_other_policies_refuse():
    policy = TabularPolicy(seed=0)
    context = Context(0, "obs", ("a", "b", "c"), (), "obs")
    rows = policy.sample_distinct([context, context], 2, rngs=[np.random.default_rng(i) for i in range(2)])
    for row in rows:
        assert len({a.text for a in row}) == 2
        assert all(a.logprob == pytest.approx(np.log(1 / 3)) for a in row)
    assert len(policy.sample_distinct([context], 5)[0]) == 3

    class FreeText(Policy):
        pass

    with pytest.raises(NotImplementedError, match="enumerable admissible actions"):
        FreeText().sample_distinct([context], 2)


def test_options_are_checked():
    with pytest.raises(ValueError, match="siblings"):
        BPO(siblings="unique")
    with pytest.raises(ValueError, match="tree baseline"):
        BPO(siblings="distinct", baseline="anchored")
    with pytest.raises(ValueError, match="branch_rule"):
        BPO(branch_rule="oracle")
    with pytest.raises(ValueError, match="measure_explore"):
        BPO(branch_rule="measured", measure_explore=1.5)


def test_distinct_trees_have_distinct_children_and_weights_summing_to_one():
    make = lambda: tree_env(**RANDOM_TREE)  # noqa: E731
    policy = random_policy(make(), scale=2.0)
    bpo = BPO(backbones=3, branch_factor=3, entropy_threshold=0.0, max_branch_points=2, siblings="distinct", distinct_backbones=True, seed=0)
    batch = bpo.collect(policy, [make, make], [0, 0, 0])
    for tree in batch.trees:
        branch = [n for n in tree.branch_nodes() if distinct_node(tree, n, True, True)]
        assert branch and tree.root in branch
        for node in branch:
            assert len({e.action.text for e in node.children}) == len(node.children) == 3
            logp, rest = node_set(node)
            assert rest == pytest.approx(0.0, abs=1e-12)  # 3 of 3 actions: the set is everything
        assert sum(e.weight for e in tree.leaf_edges()) == pytest.approx(1.0)


def test_a_policy_without_distinct_sampling_fails_clearly_in_collect():
    class Iid(Policy):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def sample(self, contexts, n, rngs):
            return self.inner.sample(contexts, n, rngs=rngs)

        def decision_entropy(self, contexts):
            return self.inner.decision_entropy(contexts)

    make = lambda: tree_env(**SMALL)  # noqa: E731
    bpo = BPO(backbones=2, branch_factor=2, entropy_threshold=0.0, siblings="distinct")
    with pytest.raises(NotImplementedError, match="siblings='iid'"):
        bpo.collect(Iid(random_policy(make())), [make], [0])


# ---- the exact gradient --------------------------------------------------------------------
class OneOverK(BPO):
    """Broken: distinct draws, but rule 3's ``1/K`` weights and rule 4's plain leave-one-out
    mean (the i.i.d. estimator applied to a draw without replacement)."""

    def finish_trees(self, trees):
        pass

    def estimator(self, trees):
        return "bpo", {}


@register_advantage("test-distinct-without-factor", overwrite=True)
def _without_factor(trees, *, distinct_root=False, distinct_inner=True):
    """Broken: rule 7's weights, but ``A_k = G_k - C_{-k}`` at a distinct node (no ``1 - p_k``)."""
    def visit(tree, node, baseline, collected):
        if node.is_branch:
            qs = np.array([e.q for e in node.children])
            if distinct_node(tree, node, distinct_root, distinct_inner):
                others = leave_one_out_weights(*node_set(node)) @ qs
            else:
                others = (qs.sum() - qs) / (len(qs) - 1)
            for edge, b in zip(node.children, others, strict=True):
                edge.advantage = float(edge.q - b)
                visit(tree, edge.child, float(b), edge.reward)
        else:
            for edge in node.children:
                edge.advantage = float(collected + edge.q - baseline)
                visit(tree, edge.child, baseline, collected + edge.reward)

    for tree in trees:
        visit(tree, tree.root, 0.0, 0.0)


class WithoutFactor(BPO):
    def estimator(self, trees):
        return "test-distinct-without-factor", self._distinct_where()


DISTINCT = dict(backbones=3, branch_factor=3, entropy_threshold=0.0, siblings="distinct", distinct_backbones=True, aggregation="step-sum")


def test_distinct_siblings_are_unbiased_on_the_exact_gradient():
    zs = _z(BPO(**DISTINCT, seed=1), SMALL, 400)
    assert max(abs(z) for z in zs) < Z_MAX, zs


@pytest.mark.parametrize("broken", [OneOverK, WithoutFactor])
def test_the_exact_gradient_check_catches_wrong_distinct_weights(broken):
    zs = _z(broken(**DISTINCT, seed=1), SMALL, 150)  # max |z|: 40 (1/K), 35 (no 1 - p_k)
    assert max(abs(z) for z in zs) > Z_MAX, f"{broken.__name__} went undetected: {zs}"


SLOW_CONFIGS = {
    "inner-only-K2": dict(backbones=2, branch_factor=2, entropy_threshold=0.0, siblings="distinct"),
    "K3-M2-nested": dict(backbones=2, branch_factor=3, entropy_threshold=0.0, max_branch_points=2, max_depth=2, siblings="distinct", distinct_backbones=True),
    "backbones-only": dict(backbones=3, branch_factor=2, entropy_threshold=0.0, distinct_backbones=True),
    "adaptive-threshold": dict(backbones=2, branch_factor=2, entropy_threshold=None, entropy_quantile=0.5, siblings="distinct"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SLOW_CONFIGS))
def test_distinct_configurations_are_unbiased(name):
    zs = _z(BPO(**SLOW_CONFIGS[name], aggregation="step-sum", seed=3), RANDOM_TREE, 800)
    assert max(abs(z) for z in zs) < Z_MAX, f"{name}: {zs}"


# ---- the measured branch rule ----------------------------------------------------------------
def test_measured_rule_plans_from_earlier_batches_only():
    """The plan in force for a batch is the one recorded after the previous batch; it is a
    distribution over depths and the hazard makes the first branch depth follow it."""
    make = lambda: tree_env(**AGENT_TREE)  # noqa: E731
    policy = random_policy(make(), scale=1.0)
    bpo = BPO(backbones=2, branch_factor=2, entropy_threshold=0.0, branch_rule="measured", min_measured=2, seed=0)
    assert not bpo.depths.ready
    first = bpo.collect(policy, [make, make], [0, 0])
    assert first.shape_stats()["branch_depth_mean"] == 1.0  # no plan yet: the entropy rule (threshold 0)
    for _ in range(6):
        plan = bpo.depths.plan()
        assert sum(plan.values()) == pytest.approx(1.0) and set(plan) == {1, 2, 3, 4}
        before = dict(plan)
        batch = bpo.collect(policy, [make, make], [0, 0], finish=False)
        assert bpo.depths.plan() == before  # collecting does not change the plan
        assert batch.entropies == []  # no scoring passes: the measured rule needs no entropy
        bpo.end_batch(batch)
    q = bpo.depths.plan()
    tail = 1.0
    for depth in sorted(q):
        assert bpo.depths.branch_probability(depth) == pytest.approx(q[depth] / tail)
        tail -= q[depth]
    table = bpo.depths.table(2)
    assert set(table) <= {1, 2, 3, 4} and all(s.nodes > 0 for s in table.values())


def test_measured_rule_is_unbiased():
    bpo = BPO(backbones=2, branch_factor=2, entropy_threshold=0.0, branch_rule="measured", min_measured=2, aggregation="step-sum", seed=4)
    zs = _z(bpo, RANDOM_TREE, 300, scale=1.0)
    assert max(abs(z) for z in zs) < Z_MAX, zs


@pytest.mark.slow
def test_a_peeking_branch_rule_is_caught():
    """The positive control of the measured rules' check: the rule of ``entropy+measured`` fed
    an entropy that depends on the backbone's sampled action (rule 1 broken)."""
    peek = BPO(backbones=2, branch_factor=4, entropy_threshold=1.0, branch_rule="entropy+measured", aggregation="step-sum", seed=7)
    zs = _z(peek, RANDOM_TREE, 1200, scale=1.0, sampler_wrapper=PeekingPolicy)
    # |z| about 3.5 in every direction: caught by the sum of squares, whose bound 21.5 a correct
    # estimator exceeds with probability about 2.5e-4 (chi2, 4 dof; approximate: the 4 directions
    # are nearly, not exactly, orthogonal)
    assert max(abs(z) for z in zs) > Z_MAX or sum(z * z for z in zs) > 21.5, f"the peeking rule went undetected: {zs}"


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["measured", "entropy+measured"])
def test_measured_rules_are_unbiased_with_distinct_siblings(rule):
    bpo = BPO(backbones=2, branch_factor=3, entropy_threshold=None, entropy_quantile=0.5, branch_rule=rule,
              min_measured=2, siblings="distinct", aggregation="step-sum", seed=5)
    zs = _z(bpo, AGENT_TREE, 600, scale=1.0, policy_seed=1)
    assert max(abs(z) for z in zs) < Z_MAX, f"{rule}: {zs}"


def test_state_dict_keeps_the_measurements():
    make = lambda: tree_env(**AGENT_TREE)  # noqa: E731
    policy = random_policy(make(), scale=1.0)
    bpo = BPO(backbones=2, branch_factor=2, entropy_threshold=0.0, branch_rule="measured", min_measured=1, seed=0)
    for _ in range(3):
        bpo.collect(policy, [make], [0])
    other = BPO(backbones=2, branch_factor=2, entropy_threshold=0.0, branch_rule="measured", min_measured=1, seed=0)
    other.load_state_dict(bpo.state_dict())
    assert other.depths.plan() == bpo.depths.plan()
    assert torch.isfinite(torch.tensor(list(other.depths.plan().values()))).all()

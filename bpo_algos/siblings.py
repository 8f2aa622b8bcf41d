"""Distinct siblings: ``K`` different actions at a branch node, drawn without replacement, with
weights that keep BPO's estimator unbiased (docs/unbiasedness.md, rule 7).

**Drawing.** Gumbel-top-k: with ``g_a = log pi(a|h) + Gumbel(0, 1)`` independent over the
admissible actions, the ``K`` largest, in decreasing order, are an ordered sample without
replacement (Plackett-Luce: the first is drawn from ``pi``, the next from ``pi`` renormalised
over the rest, ...). The backbone continues with the first. Fewer than ``K`` admissible actions:
all of them.

**Weights** (Kool, van Hoof & Welling 2020, the unordered-set estimator). For the drawn set
``S`` (its non-members holding probability mass ``r = 1 - sum_{s in S} p_s``)::

    w_S(s) = p_s F_{D\\s}(S\\s) / F_D(S) = P(first draw = s | the set drawn is S)

where ``F_D(S)`` is the probability of drawing the unordered set ``S`` from the domain ``D``
(summed over its orderings; here by a recursion over subsets). The weights sum to 1, and for any
``f``, ``E_S[sum_{s in S} w_S(s) f(s, S\\s)] = sum_s p_s E_{T ~ WOR(D\\s, K-1)}[f(s, T)]``: the
weighted set behaves as one draw ``s ~ pi`` with the others drawn without replacement from the
rest. Rule 3 becomes: a step's weight is the product, over the branch nodes above it, of
``w_S(s)`` at a distinct node (``1/K`` at an i.i.d. one), and an edge's value ``Q`` is the
``w``-weighted mean of its child's out-edges' values.

**Advantage** at a distinct branch node ``b`` for child ``k`` (value ``G_k``)::

    A_k = (1 - p_k) (G_k - C_{-k}),   C_{-k} = sum_{j in S\\k} w_{S\\k}^{D\\k}(j) G_j

``C_{-k}`` is the same estimator over the other members, an unbiased estimate of
``E[Q(h, a) | a != k]`` (the others are a draw without replacement from ``D\\k``, whose
non-members hold the same mass ``r``). Why it is unbiased: ``G_k - A_k = p_k G_k + (1 - p_k)
C_{-k}`` is an estimate of ``V(h) = p_k Q_k + (1 - p_k) E[Q | a != k]`` whose expectation is
``V(h)`` whatever ``k`` is, so ``sum_k p_k grad log p_k (G_k - A_k)`` has expectation
``V(h) sum_k grad p_k = 0``: the baseline adds no bias. Without the factor ``1 - p_k`` (``C_{-k}``
alone as the baseline) the baseline's mean would depend on ``k``. Steps below ``k`` (down to the
next branch node) get rule 4's ``A_t = G_k(t) - C_{-k}``: ``C_{-k}`` depends on the other
members only, which are independent of what happens below ``k`` given ``k``.

A policy draws distinct siblings with ``sample_distinct`` (:class:`~bpo_algos.policy.choice.ChoicePolicy`:
actions it can enumerate; :func:`~bpo_algos.policy.choice.gumbel_top_k`); the exact-gradient
tests (tests/test_distinct_siblings.py) check the whole estimator and catch the ``1/K`` weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bpo_algos.advantages import as_batch, register_advantage
from bpo_algos.tree import Node, RolloutTree

SIBLINGS = ("iid", "distinct")
MAX_SET = 16
"""The largest set whose weights are computed exactly (the recursion is ``O(2^K K)``)."""


def _log_set_probability(logp: np.ndarray, rest: float) -> float:
    """``log F(S)``: the log-probability that drawing ``len(logp)`` times without replacement
    gives exactly the members (log-probabilities ``logp``) in some order, when the non-members
    hold mass ``rest``. Recursion over the subsets ``U`` drawn first:
    ``F(U) = sum_{u in U} F(U\\u) p_u / (rest + p(S\\U) + p_u)``."""
    n = len(logp)
    if n == 0:
        return 0.0
    if n > MAX_SET:
        raise ValueError(f"distinct sets of more than {MAX_SET} members are not supported, got {n}")
    p = np.exp(logp)
    full = (1 << n) - 1
    log_f = np.full(1 << n, -np.inf)
    log_f[0] = 0.0
    mass = np.zeros(1 << n)  # p(U) by mask
    for mask in range(1, 1 << n):
        low = (mask & -mask).bit_length() - 1
        mass[mask] = mass[mask & (mask - 1)] + p[low]
    for mask in range(1, 1 << n):
        terms = []
        for u in range(n):
            if mask >> u & 1:
                before = mask ^ (1 << u)
                # the mass left when u is drawn: the non-members and the members not drawn before
                # it (a sum of positives: no cancellation when the set holds nearly all the mass)
                terms.append(log_f[before] + logp[u] - np.log(max(rest + mass[full ^ before], 1e-300)))
        log_f[mask] = np.logaddexp.reduce(terms)
    return float(log_f[-1])


def set_weights(logp: Sequence[float], rest: float) -> np.ndarray:
    """``w_S(s) = P(first draw = s | set S)`` for the members' log-probabilities ``logp`` and the
    non-members' mass ``rest`` (the module docstring); they sum to 1."""
    logp = np.asarray(logp, dtype=np.float64)
    n = len(logp)
    if n == 1:
        return np.ones(1)
    rest = max(float(rest), 0.0)
    p = np.exp(logp)
    total = rest + float(p.sum())
    # P(first = s, set = S) = p_s / total * F_{D\s}(S\s), the latter over the domain without s
    logs = np.array([
        logp[s] - np.log(total) + _log_set_probability(np.delete(logp, s), rest) for s in range(n)
    ])
    w = np.exp(logs - logs.max())
    return w / w.sum()


def leave_one_out_weights(logp: Sequence[float], rest: float) -> np.ndarray:
    """``[K, K]``: row ``k`` holds the weights ``w_{S\\k}^{D\\k}`` of the other members (0 at
    ``k``), so ``row_k @ G = C_{-k}``."""
    logp = np.asarray(logp, dtype=np.float64)
    n = len(logp)
    out = np.zeros((n, n))
    for k in range(n):
        others = [j for j in range(n) if j != k]
        out[k, others] = set_weights(logp[others], rest)
    return out


def node_set(node: Node) -> tuple[np.ndarray, float]:
    """The members' log-probabilities at a distinct branch node (from its edges' recorded
    sampling log-probs) and the mass ``r`` of the actions not drawn."""
    logp = np.array([e.action.logprob for e in node.children], dtype=np.float64)
    return logp, max(0.0, 1.0 - float(np.exp(logp).sum()))


def distinct_node(tree: RolloutTree, node: Node, distinct_root: bool, distinct_inner: bool) -> bool:
    """Whether ``node`` is a branch node whose children were drawn without replacement: the root
    with ``distinct_root`` (``distinct_backbones``), an inner one with ``distinct_inner``
    (``siblings="distinct"``)."""
    return node.is_branch and (distinct_root if node is tree.root else distinct_inner)


def child_weights(tree: RolloutTree, node: Node, distinct_root: bool, distinct_inner: bool) -> np.ndarray:
    """The local weights of ``node``'s out-edges: ``w_S`` at a distinct branch node, else ``1/K``."""
    n = len(node.children)
    if distinct_node(tree, node, distinct_root, distinct_inner):
        return set_weights(*node_set(node))
    return np.full(n, 1.0 / n)


def finalize_distinct(tree: RolloutTree, *, distinct_root: bool = False, distinct_inner: bool = True) -> None:
    """Rule 3 with rule 7's weights: every edge's ``weight`` and ``Q`` (module docstring)."""

    def visit(node: Node, weight: float) -> float:
        if not node.children:
            return 0.0
        local = child_weights(tree, node, distinct_root, distinct_inner)
        total = 0.0
        for edge, w in zip(node.children, local, strict=True):
            edge.weight = weight * float(w)
            edge.q = edge.reward + visit(edge.child, edge.weight)
            total += float(w) * edge.q
        return total

    visit(tree.root, 1.0)


@register_advantage("bpo-distinct")
def distinct_advantages(
    trees: Sequence[RolloutTree], *, distinct_root: bool = False, distinct_inner: bool = True
) -> None:
    """Rule 4 with distinct siblings (rule 7): at a distinct branch node ``A_k = (1 - p_k)(G_k -
    C_{-k})`` and ``A_t = G_k(t) - C_{-k}`` below it; at an i.i.d. one rule 4 as it stands. The
    trees' weights and values must come from :func:`finalize_distinct`."""

    def visit(tree: RolloutTree, node: Node, baseline: float, collected: float) -> None:
        if node.is_branch:
            qs = np.array([e.q for e in node.children])
            if distinct_node(tree, node, distinct_root, distinct_inner):
                logp, rest = node_set(node)
                others = leave_one_out_weights(logp, rest) @ qs
                scale = 1.0 - np.exp(logp)
            else:
                others = (qs.sum() - qs) / (len(qs) - 1)
                scale = np.ones(len(qs))
            for edge, b, s in zip(node.children, others, scale, strict=True):
                edge.advantage = float(s * (edge.q - b))
                visit(tree, edge.child, float(b), edge.reward)
        else:
            for edge in node.children:  # at most one
                edge.advantage = float(collected + edge.q - baseline)
                visit(tree, edge.child, baseline, collected + edge.reward)

    for tree in as_batch(trees):
        visit(tree, tree.root, 0.0, 0.0)

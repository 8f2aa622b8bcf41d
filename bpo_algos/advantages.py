"""Advantage estimators, as small named functions (in the spirit of verl's ``core_algos``).

The group estimators take the returns of one group (the ``N`` siblings at a root) and return
one advantage per member; the tree estimators write ``edge.advantage`` for every edge of a
finalized :class:`~bpo_algos.tree.RolloutTree`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bpo_algos.tree import Edge, Node, RolloutTree

GRPO_SCALES = ("group", "none")


def grpo_advantages(returns: Sequence[float], scale: str = "group", eps: float = 1e-6) -> np.ndarray:
    """GRPO: ``A_i = (R_i - mean(R)) / (std(R) + eps)``; ``scale="none"`` drops the std (Dr. GRPO).

    ``std`` is the sample standard deviation (``ddof=1``), as in TRL and verl; a group of one
    has advantage 0.
    """
    if scale not in GRPO_SCALES:
        raise ValueError(f"scale must be one of {GRPO_SCALES}, got {scale!r}")
    r = np.asarray(returns, dtype=np.float64)
    if r.size < 2:
        return np.zeros_like(r)
    centred = r - r.mean()
    if scale == "none":
        return centred
    return centred / (r.std(ddof=1) + eps)


def rloo_advantages(returns: Sequence[float]) -> np.ndarray:
    """RLOO: ``A_i = R_i - mean_{j != i} R_j`` (leave-one-out baseline; unbiased)."""
    r = np.asarray(returns, dtype=np.float64)
    n = r.size
    if n < 2:
        return np.zeros_like(r)
    return r - (r.sum() - r) / (n - 1)


def _broadcast_root_group(tree: RolloutTree, advantages: np.ndarray) -> None:
    for advantage, first in zip(advantages, tree.root.children, strict=True):
        stack = [first]
        while stack:
            edge = stack.pop()
            edge.advantage = float(advantage)
            stack.extend(edge.child.children)


def group_advantages(tree: RolloutTree, estimator: str, scale: str = "group", eps: float = 1e-6) -> None:
    """Trajectory-level advantages of a root group, copied to every step of each trajectory.

    ``R_i`` is the return of the i-th trajectory (``Q`` of the i-th root edge).
    """
    returns = [edge.q for edge in tree.root.children]
    if estimator == "grpo":
        adv = grpo_advantages(returns, scale=scale, eps=eps)
    elif estimator == "rloo":
        adv = rloo_advantages(returns)
    else:
        raise ValueError(f"unknown group estimator {estimator!r}")
    _broadcast_root_group(tree, adv)


def bpo_advantages(tree: RolloutTree) -> None:
    """BPO per-step advantages (docs/unbiasedness.md, rule 4).

    For a step ``t`` on a path that left its nearest branch node ``b`` (the step's own source,
    if that is a branch node) through child ``k``::

        A_t = G_k(t) - mean_{j != k} G_j

    where ``G_j = Q(b's j-th edge)`` and ``G_k(t)`` is the reward collected from ``b`` before
    step ``t`` plus ``Q(t)``. The siblings ``j != k`` are sampled independently of the actions
    on path ``k``, so the baseline adds no bias; every step gets a term.
    """

    def visit(node: Node, baseline: float, collected: float) -> None:
        if node.is_branch:
            qs = np.array([e.q for e in node.children])
            loo = (qs.sum() - qs) / (len(qs) - 1)
            for edge, b in zip(node.children, loo, strict=True):
                edge.advantage = float(edge.q - b)
                visit(edge.child, float(b), edge.reward)
        else:
            for edge in node.children:  # at most one
                edge.advantage = float(collected + edge.q - baseline)
                visit(edge.child, baseline, collected + edge.reward)

    root = tree.root
    if not root.is_branch:
        raise ValueError("BPO needs a root with at least two backbones (K0 >= 2)")
    visit(root, 0.0, 0.0)


def edge_list(trees: Sequence[RolloutTree]) -> list[tuple[int, Edge]]:
    """``(tree index, edge)`` for every edge of every tree, in a fixed order."""
    return [(i, e) for i, tree in enumerate(trees) for e in tree.edges()]

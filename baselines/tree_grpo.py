"""Tree-GRPO (Ji et al. 2025, arXiv 2509.21240; AMAP-ML/Tree-GRPO): agent-step tree search.

Per task, ``m`` trees, each grown as published:

1. *initialisation*: one chain (a full episode) from the reset state;
2. *expansion*, ``l`` times: ``n`` nodes are drawn uniformly, with replacement, from the tree's
   root and its decision points (leaves excluded), and from each a new chain is sampled and
   rolled to the end. Here the env is brought to the node by restoring the snapshot the engine
   took there (``snapshot_nodes``), where the original re-feeds the prefix to a stateless tool;
3. ``k`` of the tree's ``1 + n l`` leaves are kept at random (the rest pruned; by default all).

Advantage (:func:`bpo_algos.advantages.tree_grpo_advantages`): every kept leaf's return is
normalised against all the batch's trees of its task (inter-tree; Tree-GRPO groups by the
prompt's dataset index, so a task met twice in a budgeted batch forms one group) and against its
own tree (intra-tree);
the sum is given to every token of the leaf's path. Biased by the std divisions, as published.

Defaults are those of the repository's web-agent script (``train_webagent_tree_search.sh``:
``ts_m=2, ts_n=2, ts_l=1, ts_k=3, expand_mode=random``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bpo_algos.advantages import groups_by_task
from bpo_algos.algorithm import Algorithm, Options
from bpo_algos.tree import Edge, Node, RolloutTree
from bpo_envs.validation import check_count


@dataclass
class TreeGRPOOptions(Options):
    """Tree-GRPO's own options (the repository's names in brackets)."""

    m: int = 2
    """Trees per task (``ts_m``)."""
    n: int = 2
    """Nodes expanded per tree and iteration (``ts_n``)."""
    l: int = 1  # noqa: E741
    """Expansion iterations (``ts_l``)."""
    k: int = 3
    """Leaves kept per tree, at most ``1 + n * l`` (``ts_k``)."""
    eps: float = 1e-6
    """Added to the stds."""

    def __post_init__(self) -> None:
        check_count("m", self.m, 1)
        check_count("n", self.n, 1)
        check_count("l", self.l, 0)
        check_count("k", self.k, 1)
        if self.k > 1 + self.n * self.l:
            raise ValueError(f"k={self.k} leaves per tree, but a tree has 1 + n*l = {1 + self.n * self.l}")
        if self.m * self.k < 2:
            raise ValueError("m * k must be >= 2: the inter-tree group needs two leaves")


class TreeGRPO(Algorithm):
    """Tree-based Group Relative Policy Optimization: options :class:`TreeGRPOOptions`."""

    name = "tree-grpo"
    Options = TreeGRPOOptions
    unbiased = False
    """Its group-normalised (and, for GiGPO, step-grouped) advantages bias the gradient: the main
    job reports the cosine of its mean gradient to RLOO's."""
    root_branches = 1
    snapshot_nodes = True
    """The engine snapshots every decision node, so that an expansion restores instead of replaying."""

    def __init__(self, options: TreeGRPOOptions | None = None, **kwargs: Any) -> None:
        super().__init__(options, **kwargs)
        self._salt = int(self._rng.integers(2**63 - 1))

    # ---- topology ------------------------------------------------------------------------
    @property
    def trees_per_task(self) -> int:  # type: ignore[override]
        return self.options.m

    def expansions(self, tree: RolloutTree, round: int) -> list[Node]:
        """``n`` nodes drawn uniformly with replacement from the root and the decision points."""
        if round >= self.options.l:
            return []
        candidates = [tree.root, *(e.child for e in tree.edges() if not e.child.is_leaf)]
        return [candidates[i] for i in self._tree_random(tree, 1, round).integers(len(candidates), size=self.options.n)]

    def finish_trees(self, trees: list[RolloutTree]) -> None:
        """Step 3: ``k`` leaves of each tree kept at random, the rest pruned."""
        for tree in trees:
            self._keep_leaves(tree)

    # ---- estimator -----------------------------------------------------------------------
    def estimator(self, trees: Sequence[RolloutTree]) -> tuple[str, dict[str, Any]]:
        """``tree-grpo``, grouped by task over the batch's trees."""
        return "tree-grpo", {"groups": groups_by_task(trees), "eps": self.options.eps}

    def _keep_leaves(self, tree: RolloutTree) -> None:
        leaves = tree.leaf_edges()
        if len(leaves) <= self.options.k:
            return
        kept = {id(leaves[i]) for i in self._tree_random(tree, 2).choice(len(leaves), size=self.options.k, replace=False)}

        def keep(edge: Edge) -> bool:
            edge.child.children = [c for c in edge.child.children if keep(c)]
            _reset_branch_factor(edge.child)
            return id(edge) in kept or bool(edge.child.children)

        tree.root.children = [e for e in tree.root.children if keep(e)]
        _reset_branch_factor(tree.root)
        tree.finalize()

    def _tree_random(self, tree: RolloutTree, *purpose: int) -> np.random.Generator:
        """The randomness of one tree's expansions or pruning: a function of the algorithm's
        seed and the tree's reset seed only (not of which trees came before it, or where)."""
        if tree.seed is None:
            raise ValueError("Tree-GRPO needs trees built by the rollout engine (tree.seed is None)")
        return np.random.default_rng([self._salt, tree.seed, *purpose])


def _reset_branch_factor(node: Node) -> None:
    if node.branch_factor > 1:
        node.branch_factor = max(len(node.children), 1)


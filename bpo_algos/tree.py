"""``RolloutTree``: the rollouts of one task, for every algorithm.

The root is the reset state; a node is a decision point (history ``h``); an edge is one agent
step. A *branch node* has ``K`` child edges, i.i.d. samples from the policy at ``h`` (the root
branches into ``N`` for GRPO/RLOO, ``K0`` for BPO); every other inner node has one. A leaf is a
finished episode.

docs/unbiasedness.md, rule 3, computed by :meth:`RolloutTree.finalize`:

* weight: ``w(e) = prod over branch nodes b above e (including e's source) of 1 / K_b``, so each
  branch node's subtree counts as one sample and the leaf weights of a tree sum to 1;
* value: ``Q(e) = r(e) + mean_{e' out of child(e)} Q(e')`` — the weighted mean, over the leaves
  below ``e``, of the reward collected from ``e`` on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from bpo_algos.compute import ComputeMeter
from bpo_algos.policy.base import Action, Context


@dataclass(eq=False)
class Node:
    """A decision point (or a leaf)."""

    context: Context
    info: dict[str, Any]
    parent: Edge | None = None
    children: list[Edge] = field(default_factory=list)
    depth: int = 0
    entropy: float | None = None
    """Decision entropy computed here before sampling (None where none was needed)."""
    branch_factor: int = 1
    """K of a branch node (how many i.i.d. actions were sampled here), else 1."""

    @property
    def observation(self) -> str:
        return self.context.observation

    @property
    def is_branch(self) -> bool:
        return self.branch_factor > 1

    @property
    def is_leaf(self) -> bool:
        return self.parent is not None and (self.parent.terminated or self.parent.truncated)


@dataclass(eq=False)
class Edge:
    """One agent step: the action taken at ``parent`` and what the env answered."""

    parent: Node
    child: Node
    action: Action
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    weight: float = 0.0
    q: float = 0.0
    advantage: float = 0.0

    @property
    def context(self) -> Context:
        return self.parent.context

    @property
    def entropy(self) -> float | None:
        return self.parent.entropy

    @property
    def prompt_token_ids(self) -> tuple[int, ...]:
        return self.action.prompt_token_ids

    @property
    def old_logprobs(self) -> tuple[float, ...]:
        return self.action.logprobs

    @property
    def won(self) -> bool:
        return bool(self.info.get("won", False))


@dataclass(eq=False)
class RolloutTree:
    """All rollouts of one task: nodes, edges, weights (rule 3), values, compute used."""

    task_id: Any
    root: Node
    compute: ComputeMeter = field(default_factory=ComputeMeter)

    def edges(self) -> list[Edge]:
        """Every edge, depth-first, children in sampling order."""
        out: list[Edge] = []
        stack = list(reversed(self.root.children))
        while stack:
            edge = stack.pop()
            out.append(edge)
            stack.extend(reversed(edge.child.children))
        return out

    def nodes(self) -> Iterator[Node]:
        yield self.root
        for edge in self.edges():
            yield edge.child

    def leaf_edges(self) -> list[Edge]:
        """The last edge of every finished episode."""
        return [e for e in self.edges() if e.terminated or e.truncated]

    def branch_nodes(self) -> list[Node]:
        return [n for n in self.nodes() if n.is_branch]

    @property
    def branch_points(self) -> int:
        """Inner branch nodes: branch nodes other than the root (0 for a GRPO/RLOO fan)."""
        return sum(1 for n in self.branch_nodes() if n is not self.root)

    def finalize(self) -> None:
        """Compute every edge's weight and value ``Q`` (rule 3)."""

        def visit(node: Node, weight: float) -> float:
            # returns the mean Q of node's out-edges (0 at a leaf)
            if not node.children:
                return 0.0
            share = weight / len(node.children)
            total = 0.0
            for edge in node.children:
                edge.weight = share
                edge.q = edge.reward + visit(edge.child, share)
                total += edge.q
            return total / len(node.children)

        # iterative depth would be nicer, but episodes are at most a few hundred steps
        visit(self.root, 1.0)

    # ---- summaries (weighted: unbiased estimates for the policy that collected the tree) --
    def mean_return(self) -> float:
        """Weighted mean episode return (= mean Q of the root's children)."""
        kids = self.root.children
        return sum(e.q for e in kids) / len(kids) if kids else 0.0

    def success_rate(self) -> float:
        """Weighted fraction of won episodes."""
        return sum(e.weight * e.won for e in self.leaf_edges())

    def path_to(self, edge: Edge) -> list[Edge]:
        """Edges from the root down to ``edge`` (inclusive)."""
        path = [edge]
        while path[-1].parent.parent is not None:
            path.append(path[-1].parent.parent)
        return path[::-1]

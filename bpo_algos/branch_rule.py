"""Where BPO branches: the ``"measured"`` branch rule (``BPOOptions.branch_rule``).

The entropy rule branches where the policy is unsure. Whether a branch pays depends on other
things (docs/mechanism.md): how much of the return variance the history at the branch point
explains (``eta``) and what a fork there costs (the steps left to the end). The measured rule
reads both, by depth, from the previous ``measure_window`` batches' trees, and branches where
the model of docs/mechanism.md (:func:`bpo_algos.mechanism.predict_variance_ratio`) predicts
the lowest gradient variance per env step.

For depth ``d`` (steps from the root) over the window's inner branch nodes at ``d``:

* ``eta(d) = 1 - mean_b Var(R | h_b) / Var(R | task_b)`` with the mechanism's unbiased forms
  (:func:`~bpo_algos.mechanism.unit_variance`: the children's between mean square plus their
  leaves' spread, so nested children count right; the task variance is the mean over the
  window's trees of that task of each tree's own, from its backbones; docs/mechanism.md). With
  distinct siblings the children's plain variance over-weights rare actions: a plug-in that only
  steers where to branch, never the estimate;
* ``cost(d)``: a tree that forks ``K`` at ``d`` spends ``(L + (K - 1)(L - d)) / K`` steps per leaf,
  ``L`` the mean episode length;
* ``score(d)`` = the predicted ``Var(BPO) / Var(RLOO)`` at matched env steps for branching once
  at ``d`` with ``eta(d)`` and that cost (lower is better), the gradient's score mass by depth
  taken from the decision entropy by depth, estimated without extra passes as the mean
  ``-log pi(a|h)`` of the recorded steps at each depth. The mass matters: ``eta`` is high just
  after a decisive decision and near 0 at it (the children differ by that decision), yet a
  branch at the decision is what gives it a baseline; only the steps after the branch point
  gain the ``1 - eta`` (docs/mechanism.md).

**The plan** (:meth:`DepthMeasure.plan`): a distribution ``q`` over depths ``1 .. L_max - 1``,
``(1 - explore)`` on the best-scored depth among those with at least ``min_measured`` branch
nodes, ``explore`` spread uniformly (so every depth keeps being measured); uniform while no depth
is measured. A path that may still branch branches at a node of depth ``d`` with the hazard
``q(d) / sum_{d' >= d} q(d')`` (its first branch point is then at ``d ~ q``), the coin drawn from
the path's own random stream.

``"entropy+measured"``: the entropy rule, except at depths the window measured (at least
``min_measured`` nodes) with ``score(d) > 1``, where the model predicts that a branch loses to
independent trajectories.

Rule 1 (docs/unbiasedness.md) holds for both: the decision at ``h`` uses ``h``'s depth and branch
count, what earlier batches measured, and independent randomness, never the action sampled at
``h`` or anything after it.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bpo_algos.mechanism import (
    Mechanism,
    TreeMoments,
    pooled_variance,
    predict_variance_ratio,
    return_moments,
    sibling_units,
    tree_moments,
    unit_variance,
)
from bpo_algos.tree import RolloutTree

BRANCH_RULES = ("entropy", "measured", "entropy+measured")


@dataclass
class DepthStats:
    """What the window measured at one depth."""

    nodes: int
    eta: float | None
    steps_per_leaf: float | None
    score: float | None
    """Predicted ``Var(BPO) / Var(RLOO)`` at matched env steps for a branch here (lower: better)."""


def _tree_summary(tree: RolloutTree) -> dict[str, Any]:
    """One tree's contribution: its task, weighted return moments and length, and per inner
    branch node ``(depth, Var of its children's Q)``."""
    moments = tree_moments(tree) or TreeMoments(0.0, 0.0, 0.0, 0)  # the mechanism's own reading of the leaves
    spreads = return_moments(tree)
    nodes = [
        (node.depth, unit_variance(*sibling_units(node, spreads)))
        for node in tree.branch_nodes()
        if node is not tree.root and len(node.children) >= 2
    ]
    # the tree's own unbiased Var(R | task), from its backbones (docs/mechanism.md)
    own = unit_variance(*sibling_units(tree.root, spreads)) if len(tree.root.children) >= 2 else None
    surprise: dict[int, list[float]] = defaultdict(list)
    for edge in tree.edges():
        surprise[edge.parent.depth].append(-edge.action.logprob)
    return {
        "task": repr(tree.task_id),
        "m1": moments.m1,
        "m2": moments.m2,
        "length": moments.length,
        "max_length": moments.max_length,
        "nodes": nodes,
        "task_variance": own,
        "surprise": {d: (float(sum(v)), len(v)) for d, v in surprise.items()},
    }


class DepthMeasure:
    """``eta`` and fork cost by depth over the last ``window`` batches, and the branch plan
    (module docstring). ``record`` after a batch; ``plan`` and ``branch_probability`` read only
    what was recorded before."""

    def __init__(self, window: int = 8, min_measured: int = 4, explore: float = 0.25) -> None:
        self.window = window
        self.min_measured = min_measured
        self.explore = explore
        self._batches: deque[list[dict[str, Any]]] = deque(maxlen=window)
        self._q: dict[int, float] | None = None
        self._vetoed: set[int] = set()

    def record(self, trees: Sequence[RolloutTree], backbones: int, branch_factor: int) -> None:
        self._batches.append([_tree_summary(t) for t in trees])
        self._update(backbones, branch_factor)

    @property
    def ready(self) -> bool:
        """Whether a plan exists (some batch recorded)."""
        return self._q is not None

    def table(self, branch_factor: int, backbones: int = 2) -> dict[int, DepthStats]:
        """The window's :class:`DepthStats` by depth."""
        summaries = [s for batch in self._batches for s in batch]
        if not summaries:
            return {}
        by_task: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for s in summaries:
            by_task[s["task"]].append((s["m1"], s["m2"]))
        own: dict[str, list[float]] = defaultdict(list)
        for s in summaries:
            if s["task_variance"] is not None:
                own[s["task"]].append(s["task_variance"])
        task_var = {task: float(np.mean(own[task])) if own[task] else pooled_variance(moments) for task, moments in by_task.items()}
        length = float(np.mean([s["length"] for s in summaries]))
        totals: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for s in summaries:
            for depth, (total, count) in s["surprise"].items():
                totals[int(depth)][0] += total
                totals[int(depth)][1] += count
        entropy_by_depth = {d: t / c for d, (t, c) in sorted(totals.items()) if c}
        within: dict[int, list[float]] = defaultdict(list)
        between: dict[int, list[float]] = defaultdict(list)
        for s in summaries:
            for depth, var in s["nodes"]:
                within[depth].append(var)
                between[depth].append(task_var[s["task"]])
        out = {}
        k = branch_factor
        for depth in sorted(within):
            denominator = float(np.mean(between[depth]))
            eta = 1.0 - float(np.mean(within[depth])) / denominator if denominator > 0 else None
            per_leaf = (length + (k - 1) * max(length - depth, 0.0)) / k
            score = None
            if eta is not None and length > 0:
                m = Mechanism(
                    prefix_explained=eta, prefix_explained_ci95=None, branch_nodes=len(within[depth]),
                    branch_depths={depth: 1}, fork_steps_per_leaf=per_leaf, independent_steps_per_trajectory=length,
                    zero_variance_groups=None, distinct_siblings=None, tasks_per_update=0.0,
                    entropy_by_depth=entropy_by_depth,
                )
                score = predict_variance_ratio(m, backbones=backbones, branch_factor=k, group_size=4, horizon=max(int(round(length)), depth + 1))
            out[depth] = DepthStats(len(within[depth]), eta, per_leaf, score)
        return out

    def _update(self, backbones: int, branch_factor: int) -> None:
        summaries = [s for batch in self._batches for s in batch]
        horizon = max((s["max_length"] for s in summaries), default=0)
        depths = list(range(1, horizon))
        if not depths:
            self._q, self._vetoed = {}, set()
            return
        table = self.table(branch_factor, backbones)
        measured = {d: st for d, st in table.items() if st.nodes >= self.min_measured and st.score is not None}
        self._vetoed = {d for d, st in measured.items() if st.score > 1.0}
        uniform = 1.0 / len(depths)
        if not measured:
            self._q = {d: uniform for d in depths}
            return
        best = min(measured, key=lambda d: (measured[d].score, d))
        self._q = {d: self.explore * uniform + (1.0 - self.explore) * (d == best) for d in depths}

    def plan(self) -> dict[int, float]:
        """``q``: the distribution of the first branch depth (empty before any batch)."""
        return dict(self._q or {})

    def branch_probability(self, depth: int) -> float:
        """The hazard ``q(d) / sum_{d' >= d} q(d')`` (0 where ``q`` puts no mass)."""
        q = self._q or {}
        tail = sum(v for d, v in q.items() if d >= depth)
        return min(q.get(depth, 0.0) / tail, 1.0) if tail > 0 else 0.0

    def vetoed(self, depth: int) -> bool:
        """Whether the window predicts that a branch at ``depth`` loses (``"entropy+measured"``)."""
        return depth in self._vetoed

    def state_dict(self) -> dict[str, Any]:
        return {"batches": [list(b) for b in self._batches], "q": self._q, "vetoed": sorted(self._vetoed)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._batches = deque((list(b) for b in state.get("batches", [])), maxlen=self.window)
        q = state.get("q")
        self._q = {int(d): float(v) for d, v in q.items()} if q is not None else None
        self._vetoed = {int(d) for d in state.get("vetoed", [])}

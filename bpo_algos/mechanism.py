"""Why branching helps or not: the mechanism measured from rollout trees (docs/mechanism.md).

:func:`measure` reads the batches one algorithm collected at one policy and returns a
:class:`Mechanism`:

* ``prefix_explained`` ``eta = 1 - E_b Var(R | h_b) / E_b Var(R | task_b)`` over the *inner*
  branch nodes ``b`` (BPO's branch points; the root is the task itself and explains nothing).
  ``Var(R | h_b)`` is the unbiased variance of the values ``Q`` of ``b``'s children (the return
  from ``b`` on: the reward before ``b`` is common to them); ``Var(R | task)`` is the variance of
  the episode return over all the task's trees in the batches, rule-3 weighted (each tree an
  unbiased sample of the policy's return distribution), pooled over the batches so that a batch
  with few leaves per task is not noise-dominated. Interval: percentile bootstrap over branch
  nodes (``n_boot`` draws, seeded). None with fewer than 2 branch nodes.
* ``branch_depths``: ``{depth: count}`` of those branch nodes (depth = steps from the root).
* ``fork_steps_per_leaf``: env steps spent per finished episode (``env_steps / leaves`` of the
  batches' meters); ``independent_steps_per_trajectory``: the policy's mean episode length
  (rule-3 weighted over leaves: what one independent trajectory costs). Their ratio is the fork
  cost ratio (1 for RLOO/GRPO; below 1 where forks start late).
* ``zero_variance_groups``: fraction of sibling groups (every branch node, root included) whose
  children's values are all equal: groups with no learning signal.
* ``distinct_siblings``: mean number of distinct actions among an inner branch node's children.
* ``tasks_per_update``: mean number of distinct tasks per batch.
* ``entropy_by_depth``: mean decision entropy by depth, where the engine computed one.
* ``branching_share``: share of backbones (the root's children) that branch at least once below;
  ``steps_per_backbone``: env steps per backbone, its forks included.

:func:`exact_prefix_explained` gives the exact ``eta`` of a TreeMDP and tabular policy at given
branch depths (by enumeration), the ground truth for :func:`measure`. :func:`predict_variance_ratio`
is the model of BPO's matched-compute gradient-variance ratio against RLOO (docs/mechanism.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

from bpo_algos.algorithm import Batch
from bpo_algos.tree import Node, RolloutTree
from bpo_envs.tree_mdp import TreeMDPEnv

_EQUAL = 1e-9


@dataclass
class Mechanism:
    """The mechanism quantities of one algorithm's batches at one policy (module docstring)."""

    prefix_explained: float | None
    prefix_explained_ci95: tuple[float, float] | None
    branch_nodes: int
    branch_depths: dict[int, int]
    fork_steps_per_leaf: float | None
    independent_steps_per_trajectory: float | None
    zero_variance_groups: float | None
    distinct_siblings: float | None
    tasks_per_update: float
    entropy_by_depth: dict[int, float] = field(default_factory=dict)
    branching_share: float | None = None
    """Share of backbones (the root's children) with at least one branch point below them."""
    steps_per_backbone: float | None = None
    """Env steps per backbone: the backbone and every sibling forked from it."""

    @property
    def fork_cost_ratio(self) -> float | None:
        """``fork_steps_per_leaf / independent_steps_per_trajectory`` (1: a leaf costs a whole
        episode, as for RLOO)."""
        if not self.fork_steps_per_leaf or not self.independent_steps_per_trajectory:
            return None
        return self.fork_steps_per_leaf / self.independent_steps_per_trajectory

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict under the names of docs/mechanism.md (depth keys as strings)."""
        return {
            "prefix_explained": self.prefix_explained,
            "prefix_explained_ci95": list(self.prefix_explained_ci95) if self.prefix_explained_ci95 else None,
            "branch_nodes": self.branch_nodes,
            "branch_depths": {str(d): n for d, n in sorted(self.branch_depths.items())},
            "fork_steps_per_leaf": self.fork_steps_per_leaf,
            "independent_steps_per_trajectory": self.independent_steps_per_trajectory,
            "fork_cost_ratio": self.fork_cost_ratio,
            "zero_variance_groups": self.zero_variance_groups,
            "distinct_siblings": self.distinct_siblings,
            "tasks_per_update": self.tasks_per_update,
            "entropy_by_depth": {str(d): h for d, h in sorted(self.entropy_by_depth.items())},
            "branching_share": self.branching_share,
            "steps_per_backbone": self.steps_per_backbone,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Mechanism:
        """The :class:`Mechanism` that :meth:`to_json` wrote."""
        ci = data.get("prefix_explained_ci95")
        return cls(
            prefix_explained=data["prefix_explained"],
            prefix_explained_ci95=tuple(ci) if ci else None,
            branch_nodes=int(data["branch_nodes"]),
            branch_depths={int(d): int(n) for d, n in data["branch_depths"].items()},
            fork_steps_per_leaf=data["fork_steps_per_leaf"],
            independent_steps_per_trajectory=data["independent_steps_per_trajectory"],
            zero_variance_groups=data["zero_variance_groups"],
            distinct_siblings=data["distinct_siblings"],
            tasks_per_update=float(data["tasks_per_update"]),
            entropy_by_depth={int(d): float(h) for d, h in data.get("entropy_by_depth", {}).items()},
            branching_share=data.get("branching_share"),
            steps_per_backbone=data.get("steps_per_backbone"),
        )


def _task_key(task_id: Any) -> Any:
    return task_id if isinstance(task_id, int | str | float | type(None)) else repr(task_id)


def leaf_returns(tree: RolloutTree) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each leaf's episode return, rule-3 weight and length (steps from the root)."""
    returns, weights, lengths = [], [], []
    stack: list[tuple[Node, float]] = [(tree.root, 0.0)]
    while stack:
        node, collected = stack.pop()
        for edge in node.children:
            total = collected + edge.reward
            if edge.terminated or edge.truncated or not edge.child.children:
                returns.append(total)
                weights.append(edge.weight)
                lengths.append(edge.child.depth)
            else:
                stack.append((edge.child, total))
    return np.asarray(returns, float), np.asarray(weights, float), np.asarray(lengths, float)


class TreeMoments(NamedTuple):
    """A tree's rule-3-weighted leaf moments (weights normalised to sum 1, so each is unbiased
    for the policy's): mean return ``M1``, mean squared return ``M2``, mean episode length, and
    the longest episode."""

    m1: float
    m2: float
    length: float
    max_length: int


def tree_moments(tree: RolloutTree) -> TreeMoments | None:
    """The tree's :class:`TreeMoments` from :func:`leaf_returns`, or ``None`` without leaves."""
    returns, weights, lengths = leaf_returns(tree)
    if not len(returns):
        return None
    total = weights.sum()
    w = weights / total if total > 0 else np.full(len(returns), 1.0 / len(returns))
    return TreeMoments(float(w @ returns), float(w @ returns**2), float(w @ lengths), int(lengths.max()))


def pooled_variance(moments: Sequence[tuple[float, float]]) -> float | None:
    """Return variance from trees' weighted first and second moments (each unbiased for the
    policy's): ``mean(M2) - mean(M1)^2``, corrected by ``Var(mean M1)`` so it is unbiased."""
    if not moments:
        return None
    m1 = np.array([m[0] for m in moments])
    m2 = np.array([m[1] for m in moments])
    var = float(m2.mean() - m1.mean() ** 2)
    if len(m1) >= 2:
        var += float(m1.var(ddof=1) / len(m1))
    return max(var, 0.0)


def measure(batches: Sequence[Batch], *, seed: int = 0, n_boot: int = 1000) -> Mechanism:
    """The :class:`Mechanism` of ``batches`` (one algorithm, one policy; module docstring)."""
    task_moments: dict[Any, list[tuple[float, float]]] = defaultdict(list)
    nodes: list[tuple[Any, float]] = []  # (task, Var(R | h_b)) per inner branch node
    depths: dict[int, int] = defaultdict(int)
    groups = zero_groups = 0
    distinct: list[int] = []
    entropies: dict[int, list[float]] = defaultdict(list)
    lengths: list[float] = []
    steps = leaves = 0.0
    backbones = branched = 0
    tasks_per_batch: list[int] = []
    for batch in batches:
        tasks_per_batch.append(len({_task_key(t.task_id) for t in batch.trees}))
        steps += batch.compute.env_steps
        leaves += batch.compute.leaves
        for tree in batch.trees:
            task = _task_key(tree.task_id)
            moments = tree_moments(tree)
            if moments is not None:
                task_moments[task].append((moments.m1, moments.m2))
                lengths.append(moments.length)
            for edge in tree.root.children:
                backbones += 1
                branched += _branches_below(edge.child)
            for node in tree.nodes():
                if node.entropy is not None:
                    entropies[node.depth].append(float(node.entropy))
                if len(node.children) < 2:
                    continue
                q = np.array([e.q for e in node.children])
                groups += 1
                zero_groups += bool(np.ptp(q) <= _EQUAL)
                if node is tree.root:
                    continue
                nodes.append((task, float(q.var(ddof=1))))
                depths[node.depth] += 1
                distinct.append(len({e.action.text for e in node.children}))
    task_var = {task: pooled_variance(m) for task, m in task_moments.items()}
    eta = ci = None
    usable = [(v, task_var[t]) for t, v in nodes if task_var.get(t) is not None]
    if len(usable) >= 2:
        within = np.array([u[0] for u in usable])
        between = np.array([u[1] for u in usable])
        eta = _eta(within, between)
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0x6D656368]))
        draws = rng.integers(len(usable), size=(n_boot, len(usable)))
        boot = [_eta(within[d], between[d]) for d in draws]
        boot = [b for b in boot if b is not None]
        if boot:
            ci = (float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5)))
    return Mechanism(
        prefix_explained=eta,
        prefix_explained_ci95=ci,
        branch_nodes=len(nodes),
        branch_depths=dict(sorted(depths.items())),
        fork_steps_per_leaf=steps / leaves if leaves else None,
        independent_steps_per_trajectory=float(np.mean(lengths)) if lengths else None,
        zero_variance_groups=zero_groups / groups if groups else None,
        distinct_siblings=float(np.mean(distinct)) if distinct else None,
        tasks_per_update=float(np.mean(tasks_per_batch)) if tasks_per_batch else 0.0,
        entropy_by_depth={d: float(np.mean(v)) for d, v in sorted(entropies.items())},
        branching_share=branched / backbones if backbones else None,
        steps_per_backbone=steps / backbones if backbones else None,
    )


def _branches_below(node: Node) -> bool:
    stack = [node]
    while stack:
        n = stack.pop()
        if len(n.children) >= 2:
            return True
        stack.extend(e.child for e in n.children)
    return False


def _eta(within: np.ndarray, between: np.ndarray) -> float | None:
    denominator = float(between.mean())
    return None if denominator <= 0 else 1.0 - float(within.mean()) / denominator


# ---- exact, on a TreeMDP -------------------------------------------------------------------
def exact_prefix_explained(
    env: TreeMDPEnv, policy: Any, depths: Sequence[int], tasks: Sequence[int] | None = None
) -> float:
    """Exact ``eta`` when every backbone branches once at each of ``depths``.

    ``1 - mean_{task, d} E_{h_d ~ pi}[Var(R | h_d)] / mean_task Var(R | task)``
    (:meth:`~bpo_envs.tree_mdp.TreeMDPEnv.variance_by_depth`): the histories at depth ``d``
    drawn from the policy (a backbone is an on-policy path), the same for every depth and task,
    as :func:`measure` averages over branch nodes.
    """
    if not depths:
        raise ValueError("depths must name at least one branch depth")
    within, between = [], []
    with torch.no_grad():
        for task in range(env.n_tasks) if tasks is None else tasks:
            v = env.variance_by_depth(policy.log_probs, task)
            between.append(v[0])
            within.extend(v[d] for d in depths)
    return 1.0 - float(np.mean(within)) / float(np.mean(between))


# ---- the model of the gain -----------------------------------------------------------------
def score_shares(m: Mechanism, horizon: int | None = None) -> tuple[float, float]:
    """``(f_pre, f_post)``: the shares of the gradient's score mass before and at-or-after the
    branch depths, from ``entropy_by_depth`` (a depth without a recorded entropy counts at the
    mean of the recorded ones), averaged over the branch-depth histogram."""
    recorded = m.entropy_by_depth
    last = max([*recorded, *m.branch_depths, 0]) + 1 if horizon is None else horizon
    fill = float(np.mean(list(recorded.values()))) if recorded else 1.0
    mass = np.array([max(recorded.get(d, fill), 0.0) for d in range(last)])
    if mass.sum() <= 0:
        mass = np.ones(last)
    total = sum(m.branch_depths.values())
    if not total:
        return 1.0, 0.0
    post = sum(n * mass[d:].sum() / mass.sum() for d, n in m.branch_depths.items()) / total
    return 1.0 - post, post


def predict_variance_ratio(
    m: Mechanism,
    *,
    backbones: int,
    branch_factor: int,
    group_size: int,
    independent_steps: float | None = None,
    horizon: int | None = None,
    task_share: float = 0.0,
    independent_tasks_per_update: float | None = None,
) -> float | None:
    """Predicted ``Var(g_BPO) / Var(g_RLOO)`` at matched env steps (docs/mechanism.md).

    Per backbone (one of the root's ``K0`` children), in units of the task's return variance
    and of the gradient's score mass, with ``eta`` at the branch points, ``f_pre, f_post`` the
    score-mass shares before and at-or-after the branch depth (:func:`score_shares`), ``phi``
    the share of backbones that branch and ``s`` the env steps per backbone::

        branched   = (eta + (1 - eta)/K) K0/(K0-1) f_pre + (1 - eta)/(K-1) f_post
        unbranched = K0/(K0-1)
        ratio      = (s / L) [phi branched + (1 - phi) unbranched] / (N/(N-1))

    against RLOO's ``N/(N-1)`` per trajectory of ``L`` steps (default
    ``m.independent_steps_per_trajectory``). A backbone's shared prefix carries the mean of its
    ``K`` correlated leaves (variance ``eta + (1 - eta)/K``); its siblings keep only the residual
    ``1 - eta``; a backbone that never branches is an RLOO-``K0`` trajectory. ``task_share``:
    the share of RLOO's gradient variance that comes from which tasks the batch holds; it scales
    with ``T_RLOO / T_BPO`` (tasks per update): ``(1 - task_share) ratio + task_share T_RLOO/T_BPO``.
    None when ``eta`` or the costs are unknown.
    """
    if not m.fork_steps_per_leaf:
        return None
    length = independent_steps or m.independent_steps_per_trajectory
    if not length:
        return None
    k0, k, n = backbones, branch_factor, group_size
    phi = 1.0 if m.branching_share is None else m.branching_share
    if m.prefix_explained is None and phi > 0:
        return None
    eta = float(np.clip(m.prefix_explained or 0.0, -1.0, 1.0))
    f_pre, f_post = score_shares(m, horizon)
    per_backbone = m.steps_per_backbone or k * m.fork_steps_per_leaf
    branched = (eta + (1 - eta) / k) * k0 / (k0 - 1) * f_pre + (1 - eta) / (k - 1) * f_post
    within = per_backbone / length * (phi * branched + (1 - phi) * k0 / (k0 - 1)) / (n / (n - 1))
    if task_share and independent_tasks_per_update and m.tasks_per_update:
        coverage = independent_tasks_per_update / m.tasks_per_update
        return (1 - task_share) * within + task_share * coverage
    return within


def mechanism_table(rows: Mapping[str, Mechanism]) -> str:
    """A markdown table of several algorithms' mechanisms (one row each)."""
    lines = [
        "| algorithm | eta [95% CI] | branch nodes | depths | steps/leaf | steps/trajectory | zero-var groups | distinct siblings | tasks/update |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]

    def f(x: float | None, spec: str = ".2f") -> str:
        return "-" if x is None else format(x, spec)

    for name, m in rows.items():
        ci = m.prefix_explained_ci95
        eta = f(m.prefix_explained) + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")
        depths = ", ".join(f"{d}:{n}" for d, n in m.branch_depths.items()) or "-"
        lines.append(
            f"| {name} | {eta} | {m.branch_nodes} | {depths} | {f(m.fork_steps_per_leaf)} "
            f"| {f(m.independent_steps_per_trajectory)} | {f(m.zero_variance_groups)} "
            f"| {f(m.distinct_siblings)} | {m.tasks_per_update:.1f} |"
        )
    return "\n".join(lines)

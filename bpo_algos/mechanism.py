"""Why branching helps or not: the mechanism measured from rollout trees (docs/mechanism.md).

:func:`measure` reads the batches one algorithm collected at one policy and returns a
:class:`Mechanism`:

* ``prefix_explained`` ``eta = 1 - E_b Var(R | h_b) / E_b Var(R | task_b)`` over the *inner*
  branch nodes ``b`` (BPO's branch points; the root is the task itself and explains nothing),
  unbiased at any number of trees per task and any nesting (docs/mechanism.md, "How η is
  estimated"). Each variance is :func:`unit_variance` of i.i.d. units given a state (a branch
  node's out-edges; a tree's backbones for the task), the nested random-effects ANOVA::

      V(h) = sum_k (q_k - mean q)^2 / (K - 1) + mean_k W_k

  with ``q_k`` a unit's rule-3 value and ``W_k`` the plug-in spread of its leaves' returns about
  it (:func:`return_moments`). Per tree ``j`` of task ``t``: ``V_j`` the sum of ``V`` over its
  inner branch nodes, ``n_j`` their number, ``S_j`` the ``V`` of its backbones; then
  ``eta^ = 1 - sum_t V_t / sum_t n_t mean_{j in t} S_j`` (:func:`prefix_explained_of`), reported
  with the jackknife bias correction over trees ``n eta^ - (n - 1) mean_j eta^_(-j)``. Interval:
  a bootstrap over trees within tasks (tasks with one tree pooled into one stratum), Rao-Wu
  rescaled, percentiles shifted by the same correction (:func:`prefix_explained_interval`;
  ``n_boot`` draws, seeded). None with fewer than 2 branch nodes.
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
    policy's): ``mean(M2) - mean(M1)^2``, corrected by ``Var(mean M1)``: unbiased (before the
    clip at 0) with two or more trees; one tree misses ``Var(M1)``, so ``eta`` uses each tree's
    own :func:`unit_variance` of its backbones instead."""
    if not moments:
        return None
    m1 = np.array([m[0] for m in moments])
    m2 = np.array([m[1] for m in moments])
    var = float(m2.mean() - m1.mean() ** 2)
    if len(m1) >= 2:
        var += float(m1.var(ddof=1) / len(m1))
    return max(var, 0.0)


def return_moments(tree: RolloutTree) -> dict[int, tuple[float, float]]:
    """Every node's ``(m, W)`` (keyed by ``id(node)``): the rule-3-weighted mean ``m`` and
    plug-in variance ``W`` of the return collected from the node on, over the leaves below it.

    With ``q_c = r_c + m(child_c)`` (rule 3's value ``Q`` of out-edge ``c``) over a node's ``K``
    out-edges, ``m = mean_c q_c`` and ``W = mean_c W(child_c) + mean_c (q_c - m)^2`` (the law of
    total variance for a mixture of equal weights); a leaf has ``(0, 0)``. Computed from the
    rewards (iteratively, so deep episodes need no recursion), not from stored ``Q``.
    """
    out: dict[int, tuple[float, float]] = {}
    stack: list[tuple[Node, bool]] = [(tree.root, False)]
    while stack:
        node, expanded = stack.pop()
        if not expanded:
            stack.append((node, True))
            stack.extend((e.child, False) for e in node.children)
            continue
        k = len(node.children)
        if not k:
            out[id(node)] = (0.0, 0.0)
            continue
        below = [out[id(e.child)] for e in node.children]
        q = [e.reward + m for e, (m, _) in zip(node.children, below, strict=True)]
        mean = sum(q) / k
        out[id(node)] = (mean, (sum(w for _, w in below) + sum((x - mean) ** 2 for x in q)) / k)
    return out


def unit_variance(q: Sequence[float], spread: Sequence[float]) -> float:
    """Unbiased ``Var(R | h)`` from ``K >= 2`` i.i.d. units drawn at ``h`` (a branch node's
    out-edges, or a task's backbones): ``q_k`` each unit's value (unbiased for ``E[R | h]``),
    ``W_k`` the plug-in variance of the returns inside it (:func:`return_moments`)::

        Var(R | h) ~ s^2(q) + mean_k W_k,     s^2(q) = sum_k (q_k - mean q)^2 / (K - 1)

    the nested random-effects ANOVA: ``E[W_k] = Var(R | h) - Var(q_k)`` (a unit's leaves are
    spread about its own mean) and ``E[s^2(q)] = mean_k Var(q_k)`` (units independent with a
    common mean, whatever each one's shape), so the sum is unbiased. A unit that is one path
    has ``W = 0``: flat siblings give ``s^2(Q)``. Not clipped at 0 (clipping biases it)."""
    k = len(q)
    if k < 2:
        raise ValueError("an unbiased variance needs at least two units")
    mean = sum(q) / k
    return float(sum((x - mean) ** 2 for x in q) / (k - 1) + sum(spread) / k)


class EtaTerms(NamedTuple):
    """What each tree adds to ``eta``, one entry per tree: its task's index, the sum of
    :func:`unit_variance` over its inner branch nodes, their number, and its own estimate of
    ``Var(R | task)`` (:func:`unit_variance` over its backbones, the root's out-edges; NaN with
    fewer than two). Each is one tree's own, so a resample of trees is a vector of weights and
    no variance is ever computed from a tree and its copy. For a task whose trees have one
    backbone each (no tree can give its own), the sums of its backbones' ``q - c``,
    ``(q - c)^2`` and ``W`` (``c`` a per-task constant) pool them across the task's trees."""

    task: np.ndarray
    node_variance: np.ndarray
    nodes: np.ndarray
    task_variance: np.ndarray
    backbones: np.ndarray
    q_sum: np.ndarray
    q_square_sum: np.ndarray
    spread_sum: np.ndarray


def sibling_units(node: Node, moments: Mapping[int, tuple[float, float]]) -> tuple[list[float], list[float]]:
    """``(q, W)`` of each of ``node``'s out-edges (the units of :func:`unit_variance`): value
    from ``node`` on and the spread of the returns inside it, from :func:`return_moments`."""
    below = [moments[id(e.child)] for e in node.children]
    return [e.reward + m for e, (m, _) in zip(node.children, below, strict=True)], [w for _, w in below]


def eta_terms(trees: Sequence[RolloutTree]) -> EtaTerms:
    """The :class:`EtaTerms` of ``trees`` (tasks told apart by their ``task_id``)."""
    index: dict[Any, int] = {}
    centre: dict[int, float] = {}
    rows = []
    for tree in trees:
        moments = return_moments(tree)
        total, count = 0.0, 0
        for node in tree.nodes():
            if node is not tree.root and len(node.children) >= 2:
                total += unit_variance(*sibling_units(node, moments))
                count += 1
        q, spread = sibling_units(tree.root, moments)
        own = unit_variance(q, spread) if len(q) >= 2 else float("nan")
        task = index.setdefault(_task_key(tree.task_id), len(index))
        c = centre.setdefault(task, q[0] if q else 0.0)
        rows.append((task, total, count, own, len(q), sum(x - c for x in q), sum((x - c) ** 2 for x in q), sum(spread)))
    columns = np.array(rows, float).reshape(len(rows), 8).T
    return EtaTerms(columns[0].astype(int), *columns[1:])


def prefix_explained_of(terms: EtaTerms, weights: np.ndarray) -> np.ndarray:
    """The plain (not bias-corrected) ``eta`` for each row of ``weights`` (each tree's weight,
    shape ``(R, trees)``; ones for the sample itself), NaN where undefined::

        eta = 1 - sum_t V_t / sum_t n_t S_t

    over the tasks ``t`` with two or more backbones: ``V_t`` the weighted sum of the node
    variances of the task's trees, ``n_t`` the weighted number of their inner branch nodes,
    ``S_t`` the weighted mean of the trees' own ``Var(R | task)`` (or, where no tree of the task
    has two backbones, :func:`unit_variance` of its backbones pooled across its trees)."""
    n_tasks = int(terms.task.max()) + 1 if len(terms.task) else 0
    onehot = np.zeros((len(terms.task), n_tasks))
    onehot[np.arange(len(terms.task)), terms.task] = 1.0
    has_variance = np.isfinite(terms.task_variance)
    own = np.where(has_variance, terms.task_variance, 0.0)
    nodes, node_variance = (weights * terms.nodes) @ onehot, (weights * terms.node_variance) @ onehot
    mass = (weights * has_variance) @ onehot
    units, q, qq, spread = (
        (weights * x) @ onehot for x in (terms.backbones, terms.q_sum, terms.q_square_sum, terms.spread_sum)
    )
    pooled_ok = units >= 2
    valid = ((mass > 0) | pooled_ok) & (nodes > 0)
    safe = np.where(pooled_ok, units, 2.0)
    pooled = (qq - q**2 / safe) / (safe - 1) + spread / safe
    task_variance = np.where(mass > 0, ((weights * own) @ onehot) / np.where(mass > 0, mass, 1.0), pooled)
    numerator = np.where(valid, node_variance, 0.0).sum(axis=1)
    denominator = np.where(valid, nodes * task_variance, 0.0).sum(axis=1)
    counted = np.where(valid, nodes, 0.0).sum(axis=1)
    ok = (counted >= 2) & (denominator > 0)
    return np.where(ok, 1.0 - numerator / np.where(ok, denominator, 1.0), np.nan)


def bootstrap_strata(task: np.ndarray) -> list[np.ndarray]:
    """The strata of the interval's bootstrap (trees by index): the trees of each task that has
    two or more (resampled within their task), and one stratum of all the tasks with one tree
    each (there the tree is the task, and the tasks are resampled)."""
    members = [np.flatnonzero(task == t) for t in np.unique(task)]
    single = [m for m in members if len(m) == 1]
    return [m for m in members if len(m) >= 2] + ([np.concatenate(single)] if single else [])


def bootstrap_weights(strata: Sequence[np.ndarray], n: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Rescaled stratified bootstrap weights (Rao and Wu): in a stratum of ``m >= 2`` trees,
    ``m - 1`` draws with replacement, each drawn tree weighted ``m / (m - 1)`` per draw, so a
    linear statistic's bootstrap variance is its unbiased variance even for ``m = 2`` (the
    plain bootstrap's is ``(m - 1) / m`` of it); a stratum of one tree keeps weight 1."""
    weights = np.zeros((n_boot, n))
    for stratum in strata:
        m = len(stratum)
        if m == 1:
            weights[:, stratum] = 1.0
            continue
        draws = stratum[rng.integers(m, size=(n_boot, m - 1))]
        np.add.at(weights, (np.arange(n_boot)[:, None], draws), m / (m - 1))
    return weights


def prefix_explained_interval(terms: EtaTerms, *, seed: int = 0, n_boot: int = 1000) -> tuple[float | None, tuple[float, float] | None]:
    """``eta`` (jackknife bias-corrected) and its 95% interval (module docstring)."""
    n = len(terms.task)
    if not n:
        return None, None
    plain = float(prefix_explained_of(terms, np.ones((1, n)))[0])
    if not np.isfinite(plain):
        return None, None
    shift = 0.0
    if n >= 2:
        leave_one_out = prefix_explained_of(terms, 1.0 - np.eye(n))
        if np.isfinite(leave_one_out).all():
            shift = (n - 1) * (plain - float(leave_one_out.mean()))
    eta = plain + shift
    if n_boot <= 0 or n < 2:  # a resample of one tree is that tree: a zero-width "interval"
        return eta, None
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x6D656368]))
    boot = prefix_explained_of(terms, bootstrap_weights(bootstrap_strata(terms.task), n, n_boot, rng))
    boot = boot[np.isfinite(boot)]
    if not len(boot):
        return eta, None
    return eta, (float(np.percentile(boot, 2.5)) + shift, float(np.percentile(boot, 97.5)) + shift)


def measure(batches: Sequence[Batch], *, seed: int = 0, n_boot: int = 1000) -> Mechanism:
    """The :class:`Mechanism` of ``batches`` (one algorithm, one policy; module docstring)."""
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
            moments = tree_moments(tree)
            if moments is not None:
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
                zero_groups += bool(q.max() - q.min() <= _EQUAL)
                if node is tree.root:
                    continue
                depths[node.depth] += 1
                distinct.append(len({e.action.text for e in node.children}))
    eta, ci = prefix_explained_interval(eta_terms([t for b in batches for t in b.trees]), seed=seed, n_boot=n_boot)
    return Mechanism(
        prefix_explained=eta,
        prefix_explained_ci95=ci,
        branch_nodes=sum(depths.values()),
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
            v = env.variance_by_depth(policy.log_probs, task, siblings=True)
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
        eta = f(m.prefix_explained)
        if m.prefix_explained is not None:
            eta += f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else " (no interval: fewer than 2 trees or no resamples)"
        depths = ", ".join(f"{d}:{n}" for d, n in m.branch_depths.items()) or "-"
        lines.append(
            f"| {name} | {eta} | {m.branch_nodes} | {depths} | {f(m.fork_steps_per_leaf)} "
            f"| {f(m.independent_steps_per_trajectory)} | {f(m.zero_variance_groups)} "
            f"| {f(m.distinct_siblings)} | {m.tasks_per_update:.1f} |"
        )
    return "\n".join(lines)

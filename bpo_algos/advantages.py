"""Advantage estimators: small named functions with one signature (verl's ``core_algos`` is the model).

Every estimator is registered under a name with :func:`register_advantage` and has the shape::

    estimator(trees: Sequence[RolloutTree], **options) -> None

It receives the finalized trees of one batch (weights and values ``Q`` from
:meth:`RolloutTree.finalize`; a single tree is accepted as a batch of one) and writes
``edge.advantage`` for every edge of every tree. The options are keyword-only and specific to
the estimator. Two kinds of context travel in them rather than in the shape:

* *state from earlier batches* (``history=`` of the anchored estimator): an object the estimator
  only reads. The algorithm updates it after the batch's advantages are written
  (``Algorithm.end_batch``), so within a batch it is frozen and independent of the batch's
  actions (docs/unbiasedness.md, rule 6);
* *batch structure* (``groups=`` of Tree-GRPO: which trees form one prompt's forest).

An estimator whose samples are not rule 3's branch-node subtrees may also rewrite ``edge.weight``
(Tree-GRPO: every kept leaf's path is one sample); the others leave the weights alone.

Algorithms call :func:`estimate_advantages` with their estimator's name and options; a user's
algorithm can register its own estimator the same way. The numeric helpers
:func:`grpo_advantages` and :func:`rloo_advantages` (one group of returns in, advantages out) are
what the group estimators apply.

Built-in estimators: ``grpo`` and ``rloo`` (docs/unbiasedness.md, rule 5), ``bpo`` (rule 4),
``anchored`` (rule 6), ``gigpo`` (verl-agent's GiGPO) and ``tree-grpo`` (Tree-GRPO's intra- plus
inter-tree advantage); :class:`BaselineChoice` turns the ``baseline=`` option of BPO and RLOO
into one of them. Estimators of other packages are found through the entry-point group
``bpo_algos.advantages`` (:mod:`bpo_algos.registry`).
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

import numpy as np

from bpo_algos.plugins import ADVANTAGE_GROUP, add_named, load_entry_points
from bpo_algos.tree import Edge, Node, RolloutTree
from bpo_envs.validation import check_count

GRPO_SCALES = ("group", "none")

Estimator = Callable[..., None]
AnchorKey = Callable[[RolloutTree, Node], Hashable]
"""``key(tree, node) -> hashable``: the anchor of the decision at ``node`` (a function of the
history only: it is given the decision node, never the action taken there)."""

_ESTIMATORS: dict[str, Estimator] = {}


# ---- registry ------------------------------------------------------------------------------
def register_advantage(name: str, *, overwrite: bool = False) -> Callable[[Estimator], Estimator]:
    """Decorator: register ``fn(trees, **options) -> None`` as the estimator ``name``."""
    add_named({}, "estimator", name, len)  # check the name now, at the decorator

    def decorate(fn: Estimator) -> Estimator:
        add_named(_ESTIMATORS, "estimator", name, fn, overwrite=overwrite)
        return fn

    return decorate


def registered_advantages() -> list[str]:
    """The registered estimator names: the built-ins, then those of the entry-point group
    ``bpo_algos.advantages`` (a pip-installed package's), then any registered at run time."""
    load_entry_points(ADVANTAGE_GROUP, _ESTIMATORS, "estimator")
    return list(_ESTIMATORS)


def get_advantage(name: str) -> Estimator:
    """The estimator registered as ``name``."""
    load_entry_points(ADVANTAGE_GROUP, _ESTIMATORS, "estimator")
    if name not in _ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; registered: {', '.join(_ESTIMATORS)}")
    return _ESTIMATORS[name]


def estimate_advantages(name: str, trees: RolloutTree | Sequence[RolloutTree], **options: Any) -> None:
    """Run the estimator ``name`` on ``trees`` (writes ``edge.advantage``)."""
    get_advantage(name)(as_batch(trees), **options)


def as_batch(trees: RolloutTree | Sequence[RolloutTree]) -> list[RolloutTree]:
    """``trees`` as a list (a single tree is a batch of one)."""
    if isinstance(trees, RolloutTree):
        return [trees]
    out = list(trees)
    bad = [type(t).__name__ for t in out if not isinstance(t, RolloutTree)]
    if bad:
        raise TypeError(f"an estimator takes RolloutTrees, got {', '.join(sorted(set(bad)))}")
    return out


# ---- numeric helpers ------------------------------------------------------------------------
def _check_scale(scale: str) -> None:
    if scale not in GRPO_SCALES:
        raise ValueError(f"scale must be one of {GRPO_SCALES}, got {scale!r}")


def grpo_advantages(returns: Sequence[float], scale: str = "group", eps: float = 1e-6) -> np.ndarray:
    """GRPO: ``A_i = (R_i - mean(R)) / (std(R) + eps)``; ``scale="none"`` drops the std (Dr. GRPO).

    ``std`` is the sample standard deviation (``ddof=1``), as in TRL and verl; a group of one
    has advantage 0.
    """
    _check_scale(scale)
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


def _verl_group_norm(values: np.ndarray, scale: str, eps: float) -> np.ndarray:
    """verl's outcome normalisation of one group: a group of one has mean 0 and std 1 (so it
    keeps its own value); otherwise ``(x - mean) / (std + eps)`` (sample std) or ``x - mean``."""
    if values.size == 1:
        return values / (1.0 + eps) if scale == "group" else values.copy()
    centred = values - values.mean()
    return centred / (values.std(ddof=1) + eps) if scale == "group" else centred


# ---- tree helpers -----------------------------------------------------------------------------
def _subtree(edge: Edge) -> Iterable[Edge]:
    stack = [edge]
    while stack:
        e = stack.pop()
        yield e
        stack.extend(e.child.children)


def _broadcast_root_group(tree: RolloutTree, advantages: np.ndarray) -> None:
    for advantage, first in zip(advantages, tree.root.children, strict=True):
        for edge in _subtree(first):
            edge.advantage = float(advantage)


def observation_key(tree: RolloutTree, node: Node) -> str:
    """The default anchor key: a stable hash of the task and the observation the policy sees at
    ``node`` (stable across processes, so a pooled history survives a checkpoint)."""
    text = f"{tree.task_id!r}\x00{node.observation}"
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


# ---- group estimators (rule 5) -----------------------------------------------------------------
@register_advantage("grpo")
def grpo_estimator(trees: Sequence[RolloutTree], *, scale: str = "group", eps: float = 1e-6) -> None:
    """GRPO over each tree's root group, copied to every step of each trajectory.

    ``R_i`` is the return of the i-th trajectory (``Q`` of the i-th root edge).
    """
    _check_scale(scale)
    for tree in as_batch(trees):
        _broadcast_root_group(tree, grpo_advantages([e.q for e in tree.root.children], scale=scale, eps=eps))


@register_advantage("rloo")
def rloo_estimator(trees: Sequence[RolloutTree]) -> None:
    """RLOO over each tree's root group, copied to every step of each trajectory."""
    for tree in as_batch(trees):
        _broadcast_root_group(tree, rloo_advantages([e.q for e in tree.root.children]))


# ---- BPO (rule 4) ----------------------------------------------------------------------------
@register_advantage("bpo")
def bpo_advantages(trees: Sequence[RolloutTree]) -> None:
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

    for tree in as_batch(trees):
        root = tree.root
        if not root.is_branch:
            raise ValueError("BPO needs a root with at least two backbones (K0 >= 2)")
        visit(root, 0.0, 0.0)


# ---- anchored baselines (rule 6) -----------------------------------------------------------------
class AnchorHistory:
    """Same-key values ``Q`` of the previous ``window`` batches, for ``"anchored+history"``.

    :meth:`pooled` reads the batches recorded so far; :meth:`record` adds a batch (the algorithm
    calls it after that batch's advantages are written), so what an estimate pools is frozen
    before the batch is collected and independent of its actions (docs/unbiasedness.md, rule 6).
    """

    def __init__(self, window: int = 4, anchor_key: AnchorKey = observation_key) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"history window must be an int >= 1, got {window!r}")
        self.window = window
        self.anchor_key = anchor_key
        self._batches: deque[dict[Hashable, tuple[float, int]]] = deque(maxlen=window)
        self._pooled: dict[Hashable, tuple[float, int]] = {}

    def pooled(self, key: Hashable) -> tuple[float, int]:
        """``(sum of Q, count)`` over the recorded batches' edges with anchor ``key``."""
        return self._pooled.get(key, (0.0, 0))

    def record(self, trees: Sequence[RolloutTree]) -> None:
        """Add one batch's edges (keyed by ``anchor_key``), dropping the oldest past ``window``."""
        stats: dict[Hashable, tuple[float, int]] = {}
        for tree in as_batch(trees):
            for edge in tree.edges():
                key = self.anchor_key(tree, edge.parent)
                total, count = stats.get(key, (0.0, 0))
                stats[key] = (total + edge.q, count + 1)
        self._batches.append(stats)
        self._rebuild()

    def _rebuild(self) -> None:
        pooled: dict[Hashable, tuple[float, int]] = {}
        for stats in self._batches:
            for key, (total, count) in stats.items():
                t, c = pooled.get(key, (0.0, 0))
                pooled[key] = (t + total, c + count)
        self._pooled = pooled

    def __len__(self) -> int:
        return len(self._batches)

    def state_dict(self) -> dict[str, Any]:
        return {"window": self.window, "batches": [dict(b) for b in self._batches]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._batches = deque((dict(b) for b in state["batches"]), maxlen=self.window)
        self._rebuild()


def anchored_sets(
    tree: RolloutTree,
    anchor_key: AnchorKey = observation_key,
    *,
    include_self: bool = False,
    exclude_lineage: bool = True,
) -> list[tuple[Edge, Hashable, list[Edge]]]:
    """``(edge, key, S(e))`` for every edge of ``tree``, depth-first.

    ``S(e)`` = the edges ``e'`` of this tree with ``key(e') == key(e)`` that are neither ``e``
    nor an ancestor nor a descendant of ``e`` (docs/unbiasedness.md, rule 6). ``include_self``
    and ``exclude_lineage=False`` break the rule on purpose: they exist so that the tests can show
    that the exact-gradient check catches such a baseline. The estimators never set them.
    """
    order = tree.edges()  # depth-first preorder: e's descendants follow it contiguously
    index = {id(e): i for i, e in enumerate(order)}
    end = list(range(len(order)))
    for i in range(len(order) - 1, -1, -1):
        for child in order[i].child.children:
            end[i] = max(end[i], end[index[id(child)]])
    groups: dict[Hashable, list[int]] = {}
    keys = []
    for i, edge in enumerate(order):
        key = anchor_key(tree, edge.parent)
        keys.append(key)
        groups.setdefault(key, []).append(i)
    out = []
    for i, edge in enumerate(order):
        members = []
        for j in groups[keys[i]]:
            if j == i:
                if include_self:
                    members.append(edge)
                continue
            if exclude_lineage and (i < j <= end[i] or j < i <= end[j]):
                continue
            members.append(order[j])
        out.append((edge, keys[i], members))
    return out


def anchored_baselines(
    tree: RolloutTree,
    anchor_key: AnchorKey = observation_key,
    *,
    history: AnchorHistory | None = None,
    include_self: bool = False,
    exclude_lineage: bool = True,
    min_matches: int = 1,
) -> list[tuple[Edge, float | None]]:
    """``(edge, baseline)`` for every edge of ``tree``: the mean ``Q`` over ``S(e)``
    (:func:`anchored_sets`) joined by the history's same-key edges, or None when that pool holds
    fewer than ``min_matches`` edges."""
    min_matches = check_count("min_matches", min_matches, 1)
    out: list[tuple[Edge, float | None]] = []
    sets = anchored_sets(tree, anchor_key, include_self=include_self, exclude_lineage=exclude_lineage)
    for edge, key, members in sets:
        total, count = history.pooled(key) if history is not None else (0.0, 0)
        total += sum(e.q for e in members)
        count += len(members)
        out.append((edge, total / count if count >= min_matches else None))
    return out


@register_advantage("anchored")
def anchored_advantages(
    trees: Sequence[RolloutTree],
    *,
    fallback: str = "rloo",
    anchor_key: AnchorKey = observation_key,
    history: AnchorHistory | None = None,
    fallback_options: dict[str, Any] | None = None,
    min_matches: int = 1,
) -> None:
    """State-anchored baselines (docs/unbiasedness.md, rule 6).

    ``A(e) = Q(e) - mean_{e' in S(e)} Q(e')`` where ``S(e)`` holds the same-key edges of e's own
    tree outside e's lineage (:func:`anchored_baselines`), pooled with the same-key edges of the
    earlier batches in ``history`` when one is given. Where that pool holds fewer than
    ``min_matches`` edges (default 1: where it is empty), the edge keeps the ``fallback``
    estimator's advantage (``"rloo"``: the trajectory baseline; ``"bpo"``: rule 4). A mean of one
    or two returns is a noisy baseline, and a larger ``min_matches`` trades it for the fallback's.

    Unbiased: for ``e`` at history ``h`` with action ``a``, the term is
    ``(Q(e) - b(e)) grad log pi(a|h)`` and ``E[b(e) grad log pi(a|h) | h] = 0`` as soon as
    ``b(e)`` is independent of ``a`` given ``h``. Every ``e'`` in ``S(e)`` is: it is not in e's
    subtree, so it lies on lines that left a common branch node above ``e`` through other
    children, sampled i.i.d. and rolled out without looking at e's line (rules 1-2), and whether
    such edges exist, and where, is decided on those lines too. Matching stays *within one tree*
    because how many trees of a task a budgeted batch starts depends on how long e's episode was.
    Edges of earlier batches are independent of this batch altogether. ``Q(e)`` itself is the
    reward-to-go from ``h``; the reward collected before ``h`` is a function of ``h`` and adds no
    bias either (it is dropped, a further variance reduction). The fallback is unbiased by rules
    4-5, and which edges fall back (the pool's size) is, again, decided off e's lineage.
    """
    trees = as_batch(trees)
    estimate_advantages(fallback, trees, **(fallback_options or {}))
    for tree in trees:
        for edge, baseline in anchored_baselines(tree, anchor_key, history=history, min_matches=min_matches):
            if baseline is not None:
                edge.advantage = float(edge.q - baseline)


# ---- GiGPO (verl-agent) ------------------------------------------------------------------------
def _trajectories(tree: RolloutTree) -> list[list[Edge]]:
    """The root group's trajectories; raises unless every non-root node has at most one child."""
    out = []
    for first in tree.root.children:
        line = [first]
        while line[-1].child.children:
            if len(line[-1].child.children) > 1:
                raise ValueError("GiGPO needs independent trajectories from the root (no inner branches)")
            line.append(line[-1].child.children[0])
        out.append(line)
    return out


@register_advantage("gigpo")
def gigpo_advantages(
    trees: Sequence[RolloutTree],
    *,
    step_weight: float = 1.0,
    gamma: float = 0.95,
    scale: str = "none",
    eps: float = 1e-6,
    anchor_key: AnchorKey = observation_key,
) -> None:
    """GiGPO (Feng et al. 2025, verl-agent's ``compute_gigpo_outcome_advantage``).

    Each tree is one episode group: the root's ``N`` trajectories. Every step ``s`` gets
    ``A(s) = A_E(s) + step_weight * A_S(s)``:

    * episode level: ``A_E = R_i - mean``, or ``(R_i - mean) / (std + eps)`` with
      ``scale="group"``, where ``R_i`` is the return of s's trajectory and, as verl-agent computes
      them (``compute_mean_std_cross_steps``), ``mean`` and the sample ``std`` run over the
      group's *steps*, each carrying its trajectory's return (a trajectory of ``T`` steps counts
      ``T`` times);
    * step level: ``G(s) = sum_k gamma^k r_{t+k}``, the discounted return from s on its
      trajectory; s's step group is every step of the group's trajectories whose decision node
      has the same anchor key (by default the task and the observation), s itself and repeats
      within one trajectory included; ``A_S = G(s) - mean`` over that group, or divided by its
      sample ``std + eps`` with ``scale="group"``; a group of one gets 0.

    ``scale`` applies to both levels, as verl-agent's ``mode`` does (``"none"`` = ``mean_norm``,
    its default; ``"group"`` = ``mean_std_norm``). Biased (the mean includes the step itself, and
    the step-weighted episode mean depends on the trajectory's own length), as published.
    """
    _check_scale(scale)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    for tree in as_batch(trees):
        lines = _trajectories(tree)
        steps = [e for line in lines for e in line]
        if not steps:
            continue
        episode = np.array([sum(e.reward for e in line) for line in lines for _ in line])
        if episode.size == 1:
            a_episode = episode / (1.0 + eps) if scale == "group" else episode.copy()
        else:
            a_episode = episode - episode.mean()
            if scale == "group":
                a_episode = a_episode / (episode.std(ddof=1) + eps)
        returns = []
        for line in lines:
            g, back = 0.0, []
            for edge in reversed(line):
                g = edge.reward + gamma * g
                back.append(g)
            returns.extend(reversed(back))
        g_all = np.array(returns)
        groups: dict[Hashable, list[int]] = {}
        for i, edge in enumerate(steps):
            groups.setdefault(anchor_key(tree, edge.parent), []).append(i)
        a_step = np.zeros(len(steps))
        for members in groups.values():
            if len(members) < 2:
                continue
            values = g_all[members]
            centred = values - values.mean()
            a_step[members] = centred / (values.std(ddof=1) + eps) if scale == "group" else centred
        for edge, ae, as_ in zip(steps, a_episode, a_step, strict=True):
            edge.advantage = float(ae + step_weight * as_)


def gigpo_step_group_sizes(tree: RolloutTree, anchor_key: AnchorKey = observation_key) -> list[int]:
    """For every step of ``tree`` (a GiGPO fan), the size of its step group (itself included)."""
    steps = [e for line in _trajectories(tree) for e in line]
    keys = [anchor_key(tree, e.parent) for e in steps]
    counts: dict[Hashable, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return [counts[k] for k in keys]


# ---- Tree-GRPO -----------------------------------------------------------------------------------
def _leaf_returns(tree: RolloutTree) -> list[tuple[Edge, float]]:
    """``(leaf edge, reward summed from the root)`` for every finished path."""
    out: list[tuple[Edge, float]] = []
    stack = [(e, 0.0) for e in reversed(tree.root.children)]
    while stack:
        edge, before = stack.pop()
        total = before + edge.reward
        if edge.terminated or edge.truncated or not edge.child.children:
            out.append((edge, total))
        stack.extend((c, total) for c in reversed(edge.child.children))
    return out


def groups_by_task(trees: Sequence[RolloutTree]) -> list[list[int]]:
    """Tree indices grouped by task id, in order of first appearance."""
    groups: dict[Any, list[int]] = {}
    for i, tree in enumerate(trees):
        groups.setdefault(repr(tree.task_id), []).append(i)
    return list(groups.values())


@register_advantage("tree-grpo")
def tree_grpo_advantages(
    trees: Sequence[RolloutTree],
    *,
    groups: Sequence[Sequence[int]] | None = None,
    eps: float = 1e-6,
) -> None:
    """Tree-GRPO (Ji et al. 2025; the ``tree`` estimator of AMAP-ML/Tree-GRPO).

    Each tree is one of a prompt's ``M`` search trees; ``groups`` lists the tree indices that
    form one prompt's forest (default: the trees of the same task). For every leaf ``l`` (a
    finished path, return ``R_l`` summed from the root)::

        A_l = (R_l - mean_forest R) / (std_forest R + eps)      # inter-tree
            + (R_l - mean_tree R) / (std_tree R + eps)          # intra-tree

    (sample std; a group of one has mean 0 and std 1, as in verl). Every token of the leaf's
    path gets ``A_l``: a step shared by several kept leaves is one sample per leaf below it, so
    the estimator writes ``weight(e) = n_leaves_below(e) / n_leaves(tree)`` and
    ``advantage(e) = mean of A_l over those leaves`` (``weight x advantage`` is the leaves' sum,
    as when every leaf's path is its own row). Biased by the std divisions, as published.
    """
    trees = as_batch(trees)
    forests = [list(g) for g in groups] if groups is not None else groups_by_task(trees)
    for forest in forests:
        leaves = [_leaf_returns(trees[i]) for i in forest]
        if not any(leaves):
            continue
        all_r = np.array([r for tree_leaves in leaves for _, r in tree_leaves])
        inter = iter(_verl_group_norm(all_r, "group", eps))
        for i, tree_leaves in zip(forest, leaves, strict=True):
            if not tree_leaves:
                continue
            intra = _verl_group_norm(np.array([r for _, r in tree_leaves]), "group", eps)
            leaf_adv = {id(edge): float(next(inter) + a) for (edge, _), a in zip(tree_leaves, intra, strict=True)}
            _spread_leaf_advantages(trees[i], leaf_adv, len(tree_leaves))


def _spread_leaf_advantages(tree: RolloutTree, leaf_adv: dict[int, float], n_leaves: int) -> None:
    def visit(edge: Edge) -> tuple[float, int]:
        if id(edge) in leaf_adv:
            total, count = leaf_adv[id(edge)], 1
        else:
            total, count = 0.0, 0
        for child in edge.child.children:
            t, c = visit(child)
            total, count = total + t, count + c
        edge.weight = count / n_leaves
        edge.advantage = total / count if count else 0.0
        return total, count

    for first in tree.root.children:
        visit(first)


# ---- the baseline= option of BPO and RLOO ----------------------------------------------------
class BaselineChoice:
    """What the ``baseline=`` option of BPO and RLOO stands for, and its history:

    * the plain baseline (``"tree"`` for BPO: rule 4; ``"trajectory"`` for RLOO: rule 5);
    * ``"anchored"``: ``A(e) = Q(e) - mean Q`` over the same-key edges of e's tree outside e's
      lineage, else the plain advantage (:func:`bpo_algos.advantages.anchored_advantages`);
    * ``"anchored+history"``: that pool joined by the same-key edges of the previous
      ``history_window`` batches, frozen before the batch (docs/unbiasedness.md, rule 6).

    Either anchored choice uses the pool only when it holds at least ``min_matches`` edges (default
    1), else the plain advantage; the pool's size is decided off e's lineage, so this stays unbiased.

    The anchor key is a function of the decision node (the history) only: by default a stable hash
    of the task and the observation the policy sees (:func:`bpo_algos.advantages.observation_key`);
    ``anchor_key=`` takes any ``key(tree, node) -> hashable``.
    """

    def __init__(
        self,
        baseline: str,
        *,
        plain: str,
        anchor_key: AnchorKey | None = None,
        history_window: int = 4,
        min_matches: int = 1,
    ) -> None:
        choices = (plain, "anchored", "anchored+history")
        if baseline not in choices:
            raise ValueError(f"baseline must be one of {choices}, got {baseline!r}")
        if anchor_key is not None and not callable(anchor_key):
            raise TypeError(f"anchor_key must be callable(tree, node), got {type(anchor_key).__name__}")
        self.baseline = baseline
        self.anchor_key: AnchorKey = anchor_key or observation_key
        self.history_window = check_count("history_window", history_window, 1)
        self.min_matches = check_count("min_matches", min_matches, 1)
        self.history = (
            AnchorHistory(self.history_window, self.anchor_key) if baseline == "anchored+history" else None
        )

    @property
    def anchored(self) -> bool:
        return self.baseline in ("anchored", "anchored+history")

    def anchored_options(self, fallback: str) -> dict[str, Any]:
        """The options of the ``anchored`` estimator, ``fallback`` the algorithm's own."""
        return {
            "fallback": fallback,
            "anchor_key": self.anchor_key,
            "history": self.history,
            "min_matches": self.min_matches,
        }

    def end_batch(self, trees: Sequence[RolloutTree]) -> None:
        """Record the batch into the history (after its advantages are written)."""
        if self.history is not None:
            self.history.record(trees)

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history.state_dict()} if self.history is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.history is not None and "history" in state:
            self.history.load_state_dict(state["history"])

"""Branching Policy Optimization (BPO).

One tree per task. The root branches into ``K0`` backbones (i.i.d. first actions). Along each
backbone, at a decision point whose decision entropy exceeds the threshold, the env is
snapshotted and ``K`` i.i.d. actions are sampled there: the backbone continues with the first,
the other ``K - 1`` are forked from the snapshot and rolled to the end. At most ``M`` branch
points per path; forked siblings branch again only while their nesting level is below
``max_depth``.

Unbiasedness (docs/unbiasedness.md, rules 1-4):

1. The branch decision at ``h`` uses only ``H(pi(.|h))``, computed before any action is
   sampled at ``h``, the path's own branch count (part of ``h``), a threshold fixed from
   *earlier* batches (``entropy_quantile`` of the decision entropies seen in the previous
   ``threshold_window`` batches; ``0`` before the first batch: branch wherever the policy is not
   deterministic) and independent randomness: an entropy *at* an adaptive threshold (a tie,
   common where many decision points share one entropy, e.g. a uniform policy) branches with
   probability ``p``, drawn from the path's own random stream (:mod:`bpo_algos.rollout`), with ``p`` set from the same earlier
   batches so that a fraction ``1 - entropy_quantile`` of their decisions would branch. The
   draw uses nothing of the action sampled at ``h`` or of what follows, so rule 1 holds
   (docs/unbiasedness.md, rules 1 and 6); a strict ``>`` would stop branching altogether where
   the quantile sits on a shared value.
   With ``branch_rule="measured"`` (or ``"entropy+measured"``) the decision uses, instead of
   (or besides) the entropy, the depth's ``eta`` and fork cost measured on the previous
   ``measure_window`` batches and a coin from the path's stream (:mod:`bpo_algos.branch_rule`):
   again nothing of the action at ``h``.
2. Siblings are i.i.d. samples, never deduplicated; with ``siblings="distinct"`` (rule 7) they
   are ``K`` different actions drawn without replacement (``distinct_backbones``: the root's
   ``K0`` too), weighted by the unordered-set construction of :mod:`bpo_algos.siblings`.
3. Weights: a step's weight is ``prod 1/K_b`` over the branch nodes above it (root: ``1/K0``);
   at a distinct node ``w_S(s)`` instead of ``1/K`` (:func:`bpo_algos.siblings.finalize_distinct`).
4. Advantage: ``A_t = G_k(t) - mean_{j != k} G_j`` from the nearest branch node
   (:func:`bpo_algos.advantages.bpo_advantages`); with ``baseline="anchored"`` or
   ``"anchored+history"``, the state-anchored baseline of rule 6 where a step has same-key
   edges outside its lineage (:class:`bpo_algos.advantages.BaselineChoice`).

The whole estimator is in three files: this one (the branch rule, 1-2), :mod:`bpo_algos.tree`
(weights and values, 3: :meth:`~bpo_algos.tree.RolloutTree.finalize`) and
:mod:`bpo_algos.advantages` (the advantage, 4: :func:`~bpo_algos.advantages.bpo_advantages`;
the anchored baseline, rule 6).

So ``sum_t w_t A_t grad log pi(a_t | h_t)``, averaged over trees, is an unbiased estimate of
the policy gradient of the expected return.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bpo_algos.advantages import AnchorKey, BaselineChoice
from bpo_algos.algorithm import Algorithm, Batch, Options
from bpo_algos.branch_rule import BRANCH_RULES, DepthMeasure
from bpo_algos.registry import Variant
from bpo_algos.rollout import PathState
from bpo_algos.siblings import SIBLINGS, finalize_distinct
from bpo_algos.tree import RolloutTree
from bpo_envs.validation import check_count

SCORING = ("all", "eligible")
BASELINES = ("tree", "anchored", "anchored+history")


def _ties(entropy: Any, threshold: float) -> Any:
    """Whether ``entropy`` equals ``threshold`` up to float noise (elementwise for arrays)."""
    return np.isclose(entropy, threshold, rtol=1e-9, atol=1e-12)


@dataclass
class BPOOptions(Options):
    """BPO's own options (the shared loss options: :class:`~bpo_algos.algorithm.AlgorithmConfig`)."""

    backbones: int = 2
    """``K0 >= 2`` backbones from the root (so backbone steps have siblings too)."""
    branch_factor: int = 4
    """``K >= 2`` i.i.d. actions at each branch point (the backbone's own action is one of them)."""
    entropy_threshold: float | None = None
    """Branch where the decision entropy exceeds this (nats); None: adapt (``entropy_quantile``)."""
    entropy_quantile: float = 0.8
    """With an adaptive threshold, the quantile of earlier batches' decision entropies used."""
    max_branch_points: int = 1
    """``M``, branch points per path."""
    max_depth: int = 1
    """Nesting levels of branching (1: forked siblings do not branch again)."""
    threshold_window: int = 2
    """Earlier batches whose decision entropies set the adaptive threshold."""
    scoring: str = "all"
    """Where the decision entropy is computed: ``all`` (every decision point of a path that may
    branch at all, also after its ``M`` branch points: the threshold's sample is every such
    decision) or ``eligible`` (only where the path can still branch: saves the scoring passes
    after the ``M``-th branch point; the threshold's sample is then those decisions)."""
    baseline: str = "tree"
    """``tree`` (rule 4), ``anchored`` or ``anchored+history`` (rule 6)."""
    history_window: int = 4
    """Earlier batches pooled by ``anchored+history``."""
    min_matches: int = 1
    """The anchored baselines use a pool of at least this many same-key edges, else rule 4's."""
    siblings: str = "iid"
    """``iid`` (rule 2) or ``distinct``: the ``K`` actions of an inner branch point are different,
    drawn without replacement, with the unordered-set weights of rule 7 (needs a policy over
    enumerable admissible actions, a ChoicePolicy)."""
    distinct_backbones: bool = False
    """Draw the root's ``K0`` backbones without replacement too (rule 7)."""
    branch_rule: str = "entropy"
    """Where to branch: ``entropy`` (decision entropy above the threshold), ``measured`` (the depth
    whose eta and fork cost, measured on earlier batches, predict the lowest variance per env step;
    bpo_algos.branch_rule) or ``entropy+measured`` (the entropy rule, skipping depths where that
    prediction says a branch loses to RLOO)."""
    measure_window: int = 8
    """Earlier batches the measured rules read."""
    min_measured: int = 4
    """Branch nodes a depth needs in the window before the measured rules trust its eta."""
    measure_explore: float = 0.25
    """Share of the measured rule's branch points spread uniformly over depths (keeps them measured)."""

    def __post_init__(self) -> None:
        check_count("backbones", self.backbones, 2)
        check_count("branch_factor", self.branch_factor, 2)
        threshold = self.entropy_threshold
        if threshold is not None and not (isinstance(threshold, int | float) and np.isfinite(threshold) and threshold >= 0):
            raise ValueError(f"entropy_threshold must be None or a finite number >= 0, got {threshold!r}")
        if not 0.0 <= self.entropy_quantile <= 1.0:
            raise ValueError(f"entropy_quantile must be in [0, 1], got {self.entropy_quantile}")
        check_count("max_branch_points", self.max_branch_points, 0)
        check_count("max_depth", self.max_depth, 1)
        check_count("threshold_window", self.threshold_window, 1)
        if self.scoring not in SCORING:
            raise ValueError(f"scoring must be one of {SCORING}, got {self.scoring!r}")
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {self.baseline!r}")
        check_count("history_window", self.history_window, 1)
        check_count("min_matches", self.min_matches, 1)
        if self.siblings not in SIBLINGS:
            raise ValueError(f"siblings must be one of {SIBLINGS}, got {self.siblings!r}")
        if not isinstance(self.distinct_backbones, bool):
            raise ValueError(f"distinct_backbones must be a bool, got {self.distinct_backbones!r}")
        if self.distinct and self.baseline != "tree":
            raise ValueError("distinct siblings (rule 7) come with the tree baseline only (baseline='tree')")
        if self.branch_rule not in BRANCH_RULES:
            raise ValueError(f"branch_rule must be one of {BRANCH_RULES}, got {self.branch_rule!r}")
        check_count("measure_window", self.measure_window, 1)
        check_count("min_measured", self.min_measured, 1)
        if not 0.0 <= self.measure_explore <= 1.0:
            raise ValueError(f"measure_explore must be in [0, 1], got {self.measure_explore}")

    @property
    def distinct(self) -> bool:
        """Whether any branch node draws without replacement (rule 7)."""
        return self.siblings == "distinct" or self.distinct_backbones


class BPO(Algorithm):
    """Branching Policy Optimization: options :class:`BPOOptions` (and the shared
    :class:`~bpo_algos.algorithm.AlgorithmConfig`), ``seed``, and ``anchor_key``:
    ``key(tree, node) -> hashable`` for the anchored baselines (default: the task and the
    observation)."""

    name = "bpo"
    Options = BPOOptions

    def __init__(self, options: BPOOptions | None = None, *, anchor_key: AnchorKey | None = None, **kwargs: Any) -> None:
        super().__init__(options, **kwargs)
        o = self.options
        self.baseline_choice = BaselineChoice(
            o.baseline, plain="tree", anchor_key=anchor_key, history_window=o.history_window, min_matches=o.min_matches,
        )
        self._history: deque[list[float]] = deque(maxlen=o.threshold_window)
        self.threshold = 0.0 if o.entropy_threshold is None else float(o.entropy_threshold)
        """The threshold in force for the next batch."""
        self.tie_probability = 0.0
        """Probability of branching at an entropy equal to the adaptive threshold (0 when fixed)."""
        self.depths = DepthMeasure(o.measure_window, o.min_measured, o.measure_explore)
        """What earlier batches measured by depth (the measured branch rules)."""

    @property
    def root_branches(self) -> int:  # type: ignore[override]
        return self.options.backbones

    def estimator(self, trees: Sequence[RolloutTree]) -> tuple[str, dict[str, Any]]:
        """Rule 4's ``bpo`` estimator (``bpo-distinct`` with distinct siblings, rule 7); with an
        anchored baseline, ``anchored`` (rule 6) falling back to ``bpo`` where a step has no
        same-key edges."""
        if self.options.distinct:
            return "bpo-distinct", self._distinct_where()
        if not self.baseline_choice.anchored:
            return "bpo", {}
        return "anchored", self.baseline_choice.anchored_options(fallback="bpo")

    def _distinct_where(self) -> dict[str, bool]:
        return {"distinct_root": self.options.distinct_backbones, "distinct_inner": self.options.siblings == "distinct"}

    def draws_distinct(self, path: PathState) -> bool:
        return self.options.distinct_backbones if path.is_root else self.options.siblings == "distinct"

    def finish_trees(self, trees: list[RolloutTree]) -> None:
        """With distinct siblings, rule 7's weights and values replace rule 3's."""
        if self.options.distinct:
            for tree in trees:
                finalize_distinct(tree, **self._distinct_where())

    def wants_entropy(self, path: PathState) -> bool:
        if path.level >= self.options.max_depth or self.options.max_branch_points == 0:
            return False
        if self.options.branch_rule == "measured" and self.depths.ready:
            return False  # the measured rule needs no entropy (the first batch uses the entropy rule)
        # "all": also past the M-th branch point, for the adaptive threshold's sample
        return self.options.scoring == "all" or path.branch_points < self.options.max_branch_points

    def fork_count(self, path: PathState, entropy: float | None) -> int:
        if path.level >= self.options.max_depth or path.branch_points >= self.options.max_branch_points:
            return 1
        depth = path.node.depth
        if self.options.branch_rule == "measured" and self.depths.ready:
            # rule 1: the depth (part of h), earlier batches' plan and the path's own coin
            return self.options.branch_factor if path.random.random() < self.depths.branch_probability(depth) else 1
        if entropy is None or (self.options.branch_rule == "entropy+measured" and self.depths.vetoed(depth)):
            return 1
        if _ties(entropy, self.threshold):
            # independent randomness (rule 1): nothing of the action at this decision point
            branch = self.tie_probability > 0 and path.random.random() < self.tie_probability
        else:
            branch = entropy > self.threshold
        return self.options.branch_factor if branch else 1

    def tree_prior(self, step_limit: int) -> dict[str, float]:
        """A tree's cost if it branches at every chance (the first batch's threshold is 0) and
        every path runs to ``step_limit``: the budget's estimate before any tree is measured."""

        def path(start: int, level: int) -> tuple[float, float]:
            steps, leaves = float(step_limit - start), 1.0
            if level < self.options.max_depth:
                for depth in range(start + 1, min(start + self.options.max_branch_points, step_limit - 1) + 1):
                    s, n = path(depth, level + 1)
                    steps += (self.options.branch_factor - 1) * s
                    leaves += (self.options.branch_factor - 1) * n
            return steps, leaves

        steps, leaves = path(0, 0)
        return {"env_steps": self.options.backbones * steps, "leaves": self.options.backbones * leaves}

    def end_batch(self, batch: Batch) -> None:
        self.baseline_choice.end_batch(batch.trees)
        if self.options.branch_rule != "entropy":
            self.depths.record(batch.trees, self.options.backbones, self.options.branch_factor)
        if self.options.entropy_threshold is not None or not batch.entropies:
            return
        self._history.append(list(batch.entropies))
        pooled = np.concatenate([np.asarray(h) for h in self._history])
        self.threshold = float(np.quantile(pooled, self.options.entropy_quantile))
        tied = _ties(pooled, self.threshold)
        above = float(np.mean((pooled > self.threshold) & ~tied))
        share = float(np.mean(tied))
        # branch a fraction 1 - q of these decisions: all above, and ties with probability p
        self.tie_probability = min(max((1.0 - self.options.entropy_quantile - above) / share, 0.0), 1.0) if share else 0.0

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "threshold": self.threshold,
            "history": list(self._history),
            "tie_probability": self.tie_probability,
            "baseline": self.baseline_choice.state_dict(),
            "depths": self.depths.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.threshold = state["threshold"]
        self._history = deque(state["history"], maxlen=self.options.threshold_window)
        self.tie_probability = state.get("tie_probability", 0.0)
        self.baseline_choice.load_state_dict(state.get("baseline", {}))
        self.depths.load_state_dict(state.get("depths", {}))


# the registered variants (entry points of the ``bpo_algos.algorithms`` group, pyproject.toml)
bpo_anchored = Variant(BPO, baseline="anchored")
bpo_anchored_history = Variant(BPO, baseline="anchored+history")

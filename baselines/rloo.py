"""RLOO (Ahmadian et al. 2024): ``N`` independent trajectories, leave-one-out baseline.

``A_i = R_i - mean_{j != i} R_j`` copied to every step of trajectory ``i``: unbiased. With
``baseline="anchored"`` (or ``"anchored+history"``) a step whose decision node shares its anchor
key with steps of the other trajectories (or of earlier batches) gets
``Q(e) - mean Q(e')`` over those instead (docs/unbiasedness.md, rule 6;
:class:`bpo_algos.advantages.BaselineChoice`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bpo_algos.advantages import AnchorKey, BaselineChoice
from bpo_algos.algorithm import Algorithm, Batch, Options
from bpo_algos.registry import Variant
from bpo_algos.tree import RolloutTree
from bpo_envs.validation import check_count

BASELINES = ("trajectory", "anchored", "anchored+history")


@dataclass
class RLOOOptions(Options):
    """RLOO's own options."""

    group_size: int = 8
    """``N >= 2`` trajectories per task from the root snapshot."""
    baseline: str = "trajectory"
    """``trajectory`` (leave-one-out, rule 5), ``anchored`` or ``anchored+history`` (rule 6)."""
    history_window: int = 4
    """Earlier batches pooled by ``anchored+history``."""
    min_matches: int = 1
    """The anchored baselines use a pool of at least this many same-key edges, else rule 5's."""

    def __post_init__(self) -> None:
        check_count("group_size", self.group_size, 2)
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {self.baseline!r}")
        check_count("history_window", self.history_window, 1)
        check_count("min_matches", self.min_matches, 1)


class RLOO(Algorithm):
    """REINFORCE Leave-One-Out over ``group_size`` rollouts from the root snapshot: options
    :class:`RLOOOptions`, and ``anchor_key``: ``key(tree, node) -> hashable`` for the anchored
    baselines (default: the task and the observation)."""

    name = "rloo"
    Options = RLOOOptions

    def __init__(self, options: RLOOOptions | None = None, *, anchor_key: AnchorKey | None = None, **kwargs: Any) -> None:
        super().__init__(options, **kwargs)
        o = self.options
        self.baseline_choice = BaselineChoice(
            o.baseline, plain="trajectory", anchor_key=anchor_key, history_window=o.history_window, min_matches=o.min_matches,
        )

    @property
    def root_branches(self) -> int:  # type: ignore[override]
        return self.options.group_size

    def estimator(self, trees: Sequence[RolloutTree]) -> tuple[str, dict[str, Any]]:
        """Rule 5's ``rloo`` estimator; with an anchored baseline, ``anchored`` (rule 6)
        falling back to ``rloo``."""
        if not self.baseline_choice.anchored:
            return "rloo", {}
        return "anchored", self.baseline_choice.anchored_options(fallback="rloo")

    def end_batch(self, batch: Batch) -> None:
        self.baseline_choice.end_batch(batch.trees)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "baseline": self.baseline_choice.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.baseline_choice.load_state_dict(state.get("baseline", {}))


# the registered variants (entry points of the ``bpo_algos.algorithms`` group, pyproject.toml)
rloo_anchored = Variant(RLOO, baseline="anchored")
rloo_anchored_history = Variant(RLOO, baseline="anchored+history")

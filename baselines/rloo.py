"""RLOO (Ahmadian et al. 2024): ``N`` independent trajectories, leave-one-out baseline.

``A_i = R_i - mean_{j != i} R_j`` copied to every step of trajectory ``i``: unbiased. With
``baseline="anchored"`` (or ``"anchored+history"``) a step whose decision node shares its anchor
key with steps of the other trajectories (or of earlier batches) gets
``Q(e) - mean Q(e')`` over those instead (docs/unbiasedness.md, rule 6;
:mod:`bpo_algos.baseline_choice`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from bpo_algos.advantages import AnchorKey
from bpo_algos.algorithm import Algorithm, Batch
from bpo_algos.baseline_choice import AnchoredBaselineMixin, BaselineChoice
from bpo_algos.checks import check_count
from bpo_algos.registry import register_algorithm


class RLOO(AnchoredBaselineMixin, Algorithm):
    """REINFORCE Leave-One-Out over ``group_size`` rollouts from the root snapshot.

    Args:
        group_size: ``N >= 2`` trajectories per task.
        baseline: ``"trajectory"`` (leave-one-out, rule 5), ``"anchored"`` or
            ``"anchored+history"`` (rule 6).
        anchor_key: ``key(tree, node) -> hashable`` (default: the task and the observation).
        history_window: earlier batches pooled by ``"anchored+history"``.
        min_matches: the anchored baselines use a pool of at least this many same-key edges,
            else the plain advantage.
        **kwargs: loss options of :class:`~bpo_algos.algorithm.Algorithm`.
    """

    name = "rloo"

    def __init__(
        self,
        group_size: int = 8,
        baseline: str = "trajectory",
        anchor_key: AnchorKey | None = None,
        history_window: int = 4,
        min_matches: int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.group_size = check_count("group_size", group_size, 2)
        self.baseline = baseline
        self.baseline_choice = BaselineChoice(
            baseline, plain="trajectory", plain_estimator="rloo", anchor_key=anchor_key,
            history_window=history_window, min_matches=min_matches,
        )

    @property
    def root_branches(self) -> int:  # type: ignore[override]
        return self.group_size

    def end_batch(self, batch: Batch) -> None:
        self.baseline_choice.end_batch(batch.trees)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "baseline": self.baseline_choice.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.baseline_choice.load_state_dict(state.get("baseline", {}))

    def config(self) -> dict[str, Any]:
        return {**super().config(), "group_size": self.group_size, **self.baseline_choice.config()}


register_algorithm("rloo", RLOO)
# partials keep the signature, so the main job passes the preset's shared fields (backbones, ...)
register_algorithm("rloo-anchored", partial(RLOO, baseline="anchored"))
register_algorithm("rloo-anchored+history", partial(RLOO, baseline="anchored+history"))

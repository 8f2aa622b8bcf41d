"""RLOO (Ahmadian et al. 2024): ``N`` independent trajectories, leave-one-out baseline.

``A_i = R_i - mean_{j != i} R_j`` copied to every step of trajectory ``i``: unbiased.
"""

from __future__ import annotations

from typing import Any

from bpo_algos.advantages import group_advantages
from bpo_algos.algorithm import Algorithm
from bpo_algos.checks import check_count
from bpo_algos.registry import register_algorithm
from bpo_algos.tree import RolloutTree


class RLOO(Algorithm):
    """REINFORCE Leave-One-Out over ``group_size`` rollouts from the root snapshot."""

    name = "rloo"

    def __init__(self, group_size: int = 8, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.group_size = check_count("group_size", group_size, 2)

    @property
    def root_branches(self) -> int:  # type: ignore[override]
        return self.group_size

    def compute_advantages(self, tree: RolloutTree) -> None:
        group_advantages(tree, "rloo")

    def config(self) -> dict[str, Any]:
        return {**super().config(), "group_size": self.group_size}


register_algorithm("rloo", RLOO)

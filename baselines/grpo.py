"""GRPO (Shao et al. 2024): ``N`` independent trajectories per task, group-normalised returns.

``A_i = (R_i - mean_j R_j) / (std_j R_j + eps)`` copied to every step of trajectory ``i``. The
division by the std biases the gradient (as published); ``scale="none"`` gives the Dr. GRPO
form ``A_i = R_i - mean_j R_j``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bpo_algos.advantages import GRPO_SCALES
from bpo_algos.algorithm import Algorithm, Options
from bpo_algos.tree import RolloutTree
from bpo_envs.validation import check_count


@dataclass
class GRPOOptions(Options):
    """GRPO's own options."""

    group_size: int = 8
    """``N >= 2`` trajectories per task from the root snapshot."""
    scale: str = "group"
    """``group`` (divide by the group's std, as published) or ``none`` (Dr. GRPO)."""
    eps: float = 1e-6
    """Added to the std with ``scale="group"``."""

    def __post_init__(self) -> None:
        check_count("group_size", self.group_size, 2)
        if self.scale not in GRPO_SCALES:
            raise ValueError(f"scale must be one of {GRPO_SCALES}, got {self.scale!r}")


class GRPO(Algorithm):
    """Group Relative Policy Optimization over ``group_size`` rollouts from the root snapshot."""

    name = "grpo"
    Options = GRPOOptions

    @property
    def unbiased(self) -> bool:  # type: ignore[override]
        """The std division biases the gradient; Dr. GRPO's ``scale="none"`` does not."""
        return self.options.scale == "none"

    @property
    def root_branches(self) -> int:  # type: ignore[override]
        return self.options.group_size

    def estimator(self, trees: Sequence[RolloutTree]) -> tuple[str, dict[str, Any]]:
        return "grpo", {"scale": self.options.scale, "eps": self.options.eps}

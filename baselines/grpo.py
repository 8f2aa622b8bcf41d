"""GRPO (Shao et al. 2024): ``N`` independent trajectories per task, group-normalised returns.

``A_i = (R_i - mean_j R_j) / (std_j R_j + eps)`` copied to every step of trajectory ``i``. The
division by the std biases the gradient (as published); ``scale="none"`` gives the Dr. GRPO
form ``A_i = R_i - mean_j R_j``.
"""

from __future__ import annotations

from typing import Any

from bpo_algos.advantages import GRPO_SCALES
from bpo_algos.algorithm import Algorithm
from bpo_algos.checks import check_count
from bpo_algos.registry import register_algorithm


class GRPO(Algorithm):
    """Group Relative Policy Optimization over ``group_size`` rollouts from the root snapshot."""

    name = "grpo"

    def __init__(self, group_size: int = 8, scale: str = "group", eps: float = 1e-6, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.group_size = check_count("group_size", group_size, 2)
        if scale not in GRPO_SCALES:
            raise ValueError(f"scale must be one of {GRPO_SCALES}, got {scale!r}")
        self.scale = scale
        self.eps = eps
        # the std division biases the gradient; Dr. GRPO's scale="none" does not
        self.unbiased = scale == "none"

    @property
    def root_branches(self) -> int:  # type: ignore[override]
        return self.group_size

    advantage_estimator = "grpo"

    def advantage_options(self) -> dict[str, Any]:
        return {"scale": self.scale, "eps": self.eps}

    def config(self) -> dict[str, Any]:
        return {**super().config(), "group_size": self.group_size, "scale": self.scale}


register_algorithm("grpo", GRPO)

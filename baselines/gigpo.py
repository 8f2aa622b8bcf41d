"""GiGPO (Feng et al. 2025, arXiv 2505.10978; verl-agent): group-in-group advantages.

``N`` independent trajectories per task, as GRPO; every step gets an episode-level advantage
(its trajectory's return against the group) plus ``step_weight`` times a step-level one (its
discounted return against the steps of the group that acted on the same anchor observation):
:func:`bpo_algos.advantages.gigpo_advantages`. Step-level credit with no extra env steps.
Biased, as published (the group means include the step itself; see the estimator).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bpo_algos.advantages import GRPO_SCALES, AnchorKey, observation_key
from bpo_algos.algorithm import Algorithm, Options
from bpo_algos.tree import RolloutTree
from bpo_envs.validation import check_count


@dataclass
class GiGPOOptions(Options):
    """GiGPO's own options (verl-agent's names in brackets)."""

    group_size: int = 8
    """``N >= 2`` trajectories per task (``env.rollout.n``)."""
    step_weight: float = 1.0
    """``omega``, the weight of the step-level advantage (``step_advantage_w``)."""
    gamma: float = 0.95
    """Discount of the step-level returns (``algorithm.gamma``; 0.95 in its scripts)."""
    scale: str = "none"
    """``none`` (``mean_norm``, its default) or ``group`` (``mean_std_norm``), for both levels."""
    eps: float = 1e-6
    """Added to the std with ``scale="group"``."""

    def __post_init__(self) -> None:
        check_count("group_size", self.group_size, 2)
        if self.scale not in GRPO_SCALES:
            raise ValueError(f"scale must be one of {GRPO_SCALES}, got {self.scale!r}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if not (isinstance(self.step_weight, int | float) and self.step_weight >= 0):
            raise ValueError(f"step_weight must be a number >= 0, got {self.step_weight!r}")


class GiGPO(Algorithm):
    """Group-in-Group Policy Optimization over ``group_size`` rollouts from the root snapshot:
    options :class:`GiGPOOptions`, and ``anchor_key``: ``key(tree, node) -> hashable`` that forms
    step groups (default: the task and the observation, i.e. identical anchor observations)."""

    name = "gigpo"
    Options = GiGPOOptions
    unbiased = False
    """Its group-normalised (and, for GiGPO, step-grouped) advantages bias the gradient: the main
    job reports the cosine of its mean gradient to RLOO's."""

    def __init__(self, options: GiGPOOptions | None = None, *, anchor_key: AnchorKey | None = None, **kwargs: Any) -> None:
        super().__init__(options, **kwargs)
        if anchor_key is not None and not callable(anchor_key):
            raise TypeError(f"anchor_key must be callable(tree, node), got {type(anchor_key).__name__}")
        self.anchor_key: AnchorKey = anchor_key or observation_key

    @property
    def root_branches(self) -> int:  # type: ignore[override]
        return self.options.group_size

    def estimator(self, trees: Sequence[RolloutTree]) -> tuple[str, dict[str, Any]]:
        o = self.options
        return "gigpo", {"step_weight": float(o.step_weight), "gamma": float(o.gamma), "scale": o.scale, "eps": o.eps,
                         "anchor_key": self.anchor_key}

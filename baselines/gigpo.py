"""GiGPO (Feng et al. 2025, arXiv 2505.10978; verl-agent): group-in-group advantages.

``N`` independent trajectories per task, as GRPO; every step gets an episode-level advantage
(its trajectory's return against the group) plus ``step_weight`` times a step-level one (its
discounted return against the steps of the group that acted on the same anchor observation):
:func:`bpo_algos.advantages.gigpo_advantages`. Step-level credit with no extra env steps.
Biased, as published (the group means include the step itself; see the estimator).
"""

from __future__ import annotations

from typing import Any

from bpo_algos.advantages import GRPO_SCALES, AnchorKey, observation_key
from bpo_algos.algorithm import Algorithm
from bpo_algos.checks import check_count
from bpo_algos.registry import register_algorithm


class GiGPO(Algorithm):
    """Group-in-Group Policy Optimization over ``group_size`` rollouts from the root snapshot.

    Args:
        group_size: ``N >= 2`` trajectories per task (verl-agent's ``env.rollout.n``).
        step_weight: ``omega``, the weight of the step-level advantage (``step_advantage_w``).
        gamma: discount of the step-level returns (``algorithm.gamma``; 0.95 in its scripts).
        scale: ``"none"`` (verl-agent's ``mean_norm``, its default) or ``"group"``
            (``mean_std_norm``), for both levels.
        anchor_key: ``key(tree, node) -> hashable`` that forms step groups (default: the task
            and the observation, i.e. identical anchor observations).
        eps: added to the std with ``scale="group"``.
        **kwargs: loss options of :class:`~bpo_algos.algorithm.Algorithm`.
    """

    name = "gigpo"
    unbiased = False
    """Its group-normalised (and, for GiGPO, step-grouped) advantages bias the gradient: the main
    job reports the cosine of its mean gradient to RLOO's."""
    advantage_estimator = "gigpo"

    def __init__(
        self,
        group_size: int = 8,
        step_weight: float = 1.0,
        gamma: float = 0.95,
        scale: str = "none",
        anchor_key: AnchorKey | None = None,
        eps: float = 1e-6,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.group_size = check_count("group_size", group_size, 2)
        if scale not in GRPO_SCALES:
            raise ValueError(f"scale must be one of {GRPO_SCALES}, got {scale!r}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        if not (isinstance(step_weight, int | float) and step_weight >= 0):
            raise ValueError(f"step_weight must be a number >= 0, got {step_weight!r}")
        if anchor_key is not None and not callable(anchor_key):
            raise TypeError(f"anchor_key must be callable(tree, node), got {type(anchor_key).__name__}")
        self.step_weight = float(step_weight)
        self.gamma = float(gamma)
        self.scale = scale
        self.eps = eps
        self.anchor_key: AnchorKey = anchor_key or observation_key

    @property
    def root_branches(self) -> int:  # type: ignore[override]
        return self.group_size

    def advantage_options(self) -> dict[str, Any]:
        return {
            "step_weight": self.step_weight,
            "gamma": self.gamma,
            "scale": self.scale,
            "eps": self.eps,
            "anchor_key": self.anchor_key,
        }

    def config(self) -> dict[str, Any]:
        return {
            **super().config(),
            "group_size": self.group_size,
            "step_weight": self.step_weight,
            "gamma": self.gamma,
            "scale": self.scale,
        }


register_algorithm("gigpo", GiGPO)

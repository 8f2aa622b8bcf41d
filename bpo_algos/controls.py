"""Controls of the main job: algorithms whose outcome is known before the run.

A comparison that cannot tell these apart from a real learner cannot tell real learners apart
either (docs/main-job.md, "Controls"):

* ``frozen`` (positive control): any algorithm's collection (``of=``, default RLOO) with every
  advantage set to zero, so the loss and its gradient are exactly zero and the policy never
  leaves the warm start (Adam's step on a zero gradient is zero). It costs what ``of`` costs,
  learner passes included. The instrument must rank it below the comparator.
* ``reinforce`` (handicapped learner): RLOO's collection (``group_size`` trajectories per task)
  with REINFORCE's advantage ``A_i = R_i``, no baseline: unbiased, but with the variance the
  baseline removes. A comparison that resolves variance reduction ranks it below RLOO.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bpo_algos.advantages import as_batch, register_advantage
from bpo_algos.algorithm import Algorithm
from bpo_algos.checks import check_count
from bpo_algos.registry import algorithm_factory, factory_parameters, register_algorithm
from bpo_algos.tree import RolloutTree


def frozen(
    of: str = "rloo",
    *,
    group_size: int | None = None,
    backbones: int | None = None,
    branch_factor: int | None = None,
    entropy_quantile: float | None = None,
    max_branch_points: int | None = None,
    **options: Any,
) -> Algorithm:
    """The algorithm registered as ``of``, collecting as it does, with a zero loss.

    The shared options are passed on to ``of``'s factory where it names them (as the main job
    does for every algorithm)."""
    if of == "frozen":
        raise ValueError("frozen(of='frozen') would wrap itself; name the algorithm whose collection it uses")
    factory = algorithm_factory(of)
    accepted = factory_parameters(factory)
    shared = {
        "group_size": group_size, "backbones": backbones, "branch_factor": branch_factor,
        "entropy_quantile": entropy_quantile, "max_branch_points": max_branch_points,
    }
    options.update({k: v for k, v in shared.items() if v is not None and k in accepted})
    inner = factory(**options)
    inner.__class__ = _frozen_class(type(inner))
    inner.collects_as = of
    return inner


_FROZEN: dict[type, type] = {}


def _frozen_class(cls: type) -> type:
    if cls not in _FROZEN:

        def compute_advantages(self: Algorithm, trees: RolloutTree | Sequence[RolloutTree]) -> None:
            cls.compute_advantages(self, trees)  # the inner estimator's state (histories) advances as usual
            for tree in as_batch(trees):
                for edge in tree.edges():
                    edge.advantage = 0.0

        def config(self: Algorithm) -> dict[str, Any]:
            return {**cls.config(self), "frozen": True, "collects_as": getattr(self, "collects_as", None)}

        _FROZEN[cls] = type(
            f"Frozen{cls.__name__}", (cls,),
            {"name": "frozen", "compute_advantages": compute_advantages, "config": config, "unbiased": True, "__module__": __name__},
        )
    return _FROZEN[cls]


@register_advantage("reinforce")
def reinforce_estimator(trees: Sequence[RolloutTree]) -> None:
    """REINFORCE without a baseline: ``A_i = R_i`` (the return of the i-th trajectory from the
    root), copied to every step of trajectory ``i``."""
    for tree in as_batch(trees):
        for first in tree.root.children:
            stack = [first]
            while stack:
                edge = stack.pop()
                edge.advantage = float(first.q)
                stack.extend(edge.child.children)


class Reinforce(Algorithm):
    """REINFORCE over ``group_size`` independent trajectories per task, no baseline (a control)."""

    name = "reinforce"
    advantage_estimator = "reinforce"

    def __init__(self, group_size: int = 8, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.group_size = check_count("group_size", group_size, 1)

    @property
    def root_branches(self) -> int:  # type: ignore[override]
        return self.group_size

    def config(self) -> dict[str, Any]:
        return {**super().config(), "group_size": self.group_size}


register_algorithm("frozen", frozen)
register_algorithm("reinforce", Reinforce)

__all__ = ["Reinforce", "frozen", "reinforce_estimator"]

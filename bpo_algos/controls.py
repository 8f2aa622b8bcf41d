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
* ``rloo-2x`` (calibration control): RLOO with the comparator's options at twice the per-update
  budget (:attr:`~bpo_algos.algorithm.Algorithm.budget_multiple` = 2): its averaged gradient
  has half the variance of RLOO's at the same number of updates, so its difference to RLOO is
  what an estimator with half the variance at the same cost would buy. Where the instrument
  cannot detect it, it cannot see an effect of the size a halving of the variance implies.

All three are entry points of the ``bpo_algos.algorithms`` group (pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bpo_algos.advantages import as_batch, register_advantage
from bpo_algos.algorithm import Algorithm, Options
from bpo_algos.registry import algorithm_factory
from bpo_algos.tree import RolloutTree
from bpo_envs.validation import check_count


def frozen(of: str = "rloo", **options: Any) -> Algorithm:
    """The algorithm registered as ``of``, built with ``options`` and collecting as it does,
    with a zero loss (every advantage 0)."""
    if of == "frozen":
        raise ValueError("frozen(of='frozen') would wrap itself; name the algorithm whose collection it uses")
    inner = algorithm_factory(of)(**options)
    inner.__class__ = _frozen_class(type(inner))
    inner.collects_as = of
    return inner


frozen.options_of = lambda options: options.get("of", "rloo")  # type: ignore[attr-defined]
"""The algorithm whose preset options (``Preset.options``) a ``frozen`` run takes."""

_FROZEN: dict[type, type] = {}


def _frozen_class(cls: type) -> type:
    if cls not in _FROZEN:

        def compute_advantages(self: Algorithm, trees: RolloutTree | Sequence[RolloutTree]) -> None:
            cls.compute_advantages(self, trees)  # the inner estimator's state (histories) advances as usual
            for tree in as_batch(trees):
                for edge in tree.edges():
                    edge.advantage = 0.0

        def config(self: Algorithm) -> dict[str, Any]:
            return {**cls.config(self), "frozen": True, "collects_as": self.__dict__.get("collects_as")}

        _FROZEN[cls] = type(
            f"Frozen{cls.__name__}", (cls,),
            {"name": "frozen", "compute_advantages": compute_advantages, "config": config, "unbiased": True, "__module__": __name__},
        )
    return _FROZEN[cls]


CALIBRATION_MULTIPLE = 2.0
"""The calibration control's budget per update, in multiples of the comparison's."""


def rloo_2x(of: str = "rloo", **options: Any) -> Algorithm:
    """The algorithm registered as ``of`` (RLOO), built with ``options``, collecting
    :data:`CALIBRATION_MULTIPLE` times the per-update budget (the calibration control)."""
    inner = algorithm_factory(of)(**options)
    inner.budget_multiple = CALIBRATION_MULTIPLE
    return inner


rloo_2x.options_of = lambda options: options.get("of", "rloo")  # type: ignore[attr-defined]
"""The algorithm whose preset (and tuned) options a ``rloo-2x`` run takes."""


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


@dataclass
class ReinforceOptions(Options):
    """The REINFORCE control's own options."""

    group_size: int = 8
    """Independent trajectories per task from the root snapshot (RLOO's collection)."""

    def __post_init__(self) -> None:
        check_count("group_size", self.group_size, 1)


class Reinforce(Algorithm):
    """REINFORCE over ``group_size`` independent trajectories per task, no baseline (a control)."""

    name = "reinforce"
    Options = ReinforceOptions

    @property
    def root_branches(self) -> int:  # type: ignore[override]
        return self.options.group_size

    def estimator(self, trees: Sequence[RolloutTree]) -> tuple[str, dict[str, Any]]:
        return "reinforce", {}

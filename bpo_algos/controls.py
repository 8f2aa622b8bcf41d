"""Controls of the main job: algorithms whose outcome is known before the run.

A comparison that cannot tell these apart from a real learner cannot tell real learners apart
either (docs/main-job.md, "Controls"):

* ``frozen`` (positive control): any algorithm's collection (``of=``, default RLOO) with every
  advantage set to zero, so the loss and its gradient are exactly zero and the policy never
  leaves the warm start (Adam's step on a zero gradient is zero). It is charged what ``of``'s
  budget is; the main job collects its first update only (:attr:`Frozen.zero_loss`, docs/main-job.md,
  "Scheduling"). The instrument must rank it below the comparator.
* ``reinforce`` (handicapped learner): RLOO's collection (``group_size`` trajectories per task)
  with REINFORCE's advantage ``A_i = R_i``, no baseline: unbiased, but with the variance the
  baseline removes. A comparison that resolves variance reduction ranks it below RLOO.
* ``rloo-2x`` (calibration control): RLOO with the comparator's options at twice the per-update
  budget (:attr:`~bpo_algos.algorithm.Algorithm.budget_multiple` = 2): its averaged gradient
  has half the variance of RLOO's at the same number of updates, so its difference to RLOO is
  what an estimator with half the variance at the same cost would buy. Where the instrument
  cannot detect it, it cannot see an effect of the size a halving of the variance implies.

All three are entry points of the ``bpo_algos.algorithms`` group (pyproject.toml). ``frozen``
and ``rloo-2x`` are :class:`Control` factories: each declares the algorithm it wraps
(``--frozen.of``, default ``rloo``), whose options it takes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from bpo_algos.advantages import as_batch, register_advantage
from bpo_algos.algorithm import Algorithm, Batch, Options
from bpo_algos.paths import PathState
from bpo_algos.policy.base import Policy
from bpo_algos.registry import AlgorithmFactory, algorithm_factory
from bpo_algos.rollout import EnvFn, EnvPool
from bpo_algos.tree import Node, RolloutTree
from bpo_envs.validation import check_count


def _zero_advantages(trees: RolloutTree | Sequence[RolloutTree]) -> None:
    for tree in as_batch(trees):
        for edge in tree.edges():
            edge.advantage = 0.0


class Frozen(Algorithm):
    """The positive control: ``inner``'s collection (its topology, budget, seeds and estimator
    state, all advancing as usual) with every advantage set to zero, so the loss is zero.

    Every hook the engine or the trainer calls is ``inner``'s; only :meth:`compute_advantages`
    (and so :meth:`collect`), :attr:`name`, :attr:`zero_loss` and :meth:`config` differ.
    """

    name = "frozen"
    unbiased = True

    def __init__(self, inner: Algorithm, collects_as: str) -> None:
        self.inner = inner
        self.collects_as = collects_as
        self.options = inner.options
        self.shared = inner.shared
        self.seed = inner.seed
        self.last_loss_stats: dict[str, float] = {}

    # ---- the inner algorithm's topology ------------------------------------------------------
    @property
    def root_branches(self) -> int:  # type: ignore[override]
        return self.inner.root_branches

    @property
    def trees_per_task(self) -> int:  # type: ignore[override]
        return self.inner.trees_per_task

    @property
    def snapshot_nodes(self) -> bool:  # type: ignore[override]
        return self.inner.snapshot_nodes

    @property
    def threshold(self) -> float | None:  # type: ignore[override]
        return self.inner.threshold

    @property
    def budget_multiple(self) -> float:  # type: ignore[override]
        return self.inner.budget_multiple

    @property
    def zero_loss(self) -> bool:  # type: ignore[override]
        """True without a KL term: each step's surrogate ``-min(r A, clip(r) A)`` is 0 at ``A = 0``.
        With ``kl_coef > 0`` the loss is the KL to the reference, zero only while the policy is
        the reference (and then only up to the reference's precision): False."""
        return not self.shared.kl_coef

    def wants_entropy(self, path: PathState) -> bool:
        return self.inner.wants_entropy(path)

    def fork_count(self, path: PathState, entropy: float | None) -> int:
        return self.inner.fork_count(path, entropy)

    def draws_distinct(self, path: PathState) -> bool:
        return self.inner.draws_distinct(path)

    def expansions(self, tree: RolloutTree, round: int) -> Sequence[Node]:
        return self.inner.expansions(tree, round)

    def tree_prior(self, step_limit: int) -> dict[str, float]:
        return self.inner.tree_prior(step_limit)

    def finish_trees(self, trees: list[RolloutTree]) -> None:
        self.inner.finish_trees(trees)

    # ---- the zero estimate -------------------------------------------------------------------
    def estimator(self, trees: Sequence[RolloutTree]) -> tuple[str, dict[str, Any]]:
        return self.inner.estimator(trees)

    def compute_advantages(self, trees: RolloutTree | Sequence[RolloutTree]) -> None:
        self.inner.compute_advantages(trees)  # the inner estimator's state (histories) advances as usual
        _zero_advantages(trees)

    def collect(self, policy: Policy, env_fns: Sequence[EnvFn] | EnvPool, tasks: Sequence[Any], budget: Any = None, *,
                seed: int | None = None, tree_indices: Iterable[int] | None = None, finish: bool = True) -> Batch:
        """``inner``'s batch with every advantage zero (:meth:`Algorithm.collect`)."""
        batch = self.inner.collect(policy, env_fns, tasks, budget, seed=seed, tree_indices=tree_indices, finish=False)
        return self._as_own(batch, finish)

    def collect_together(self, policy: Policy, pools: Sequence[EnvPool], tasks: Sequence[Any], budget: Any = None, *,
                         finish: bool = True) -> list[Batch]:
        """``inner``'s batches with every advantage zero (:meth:`Algorithm.collect_together`)."""
        return [self._as_own(batch, finish) for batch in self.inner.collect_together(policy, pools, tasks, budget, finish=False)]

    def _as_own(self, batch: Batch, finish: bool) -> Batch:
        """``inner``'s unfinished ``batch`` as this control's: every advantage zero, labelled
        with this control's name, ended (``finish``) as :meth:`end_batch` ends it."""
        _zero_advantages(batch.trees)
        batch.algorithm = self.name
        for tree in batch.trees:
            tree.algorithm = self.name
        if finish:
            self.end_batch(batch)
        return batch

    def end_batch(self, batch: Batch) -> None:
        self.inner.end_batch(batch)

    # ---- checkpoints and logs ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)

    def config(self) -> dict[str, Any]:
        return {**self.inner.config(), "frozen": True, "collects_as": self.collects_as}


@dataclass
class ControlOptions(Options):
    """The options of a control that collects as another algorithm (``frozen``, ``rloo-2x``)."""

    of: str = "rloo"
    """The registered algorithm whose collection the control uses; the control takes that
    algorithm's options (``--KIND.OPTION`` of its kind)."""


class Control(AlgorithmFactory):
    """The factory of a control that wraps another registered algorithm (:attr:`ControlOptions.of`),
    built with the options of that algorithm; a subclass says what it makes of it
    (:meth:`wrap`)."""

    Options = ControlOptions

    def wraps(self, options: Options) -> str:
        if not isinstance(options, ControlOptions):
            raise TypeError(f"the {self.kind} control's options are a ControlOptions, got {type(options).__name__}")
        return options.of

    def __call__(self, of: str = "rloo", **options: Any) -> Algorithm:
        if of == self.kind:
            raise ValueError(f"{self.kind}(of={of!r}) would wrap itself; name the algorithm whose collection it uses")
        return self.wrap(algorithm_factory(of)(**options), of)

    def wrap(self, inner: Algorithm, of: str) -> Algorithm:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class FrozenControl(Control):
    """``frozen``: the algorithm registered as ``of``, built with ``options`` and collecting as it
    does, with a zero loss (every advantage 0: :class:`Frozen`)."""

    kind = "frozen"

    def wrap(self, inner: Algorithm, of: str) -> Algorithm:
        return Frozen(inner, of)


CALIBRATION_MULTIPLE = 2.0
"""The calibration control's budget per update, in multiples of the comparison's."""


class CalibrationControl(Control):
    """``rloo-2x``: the algorithm registered as ``of`` (RLOO), built with ``options``, collecting
    :data:`CALIBRATION_MULTIPLE` times the per-update budget (the calibration control)."""

    kind = "rloo-2x"

    def wrap(self, inner: Algorithm, of: str) -> Algorithm:
        inner.budget_multiple = CALIBRATION_MULTIPLE
        return inner


frozen = FrozenControl()
rloo_2x = CalibrationControl()


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

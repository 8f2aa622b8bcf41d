"""Tuning fixed in advance: every algorithm's shape options chosen by one protocol before the run.

``bpo-compare --tune`` (``Preset.tuning``, a :class:`TuningConfig`) chooses, per env and per
kind of algorithm in the comparison (``bpo``, ``rloo``, ``grpo``, ...), one candidate of a
fixed grid of its shape options (docs/main-job.md, "Tuning"):

* the grids have the same number of candidates for every tuned algorithm (unless
  ``allow_unequal_grids``): RLOO / GRPO / GiGPO group size {2, 4, 8, 16}; BPO four shapes of
  backbones x branch factor x branch points x nesting (:data:`DEFAULT_GRIDS`);
* each candidate trains from the warm start on the *tuning seeds* (disjoint from the evaluation
  seeds: an error otherwise) exactly as a run of the comparison does;
* the criterion, fixed before the run, is the AUC of its evaluated success (the comparison's
  primary metric's formula, :func:`~bpo_experiments.stats.curve_metrics`) on *held-out
  training tasks*: tasks of the training env after the training tasks, never an evaluation
  task (:func:`tuning_tasks` checks it). A candidate replaces the defaults (the preset's
  options of that kind) only *where the tuning tells it apart from them*: its mean over the
  tuning seeds is above theirs at ``TuningConfig.alpha`` (a t-test on the candidates' pooled
  within-candidate variance, Holm-adjusted over the candidates); of those, the highest mean is
  chosen. Otherwise the defaults are kept, and the record says so, with the one-way F-test
  across the candidates and the smallest candidate difference this tuning could have detected
  (:func:`decide`);
* the controls take their algorithm's choice (``frozen`` and ``rloo-2x`` collect as the tuned
  RLOO); the treatment and the comparator are also run at their defaults on the evaluation
  seeds, a secondary row beside the tuned headline.

Everything a bad setting would waste is checked before any run (:func:`check_tuning`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from bpo_algos.algorithm import Options
from bpo_experiments.significance import choose_candidate

CRITERIA = ("auc",)
"""The tuning criteria: ``auc`` of evaluated success on held-out training tasks."""

DEFAULT_GRIDS: dict[str, tuple[dict[str, Any], ...]] = {
    "rloo": tuple({"group_size": n} for n in (2, 4, 8, 16)),
    "grpo": tuple({"group_size": n} for n in (2, 4, 8, 16)),
    "gigpo": tuple({"group_size": n} for n in (2, 4, 8, 16)),
    "bpo": (
        {"backbones": 2, "branch_factor": 4, "max_branch_points": 1, "max_depth": 1},  # the defaults
        {"backbones": 4, "branch_factor": 2, "max_branch_points": 3, "max_depth": 1},  # more backbones, more forks
        {"backbones": 2, "branch_factor": 2, "max_branch_points": 2, "max_depth": 2},  # nested
        {"backbones": 8, "branch_factor": 2, "max_branch_points": 1, "max_depth": 1},  # wide, thin forks
    ),
}
"""Each kind of algorithm's candidates (its own options, over the preset's), four each."""


def _default_grids() -> dict[str, tuple[dict[str, Any], ...]]:
    return copy.deepcopy(DEFAULT_GRIDS)


@dataclass
class TuningConfig:
    """The tuning protocol of a comparison (module docstring)."""

    seeds: tuple[int, ...] = (1000, 1001)
    """Tuning seeds: each candidate trains once per seed; none may be an evaluation seed."""
    grids: dict[str, tuple[dict[str, Any], ...]] = field(default_factory=_default_grids)
    """Candidates per kind of algorithm (its options class's owner name: ``bpo``, ``rloo``, ...)."""
    criterion: str = "auc"
    """``auc``: area under the evaluated-success curve against compute on held-out training tasks."""
    tasks: int = 64
    """Held-out training tasks the criterion evaluates on (fewer when the env has fewer)."""
    episodes: int = 1
    """Episodes per held-out task at each evaluation."""
    envs: tuple[str, ...] | None = None
    """The envs tuned (None: every env of the comparison); the others run at the preset's options
    (``--envs alfworld`` with the cpu preset: nothing is tuned)."""
    allow_unequal_grids: bool = False
    """Allow grids of different sizes (a bigger grid favours its algorithm: the maximum of more
    noisy scores)."""
    alpha: float = 0.05
    """The level of the F-test across the candidates: a choice is made only when it rejects
    (otherwise the defaults are kept)."""
    default_seeds: int | None = None
    """The secondary row (the treatment and the comparator at their untuned defaults) runs on
    the first this many evaluation seeds (None: all); a default equal to the tuned choice reuses
    the tuned runs."""
    pinned: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Options the user fixed, per kind (``{"rloo": {"group_size": 2}}``; a ``--KIND.OPTION``
    flag pins its option): tuning never replaces them, it tunes the rest of the grid
    (:meth:`grid`), and the report's tuning table names them as fixed by the user."""

    def tunes(self, env: str) -> bool:
        return self.envs is None or env in self.envs

    def grid(self, kind: str) -> tuple[dict[str, Any], ...]:
        """``kind``'s candidates with its pinned options taken out, each distinct candidate once
        (the first's order): every option in the grid pinned leaves one candidate, ``{}``."""
        pinned = self.pinned.get(kind, {})
        out: list[dict[str, Any]] = []
        for candidate in self.grids[kind]:
            free = {k: v for k, v in candidate.items() if k not in pinned}
            if free not in out:
                out.append(free)
        return tuple(out)


def tuned_kinds(preset: Any, option_classes: dict[str, type[Options]], kind_of: dict[str, str | None]) -> list[str]:
    """The kinds of algorithm tuned: those of the comparison's algorithms (``kind_of``: the
    registered name to the kind whose options it takes, controls included) that have a grid,
    in the comparison's order, each once."""
    grids = preset.tuning.grids
    kinds: list[str] = []
    for name in preset.algorithms:
        kind = kind_of.get(name)
        if kind is not None and kind in grids and kind in option_classes and kind not in kinds:
            kinds.append(kind)
    return kinds


def check_tuning(preset: Any, option_classes: dict[str, type[Options]], kind_of: dict[str, str | None],
                 seeds: dict[str, Sequence[int]]) -> list[str]:
    """Refuse a tuning setting that would waste or bias the run, before any run; returns the
    tuned kinds (``seeds``: each env's evaluation seeds). Errors (``ValueError``): an unknown criterion, a tuning seed that is also an
    evaluation seed, an empty grid, grids of different sizes (without
    ``allow_unequal_grids``), an algorithm (not a control) without a grid beside tuned ones, a
    candidate naming an option its algorithm does not have or a value it refuses, a pinned option
    its kind does not have. A tuned env left out of the comparison (``--envs``) is simply not
    run. The equal-size rule reads the grids as given: a pin that shrinks a grid is the user's
    choice, shown in the report."""
    t = preset.tuning
    if t.criterion not in CRITERIA:
        raise ValueError(f"tuning criterion {t.criterion!r}: one of {', '.join(CRITERIA)}")
    if not t.seeds:
        raise ValueError("tuning needs at least one tuning seed (--tuning-seeds)")
    if t.tasks < 1 or t.episodes < 1:
        raise ValueError(f"tuning needs >= 1 held-out task and episode, got tasks={t.tasks}, episodes={t.episodes}")
    for env in preset.envs:
        if not t.tunes(env):
            continue
        shared = sorted(set(t.seeds) & set(seeds[env]))
        if shared:
            raise ValueError(f"tuning seed(s) {shared} are also evaluation seeds of {env}: the tuning seeds must be disjoint "
                             "from the evaluation seeds (--tuning-seeds)")
    for kind, grid in t.grids.items():
        if len(grid) == 0:
            raise ValueError(f"the tuning grid of {kind!r} is empty: give it at least one candidate")
    kinds = tuned_kinds(preset, option_classes, kind_of)
    controls = {preset.positive_control, preset.handicapped_control, preset.calibration_control}
    untuned = [a for a in preset.algorithms if a not in controls and kind_of.get(a) not in kinds]
    if untuned and not t.allow_unequal_grids:
        raise ValueError(f"{untuned} would run untuned beside tuned algorithms (no tuning grid for their kind): give them a grid "
                         "(--tuning-grid KIND=JSON), pass --no-tune, or --allow-unequal-grids")
    if not kinds:
        raise ValueError(f"no algorithm of the comparison ({list(preset.algorithms)}) has a tuning grid (grids: {sorted(t.grids)})")
    sizes = {k: len(t.grids[k]) for k in kinds}
    if len(set(sizes.values())) > 1 and not t.allow_unequal_grids:
        raise ValueError(f"tuning grids of different sizes {sizes}: a bigger grid favours its algorithm; give every tuned "
                         "algorithm as many candidates, or pass --allow-unequal-grids")
    for kind, options in t.pinned.items():
        cls = option_classes.get(kind)
        if cls is None:
            raise ValueError(f"pinned options of {kind!r}: no algorithm kind of that name (kinds: {sorted(option_classes)})")
        unknown = sorted(set(options) - set(cls.field_names()))
        if unknown:
            raise ValueError(f"pinned options {options} of {kind!r}: {unknown} are not {cls.__name__} fields")
    for kind in kinds:
        cls = option_classes[kind]
        for candidate in t.grids[kind]:
            unknown = sorted(set(candidate) - set(cls.field_names()))
            if unknown:
                raise ValueError(f"tuning candidate {candidate} of {kind!r}: {unknown} are not {cls.__name__} fields")
            try:
                cls(**candidate)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"tuning candidate {candidate} of {kind!r}: {exc}") from exc
    return kinds


def tuning_tasks(order: Sequence[Any], train_tasks: Sequence[Any], eval_tasks: Sequence[Any], count: int) -> list[Any]:
    """The criterion's held-out training tasks: the first ``count`` of the training env's task
    order (``order``) that are neither training nor evaluation tasks. Raises when there is none,
    and never returns an evaluation task."""
    excluded = {repr(t) for t in train_tasks} | {repr(t) for t in eval_tasks}
    held_out = [t for t in order if repr(t) not in excluded][:count]
    if not held_out:
        raise ValueError(f"no held-out training task for tuning ({len(order)} tasks, {len(train_tasks)} train, "
                         f"{len(eval_tasks)} evaluation): lower train_tasks or eval_tasks")
    return held_out


def candidate_options(base: Options, candidate: dict[str, Any]) -> Options:
    """``base`` (the preset's options of the kind, or its defaults) with ``candidate``'s fields."""
    return replace(base, **candidate)


def choose(scores_per_seed: Sequence[Sequence[float]]) -> tuple[int, list[float]]:
    """``(index, means)``: the candidate with the highest mean score over the tuning seeds (the
    first on a tie), and every candidate's mean."""
    means = [float(np.mean(s)) for s in scores_per_seed]
    return int(np.argmax(means)), means


def default_candidate(base: Options, grid: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The untuned options ``base`` written as a candidate: its values of every field the grid
    tunes."""
    fields = [k for candidate in grid for k in candidate]
    return {k: getattr(base, k) for k in dict.fromkeys(fields)}


def decide(scores_per_seed: Sequence[Sequence[float]], grid: Sequence[dict[str, Any]], base: Options,
           alpha: float = 0.05) -> dict[str, Any]:
    """The tuning's choice and the power behind it (``per_env[env]["tuning"][kind]``), by
    :func:`~bpo_experiments.significance.choose_candidate`:

    * ``f_test``: the one-way F-test across the candidates (one group per candidate, its tuning
      seeds the replicates): ``F``, ``dof``, ``p``, their ``spread`` (the best mean minus the
      worst) and ``detectable_difference`` (the smallest difference of two candidates' means it
      detects with 80% power);
    * ``vs_default``: where the defaults (``base``) are a candidate of the grid, every candidate
      against them (t-tests on the pooled within-candidate variance, Holm-adjusted);
      ``distinguishable``: some candidate beats them detectably. Then ``chosen`` is the highest
      mean of those; otherwise ``kept_defaults`` is True and ``chosen`` is the defaults: the
      grid's candidate equal to them (``chosen_index``). Where the defaults are not a candidate,
      the F-test decides (the highest mean when it rejects), else ``base`` written as a candidate
      (:func:`default_candidate`; ``chosen_index`` None);
    * ``best_index``: the highest mean either way; ``decision``: the sentence the report prints.
    """
    best, means = choose(scores_per_seed)
    defaults = default_candidate(base, grid)
    index = next((i for i, c in enumerate(grid) if default_candidate(replace(base, **c), grid) == defaults), None)
    decision = choose_candidate(scores_per_seed, index, alpha)
    test, versus = decision["f_test"], decision["vs_default"]
    out: dict[str, Any] = {"scores": means, "best_index": best, "f_test": test, "vs_default": versus,
                           "distinguishable": decision["distinguishable"], "detectable_difference": test["detectable_difference"]}
    if not decision["kept_default"]:
        chosen = decision["chosen"]
        if versus is not None:
            row = next(r for r in versus["comparisons"] if r["index"] == chosen)
            why = (f"a candidate beats the defaults detectably (+{row['diff']:.3g}, Holm-adjusted p "
                   f"{row['p_holm']:.3g} < {alpha}): the highest mean of those is chosen")
        else:
            why = f"the candidates differ (F-test p {test['p']:.3g} < {alpha}): the highest mean is chosen"
        return {**out, "chosen": grid[chosen], "chosen_index": chosen, "kept_defaults": False, "decision": why}
    if index is not None:
        defaults = dict(grid[index])  # the defaults as the grid writes them
    if test["p"] is None:
        why = (f"no test across the candidates is possible ({test['dof'][1]} degrees of freedom within them: "
               "give at least 2 tuning seeds)")
    elif versus is not None:
        tested = [r["p_holm"] for r in versus["comparisons"] if r["p_holm"] is not None]
        why = (f"the candidates could not be told apart from the defaults (no candidate above them at Holm-adjusted "
               f"p < {alpha}; the smallest {min(tested):.3g}; F-test across all p {test['p']:.3g}, their spread "
               f"{test['spread']:.3g}, the smallest difference this tuning could detect {test['detectable_difference']:.3g})")
    else:
        why = (f"the candidates could not be told apart (F-test p {test['p']:.3g} >= {alpha}; their spread "
               f"{test['spread']:.3g}, the smallest difference this tuning could detect {test['detectable_difference']:.3g})")
    return {**out, "chosen": defaults, "chosen_index": index, "kept_defaults": True, "decision": why + ": the defaults are kept"}


def label(kind: str, index: int) -> str:
    """The run label of candidate ``index`` of ``kind`` (``bpo@tune2``)."""
    return f"{kind}@tune{index}"


DEFAULTS_SUFFIX = "@default"
"""Run label suffix of the untuned treatment and comparator (the secondary row)."""

"""``bpo-regime``: where branching pays, mapped on exact TreeMDPs (docs/regime.md).

A *cell* is a TreeMDP (``observe="state"``, so every value is exact by dynamic programming), a
pretrained-agent prior (:meth:`~bpo_envs.tree_mdp.TreeMDPEnv.agent_prior`) and a number of tasks
per update. The cells vary one axis at a time from a base setting: where the outcome is decided,
the horizon, reward sparsity, slip, early-decision entropy and tasks per update.

In every cell:

1. **tuning** (seeds disjoint from the evaluation seeds): every configuration (RLOO and GRPO at
   each group size, BPO's tree shapes) trains ``updates`` updates at a fixed env-step budget per
   update; per kind (independent, BPO shape, RLOO group size) a candidate replaces the kind's
   default (:data:`DEFAULT_CHOICE`) only where its AUC is above the default's at ``p < 0.05``
   (t-tests against the default on the pooled variance, Holm-adjusted; the highest mean of
   those), the main job's rule (:func:`~bpo_experiments.tuning.decide`; :func:`choose_config`);
2. **evaluation**: the two chosen train on ``seeds`` seeds at matched env steps and at matched
   flops (the flops RLOO-4 spends on the same env-step budget at the prior); each run's curve is
   the exact expected return over all the cell's tasks after every update (no evaluation
   noise), its AUC the curve's mean after update 0. Reported: BPO minus the best independent,
   paired by seed, with its 95% interval and the paired t-test's ``p``;
3. **mechanism and variance** at the prior, at the same env-step budget: on each of at least
   ``MIN_VARIANCE_SEEDS`` *variance seeds*, ``variance_batches`` gradient batches of each BPO
   shape and of RLOO at its best group size give one ratio ``tr Cov(g_BPO) / tr Cov(g_RLOO)``;
   the measured ratio is their geometric mean with its 95% interval over the seeds. Beside it,
   :func:`~bpo_algos.mechanism.predict_variance_ratio` of the mechanism
   (:func:`bpo_algos.mechanism.measure`) on the batches of other seeds, the *predictor seeds*
   (with the task-sampling share computed from the exact per-task gradients): the prediction is
   made out of sample, and nothing in it is fitted.

Over the map's cells, the verdicts (``win``, ``loss``, ``tie`` at matched env steps) are taken
after Holm's adjustment over the cells (``matched[unit]["p_holm"]``), and the predictor's
Spearman rank correlation with the measured ratios has a bootstrap interval. ``--replicate``
runs the whole map a second time on disjoint seeds (every kind: tuning, evaluation, variance,
predictor; :func:`map_seeds`) and records in ``regime.json["replication"]`` both runs' seeds and
verdicts, the share of cells whose verdicts agree and the cells called a win in one run and a
loss in the other, and beside them whether the runs' estimates agree, the estimates pooled over
both runs and the agreement the runs' power allows (:func:`replication_estimates`;
docs/regime.md, "Method"). Writes ``regime.json``, ``regime.md`` and ``regime.png`` to
``--out``::

    bpo-regime --quick --out /tmp/regime                       # about 35 s of CPU
    bpo-regime --quick --replicate --out /tmp/regime           # the same twice: about 65 s
    nice -n 5 bpo-regime --replicate --seed-block 2 --out docs/results/regime  # the full map, twice, on seeds blocks 2-3
    bpo-regime --render --out docs/results/regime              # its summary again from regime.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from baselines import GRPO, RLOO
from bpo_algos import BPO, Budget, TabularPolicy
from bpo_algos.algorithm import Algorithm, Batch
from bpo_algos.diagnostics import flat_gradient
from bpo_algos.mechanism import measure, predict_variance_ratio
from bpo_algos.rollout import EnvPool
from bpo_envs.console import ends_on_ctrl_c
from bpo_envs.files import atomic_write
from bpo_envs.tree_mdp import TreeMDPEnv
from bpo_experiments.significance import (
    choose_candidate,
    holm,
    mean_ci,
    paired_p_value,
    power,
    welch_p_value,
)
from bpo_experiments.stats import paired_difference
from bpo_experiments.streams import PROBE, TRAINING, TUNING, stream_seed

COMMON: dict[str, Any] = {"aggregation": "step-sum"}
CONFIGS: dict[str, Callable[[int], Algorithm]] = {
    "rloo-2": lambda seed: RLOO(group_size=2, seed=seed, **COMMON),
    "rloo-4": lambda seed: RLOO(group_size=4, seed=seed, **COMMON),
    "rloo-8": lambda seed: RLOO(group_size=8, seed=seed, **COMMON),
    "grpo-4": lambda seed: GRPO(group_size=4, seed=seed, **COMMON),
    "grpo-8": lambda seed: GRPO(group_size=8, seed=seed, **COMMON),
    "bpo-2x4-q0.8": lambda seed: BPO(backbones=2, branch_factor=4, entropy_quantile=0.8, seed=seed, **COMMON),
    "bpo-4x2-q0.8": lambda seed: BPO(backbones=4, branch_factor=2, entropy_quantile=0.8, seed=seed, **COMMON),
    "bpo-2x4-q0.95": lambda seed: BPO(backbones=2, branch_factor=4, entropy_quantile=0.95, seed=seed, **COMMON),
}
QUICK_CONFIGS = ("rloo-2", "rloo-4", "grpo-4", "bpo-2x4-q0.95", "bpo-4x2-q0.8")
GROUP_SIZE = {"rloo-2": 2, "rloo-4": 4, "rloo-8": 8}
SHAPES = {"bpo-2x4-q0.8": (2, 4), "bpo-4x2-q0.8": (4, 2), "bpo-2x4-q0.95": (2, 4)}
DEFAULT_CHOICE = {"independent": "rloo-4", "bpo": "bpo-2x4-q0.95", "rloo": "rloo-4"}
"""What a cell compares when its tuning cannot tell a kind's candidates apart: RLOO at the CPU
preset's group size (4); BPO with 2 backbones x 4 siblings forking above the 0.95 entropy
quantile, the shape the committed maps' tuning put first in 11 of 13 cells (on tuning seeds only,
no evaluation seed; docs/regime.md, "Method"). With BPO's option default (0.8) as the default, the
two runs of a map chose differently where 0.95 was ahead by less than the tuning could detect,
and their verdicts differed there."""
MIN_VARIANCE_SEEDS = 5
"""A measured variance ratio comes from at least this many seeds (docs/regime.md, "Method")."""
ALPHA = 0.05
"""The family-wise error rate of a map's verdicts (Holm over its cells)."""


@dataclass(frozen=True)
class MapSeeds:
    """The seeds one map runs on: identifiers from which a run's random streams are derived (its
    task draws from ``SeedSequence([seed, ...])``, the engine's and the algorithm's seeds), so
    two maps on disjoint identifiers draw different streams."""

    evaluation: tuple[int, ...]
    """The matched-compute runs' seeds."""
    tuning: tuple[int, ...]
    """The tuning runs' seeds (disjoint from the evaluation seeds)."""
    variance: tuple[int, ...]
    """The gradient batches whose variances give the measured ratios (one ratio per seed)."""
    predictor: tuple[int, ...]
    """The gradient batches the predictor reads (mechanism, task share): disjoint from
    ``variance``, so the prediction is made out of sample."""


def map_seeds(args: argparse.Namespace, run: int) -> MapSeeds:
    """Seed block ``run``'s seeds (with ``--seed-block 0``, 0: the unreplicated map's; 1: the
    replication's): the ``run``-th block of identifiers of each kind, so no two blocks share a seed."""
    def block(n: int) -> tuple[int, ...]:
        return tuple(range(run * n, (run + 1) * n))

    gradient = block(args.variance_seeds + args.predictor_seeds)
    return MapSeeds(
        evaluation=block(args.seeds),
        tuning=tuple(tuning_seed(s) for s in block(args.tuning_seeds)),
        variance=gradient[: args.variance_seeds],
        predictor=gradient[args.variance_seeds:],
    )


def tuning_seed(s: int) -> int:
    """Tuning run ``s``'s seed: the key ``(s, tuning)``, disjoint from every evaluation seed's streams."""
    return stream_seed(s, TUNING)


@dataclass(frozen=True)
class Cell:
    """One point of the map: a TreeMDP, the agent prior's settings and tasks per update."""

    name: str
    axis: str
    value: str
    env: dict[str, Any]
    prior: dict[str, float] = field(default_factory=dict)
    tasks_per_update: int = 4

    def make_env(self) -> TreeMDPEnv:
        return TreeMDPEnv(observe="state", **self.env)

    @property
    def budget_steps(self) -> int:
        """Env steps per update: four independent episodes per task of the update."""
        return 4 * self.tasks_per_update * self.env["depth"]


BASE: dict[str, Any] = {"depth": 12, "n_actions": 3, "seed": 0, "decisive_levels": (8,), "n_tasks": 8}


def cells(quick: bool = False) -> list[Cell]:
    """The map's cells: the base and one-axis variations of it."""
    def with_(**kwargs: Any) -> dict[str, Any]:
        return {**BASE, **kwargs}

    grid = [
        Cell("base", "base", "decided 2/3, depth 12, dense, no slip, T=4", with_()),
        Cell("decided-first", "decided", "level 1 of 12", with_(decisive_levels=(1,))),
        Cell("decided-1/3", "decided", "level 4 of 12", with_(decisive_levels=(4,))),
        Cell("decided-last", "decided", "level 11 of 12", with_(decisive_levels=(11,))),
        Cell("horizon-6", "horizon", "depth 6 (decided at 4)", with_(depth=6, decisive_levels=(4,))),
        Cell("horizon-24", "horizon", "depth 24 (decided at 16)", with_(depth=24, decisive_levels=(16,))),
        Cell("binary", "reward", "binary, base success 1/3", with_(reward="binary", success_rate=1 / 3)),
        Cell("binary-sparse", "reward", "binary, 2 decisions, success 1/9", with_(decisive_levels=(5, 8), reward="binary", success_rate=1 / 9)),
        Cell("slip-0.1", "slip", "slip 0.1", with_(slip=0.1)),
        Cell("slip-0.3", "slip", "slip 0.3", with_(slip=0.3)),
        Cell("early-random", "early entropy", "routine steps before the decision uniform", with_(), {"early_confidence": 0.0}),
        Cell("tasks-2", "tasks per update", "T=2", with_(), tasks_per_update=2),
        Cell("tasks-8", "tasks per update", "T=8", with_(), tasks_per_update=8),
    ]
    if quick:
        keep = ("base", "decided-first", "binary")
        grid = [c for c in grid if c.name in keep]
    return grid


# ---- one run ------------------------------------------------------------------------------
def prior_policy(cell: Cell) -> TabularPolicy:
    policy = TabularPolicy.from_logits(cell.make_env().agent_prior(**cell.prior))
    for p in policy.parameters():
        p.requires_grad_(True)
    return policy


def exact_return(env: TreeMDPEnv, policy: TabularPolicy) -> float:
    """The mean over every task of the exact expected return."""
    with torch.no_grad():
        return float(np.mean([float(env.expected_return(policy.log_probs, t)) for t in range(env.n_tasks)]))


def task_draws(cell: Cell, seed: int, n: int, stream: int = 0) -> list[list[int]]:
    """The tasks of each of ``n`` updates (the same for every configuration of a seed): stream 0
    for training, stream 1 for the gradient batches, each its own ``SeedSequence`` key."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x7265, *([stream] if stream else [])]))
    return [rng.choice(cell.env["n_tasks"], cell.tasks_per_update, replace=False).tolist() for _ in range(n)]


def train(cell: Cell, config: str, seed: int, budget: Budget, updates: int, lr: float, pool: EnvPool) -> dict[str, Any]:
    """One training run: the exact expected-return curve and what it spent."""
    env = cell.make_env()
    policy = prior_policy(cell)
    algorithm = CONFIGS[config](seed)
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    curve = [exact_return(env, policy)]
    spent: dict[str, float] = {"env_steps": 0.0, "flops": 0.0, "leaves": 0.0}
    for update, tasks in enumerate(task_draws(cell, seed, updates)):
        batch = algorithm.collect(policy, pool, tasks, budget, seed=stream_seed(seed, TRAINING, 0, update))
        optimizer.zero_grad()
        algorithm.loss(policy, batch).backward()
        optimizer.step()
        for unit in spent:
            spent[unit] += float(batch.compute.get(unit))
        curve.append(exact_return(env, policy))
    return {"curve": curve, "auc": float(np.mean(curve[1:])), "spent": spent}


# ---- gradients at the prior ----------------------------------------------------------------
def gradient_batches(cell: Cell, config: str, n: int, warmup: int, pool: EnvPool, seed: int = 0) -> tuple[np.ndarray, list[Batch]]:
    """``n`` gradient estimates (ascent direction) at the prior, each from one batch at the
    cell's env-step budget on freshly drawn tasks, and the batches (after ``warmup`` batches
    that set BPO's adaptive threshold)."""
    policy = prior_policy(cell)
    algorithm = CONFIGS[config](seed)
    budget = Budget("env_steps", cell.budget_steps)
    grads, batches = [], []
    draws = task_draws(cell, seed, n + warmup, stream=1)
    params = list(policy.parameters())
    for i, tasks in enumerate(draws):
        batch = algorithm.collect(policy, pool, tasks, budget, seed=stream_seed(seed, PROBE, 0, i))
        if i < warmup:
            continue
        for p in params:
            p.grad = None
        algorithm.loss(policy, batch).backward()
        grads.append(-flat_gradient(params).double().numpy())
        batches.append(batch)
    return np.stack(grads), batches


def task_gradient_spread(env: TreeMDPEnv, policy: TabularPolicy, tasks: Sequence[int]) -> float:
    """``tr Cov_t(grad J_t)`` over ``tasks`` at the policy (exact): the variance a batch gets
    from which tasks it holds (times ``(n - T) / ((n - 1) T)`` for ``T`` of ``n`` tasks)."""
    params = [p for p in policy.parameters() if p.requires_grad]
    rows = []
    for task in tasks:
        policy.zero_grad()
        env.expected_return(policy.log_probs, task).backward()
        rows.append(flat_gradient(params).double().numpy())
    policy.zero_grad()
    width = max(len(r) for r in rows)  # a policy may grow entries while enumerating
    g = np.stack([np.pad(r, (0, width - len(r))) for r in rows])
    return float(g.var(axis=0, ddof=0).sum())


def trace_variance(g: np.ndarray) -> float:
    """``tr Cov(g)`` of the rows of ``g`` (one gradient estimate a row; unbiased, ``ddof=1``)."""
    return float(g.var(axis=0, ddof=1).sum())


def ratio_over_seeds(ratios: Sequence[float | None]) -> dict[str, Any]:
    """One measured ratio from its per-seed values ``r_s``: the geometric mean
    ``exp(mean_s log r_s)`` with ``exp`` of the 95% t-interval of the mean log (the seeds are
    independent; the log makes a ratio and its inverse symmetric). Seeds without a ratio (no
    variance in the reference) are left out."""
    logs = [float(np.log(r)) for r in ratios if r is not None and r > 0 and np.isfinite(r)]
    if not logs:
        return {"measured_ratio": None, "measured_ratio_ci95": None, "measured_ratio_seeds": 0}
    mean, half = mean_ci(logs)
    return {"measured_ratio": float(np.exp(mean)),
            "measured_ratio_ci95": [float(np.exp(mean - half)), float(np.exp(mean + half))] if len(logs) > 1 else None,
            "measured_ratio_seeds": len(logs)}


def variance_study(cell: Cell, rloo: str, shapes: Sequence[str], n: int, pool: EnvPool, seeds: MapSeeds) -> dict[str, Any]:
    """Measured and predicted ``Var(g_BPO) / Var(g_RLOO)`` for each shape, with the mechanism.

    *Measured*, on the variance seeds: per seed ``s``, ``r_s = tr Cov(g_BPO) / tr Cov(g_RLOO)``
    over ``n`` batches of each (:func:`ratio_over_seeds` combines them). *Predicted*, on the
    predictor seeds: :func:`~bpo_algos.mechanism.predict_variance_ratio` of the mechanism
    measured on those seeds' BPO batches, with the task-sampling share against those seeds'
    RLOO variance. No batch of a measured ratio enters its prediction, and nothing is fitted:
    the prediction is out of sample."""
    reference = [gradient_batches(cell, rloo, n, 0, pool, s) for s in seeds.predictor]
    predictor_ref_var = float(np.mean([trace_variance(g) for g, _ in reference]))
    ref_mech = measure([b for _, batches in reference for b in batches])
    tasks, n_tasks = ref_mech.tasks_per_update, cell.env["n_tasks"]
    between = task_gradient_spread(cell.make_env(), prior_policy(cell), range(n_tasks)) * (n_tasks - tasks) / max((n_tasks - 1) * tasks, 1e-9)
    task_share = float(np.clip(between / predictor_ref_var, 0.0, 1.0)) if predictor_ref_var > 0 else 0.0
    ref_var = {s: trace_variance(gradient_batches(cell, rloo, n, 0, pool, s)[0]) for s in seeds.variance}
    out: dict[str, Any] = {"reference": rloo, "reference_trace_var": float(np.mean(list(ref_var.values()))), "task_share": task_share,
                           "reference_mechanism": ref_mech.to_json(), "batches_per_seed": n,
                           "seeds": {"variance": list(seeds.variance), "predictor": list(seeds.predictor)}, "shapes": {}}
    for shape in shapes:
        m = measure([b for s in seeds.predictor for b in gradient_batches(cell, shape, n, 2, pool, s)[1]])
        k0, k = SHAPES[shape]
        predicted = predict_variance_ratio(
            m, backbones=k0, branch_factor=k, group_size=GROUP_SIZE[rloo], independent_steps=cell.env["depth"],
            horizon=cell.env["depth"], task_share=task_share, independent_tasks_per_update=tasks,
        )
        per_seed = {s: (trace_variance(gradient_batches(cell, shape, n, 2, pool, s)[0]) / ref_var[s] if ref_var[s] > 0 else None)
                    for s in seeds.variance}
        out["shapes"][shape] = {
            **ratio_over_seeds(list(per_seed.values())),
            "measured_ratio_per_seed": list(per_seed.values()),
            "predicted_ratio": predicted,
            "mechanism": m.to_json(),
        }
    return out


# ---- the map -------------------------------------------------------------------------------
def choose_config(scores_per_seed: dict[str, Sequence[float]], default: str, alpha: float = ALPHA) -> dict[str, Any]:
    """One kind's tuning decision, the main job's rule
    (:func:`~bpo_experiments.significance.choose_candidate`) on the candidates' per-seed AUCs:
    ``chosen`` is the highest mean among the candidates that beat ``default`` detectably
    (``vs_default``), else ``default`` (``kept_default`` True); the F-test across them is
    recorded (``f_test``). Where ``default`` is not a candidate (a ``--quick`` grid), the
    highest mean is taken. Switching on the F-test alone took
    the highest of near-equal leaders (RLOO-4, GRPO-4, RLOO-2) whenever RLOO-8 was clearly worse:
    a different comparator in each run of the map (docs/regime.md, "Method")."""
    names = list(scores_per_seed)
    decision = choose_candidate([scores_per_seed[n] for n in names], names.index(default) if default in names else None, alpha)
    best = names[decision["best"]]
    chosen = best if default not in names else names[decision["chosen"]]
    versus = decision["vs_default"]
    if versus is not None:
        versus = {**versus, "default": default,
                  "comparisons": [{**r, "index": names[r["index"]]} for r in versus["comparisons"]],
                  "better": [names[i] for i in versus["better"]]}
    return {"chosen": chosen, "best": best, "kept_default": chosen == default, "f_test": decision["f_test"],
            "vs_default": versus}


def run_cell(cell: Cell, args: argparse.Namespace, configs: Sequence[str], seeds: MapSeeds) -> dict[str, Any]:
    """One cell of the map on ``seeds`` (module docstring: tuning, evaluation, variance)."""
    start = time.perf_counter()
    pool = EnvPool([cell.make_env, cell.make_env])
    steps = Budget("env_steps", cell.budget_steps)
    try:
        per_seed = {c: [train(cell, c, s, steps, args.updates, args.lr, pool)["auc"] for s in seeds.tuning] for c in configs}
        candidates = {"independent": [c for c in configs if not c.startswith("bpo")],
                      "bpo": [c for c in configs if c.startswith("bpo")],
                      "rloo": [c for c in configs if c in GROUP_SIZE]}
        decisions = {kind: choose_config({c: per_seed[c] for c in names}, DEFAULT_CHOICE[kind]) for kind, names in candidates.items()}
        independent, branching, rloo = (decisions[k]["chosen"] for k in ("independent", "bpo", "rloo"))
        # matched flops: what RLOO-4 spends on the env-step budget at the prior
        probe = CONFIGS["rloo-4"](0).collect(prior_policy(cell), pool, task_draws(cell, 0, 1)[0], steps, seed=0)
        flops = Budget("flops", float(probe.compute.flops))
        matched: dict[str, Any] = {}
        for unit, budget in (("env_steps", steps), ("flops", flops)):
            runs = {c: [train(cell, c, s, budget, args.updates, args.lr, pool) for s in seeds.evaluation] for c in (independent, branching)}
            diffs = [b["auc"] - i["auc"] for b, i in zip(runs[branching], runs[independent], strict=True)]
            matched[unit] = {
                **paired_test(diffs),
                "seeds": list(seeds.evaluation),
                "budget": budget.amount,
                "auc": {c: float(np.mean([r["auc"] for r in rs])) for c, rs in runs.items()},
                "mean_curve": {c: np.mean([r["curve"] for r in rs], axis=0).tolist() for c, rs in runs.items()},
                "spent_per_update": {c: {u: float(np.mean([r["spent"][u] for r in rs])) / args.updates for u in ("env_steps", "flops", "leaves")} for c, rs in runs.items()},
            }
        shapes = [c for c in configs if c.startswith("bpo")]
        variance = variance_study(cell, rloo, shapes, args.variance_batches, pool, seeds)
    finally:
        pool.close()
    return {
        **asdict(cell),
        "budget_env_steps": cell.budget_steps,
        "prior_return": exact_return(cell.make_env(), prior_policy(cell)),
        "variance_by_depth": cell.make_env().variance_by_depth(prior_policy(cell).log_probs, 0),
        "tuning": {"seeds": list(seeds.tuning), "scores": {c: float(np.mean(v)) for c, v in per_seed.items()},
                   "scores_per_seed": per_seed, "decisions": decisions,
                   "chosen": {"independent": independent, "bpo": branching, "rloo": rloo}},
        "matched": matched,
        "variance": variance,
        "seconds": time.perf_counter() - start,
    }


def spearman(x: Sequence[float], y: Sequence[float], n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Spearman's rank correlation with a percentile bootstrap interval over the points."""
    x, y = np.asarray(x, float), np.asarray(y, float)

    def rho(a: np.ndarray, b: np.ndarray) -> float:
        ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
        if ra.std() == 0 or rb.std() == 0:
            return float("nan")
        return float(np.corrcoef(ra, rb)[0, 1])

    if len(x) < 3:
        return {"rho": None, "ci95": None, "n": len(x)}
    rng = np.random.default_rng(seed)
    boot = [rho(x[i], y[i]) for i in (rng.integers(len(x), size=len(x)) for _ in range(n_boot))]
    boot = [b for b in boot if np.isfinite(b)]
    return {"rho": rho(x, y), "ci95": [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))] if boot else None, "n": len(x)}


def predictor_summary(cells: dict[str, Any]) -> dict[str, Any]:
    """The predictor's Spearman rank correlation with the measured ratios over every (cell, shape)
    point, out of sample (:func:`variance_study`); ``seeds_per_point``: the fewest seeds behind a
    measured ratio."""
    pred, meas, points, seeds = [], [], [], []
    for name, cell in cells.items():
        for shape, row in cell["variance"]["shapes"].items():
            if row["predicted_ratio"] is not None and row["measured_ratio"] is not None:
                pred.append(row["predicted_ratio"])
                meas.append(row["measured_ratio"])
                seeds.append(row.get("measured_ratio_seeds", 1))
                points.append([name, shape, row["predicted_ratio"], row["measured_ratio"]])
    return {**spearman(pred, meas), "seeds_per_point": min(seeds) if seeds else 0, "out_of_sample": True, "points": points}


def verdict(row: dict[str, Any], alpha: float = ALPHA) -> str:
    """A cell's verdict at matched env steps after Holm's adjustment: ``"win"`` (BPO above the
    best independent, ``p_holm < alpha``), ``"loss"`` (below) or ``"tie"``."""
    p = row.get("p_holm")
    if p is None or p >= alpha or row["diff"] == 0:
        return "tie"
    return "win" if row["diff"] > 0 else "loss"


def paired_test(diffs: Sequence[float]) -> dict[str, Any]:
    """A row of per-seed differences: :func:`~bpo_experiments.stats.paired_difference` and the
    paired t-test's ``p``."""
    return {**paired_difference(diffs), "p": paired_p_value(diffs)}


def holm_verdicts(rows: Sequence[dict[str, Any]], alpha: float = ALPHA) -> None:
    """One family of tests: every row (with ``p`` and ``diff``) gains its Holm-adjusted
    ``p_holm`` and its :func:`verdict`."""
    for row, p in zip(rows, holm([r.get("p") for r in rows]), strict=True):
        row["p_holm"] = p
        row["verdict"] = verdict(row, alpha)


def adjust(cells: dict[str, Any]) -> dict[str, str]:
    """Holm's adjustment over the map's cells (one family per compute unit): every cell's
    ``matched[unit]`` gains ``p_holm`` and ``verdict``; returns the verdicts at matched env steps."""
    for unit in ("env_steps", "flops"):
        holm_verdicts([c["matched"][unit] for c in cells.values() if unit in c.get("matched", {})])
    return {name: c["matched"]["env_steps"]["verdict"] for name, c in cells.items()}


def replication(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``regime.json["replication"]`` from two runs of the map (each ``{"seeds", "cells"}``, Holm
    already applied): per cell the two verdicts at matched env steps; ``agreement`` = the share
    of the cells run in both whose verdicts are the same; ``opposite`` = the cells called a win
    in one run and a loss in the other; and what the two runs' estimates say beside their
    verdicts (:func:`replication_estimates`)."""
    if len(runs) != 2:
        raise ValueError(f"a replication compares two runs, got {len(runs)}")
    first, second = ({name: c["matched"]["env_steps"]["verdict"] for name, c in r["cells"].items()} for r in runs)
    common = [name for name in first if name in second]
    verdicts = {name: [first[name], second[name]] for name in common}
    return {
        **replication_estimates(runs, common),
        "predictor": replication_predictor(runs, common),
        "runs": [{"seeds": r["seeds"],
                  "verdicts": {name: {k: c["matched"]["env_steps"].get(k) for k in ("verdict", "diff", "diff_ci95", "p", "p_holm")}
                               for name, c in r["cells"].items()},
                  "predictor": {k: v for k, v in predictor_summary(r["cells"]).items() if k != "points"}} for r in runs],
        "verdicts": verdicts,
        "agreement": float(np.mean([a == b for a, b in verdicts.values()])) if verdicts else None,
        "opposite": [name for name, (a, b) in verdicts.items() if {a, b} == {"win", "loss"}],
        "alpha": ALPHA,
    }


def replication_estimates(runs: Sequence[dict[str, Any]], names: Sequence[str], alpha: float = ALPHA) -> dict[str, Any]:
    """Whether two runs' *estimates* replicate, where a verdict compares a p-value with a line:
    at a cell whose difference sits near the runs' detectable effect, two runs that agree on the
    estimate flip between tie and loss about half the time.

    * ``consistency``: per cell, Welch's test of run 1's per-seed differences against run 2's
      (matched env steps; the two runs share no seed), Holm-adjusted over the cells;
      ``consistent`` = the share of cells where the runs' differences do not differ detectably.
    * ``pooled``: per cell whose two runs compared the same configurations (``same_comparators``),
      the paired difference over both runs' seeds with its 95% interval, ``p``, ``p_holm`` (over
      those cells) and ``verdict``: the map's most powerful reading, read beside ``consistency``.
    * ``expected_agreement``: the verdict agreement two runs of this size would reach if each
      cell's pooled difference and spread were the truth, ``mean_c [P_c^2 + (1 - P_c)^2]`` with
      ``P_c`` the power of one run's paired t-test at Bonferroni's level ``alpha / m`` (Holm's
      per-cell level lies between ``alpha / m`` and ``alpha``): the agreement the runs' power
      allows, against which the observed ``agreement`` is read."""
    # a cell counts where both runs recorded its per-seed differences (a summary without them, as
    # in a hand-made map, gives only the verdicts' agreement)
    names = [n for n in names if all(len(run["cells"][n]["matched"]["env_steps"].get("diff_per_seed") or []) > 1 for run in runs)]
    per_seed = [{name: run["cells"][name]["matched"]["env_steps"]["diff_per_seed"] for name in names} for run in runs]
    consistency = {name: {"p": welch_p_value(per_seed[0][name], per_seed[1][name])} for name in names}
    for row, p in zip(consistency.values(), holm([r["p"] for r in consistency.values()]), strict=True):
        row["p_holm"] = p
        row["consistent"] = p is None or p >= alpha
    pairs = [[run["cells"][name].get("tuning", {}).get("chosen") for run in runs] for name in names]
    same = [name for name, (a, b) in zip(names, pairs, strict=True) if a == b]
    pooled = {}
    for name in same:
        row = paired_test([*per_seed[0][name], *per_seed[1][name]])
        pooled[name] = {k: v for k, v in row.items() if k != "diff_per_seed"}  # both runs' lists are in their cells
    holm_verdicts(list(pooled.values()), alpha)
    level = alpha / max(1, len(names))
    n_run = min((len(per_seed[0][n]) for n in names), default=0)
    chance = [power(row["diff"], row["sd"], n_run, level) for row in pooled.values()]
    agree = [p * p + (1 - p) * (1 - p) for p in chance if np.isfinite(p)]
    return {
        "consistency": consistency,
        "consistent": float(np.mean([r["consistent"] for r in consistency.values()])) if names else None,
        "same_comparators": same,
        "pooled": pooled,
        "pooled_verdicts": {name: row["verdict"] for name, row in pooled.items()},
        "expected_agreement": float(np.mean(agree)) if agree else None,
        "expected_agreement_level": level,
    }


def replication_predictor(runs: Sequence[dict[str, Any]], names: Sequence[str], n_boot: int = 1000) -> dict[str, Any]:
    """Whether the predictor's ranking replicates, and how much of its error is the measured
    ratios' own noise, over the (cell, shape) points both runs measured:

    * ``measured_test_retest``: Spearman of run 1's measured ratios against run 2's (disjoint
      variance seeds): how well one run's ratio ranks the points at all. A predictor cannot rank
      a run's ratios better than the runs rank each other, save by chance.
    * ``predicted_test_retest``: the same for the two runs' predictions (disjoint predictor seeds).
    * ``pooled``: per run, its predictor's Spearman (:func:`spearman`, bootstrap interval)
      against the ratios measured on *both* runs' variance seeds (:func:`ratio_over_seeds` of the
      concatenated per-seed ratios; ``seeds_per_point`` the fewest behind one; ``n_boot`` bootstrap
      samples for each interval). Out of sample:
      both runs' variance seeds are disjoint from both runs' predictor seeds.
    * ``points``: ``[cell, shape, run 1's prediction, run 2's, the pooled measured ratio]``."""
    first, second = ({(name, shape): row for name in names for shape, row in run["cells"][name]["variance"]["shapes"].items()}
                     for run in runs)
    points = [k for k in first if k in second and all(r.get("measured_ratio") is not None and r.get("predicted_ratio") is not None
                                                       for r in (first[k], second[k]))]
    pooled = {k: ratio_over_seeds([*(first[k].get("measured_ratio_per_seed") or []), *(second[k].get("measured_ratio_per_seed") or [])])
              for k in points}
    points = [k for k in points if pooled[k]["measured_ratio"] is not None]
    measured = [pooled[k]["measured_ratio"] for k in points]
    seeds = min((pooled[k]["measured_ratio_seeds"] for k in points), default=0)
    return {
        "measured_test_retest": spearman([first[k]["measured_ratio"] for k in points], [second[k]["measured_ratio"] for k in points],
                                         n_boot),
        "predicted_test_retest": spearman([first[k]["predicted_ratio"] for k in points], [second[k]["predicted_ratio"] for k in points],
                                          n_boot),
        "pooled": [{**spearman([run[k]["predicted_ratio"] for k in points], measured, n_boot), "seeds_per_point": seeds, "out_of_sample": True}
                   for run in (first, second)],
        "points": [[name, shape, first[name, shape]["predicted_ratio"], second[name, shape]["predicted_ratio"], m]
                   for (name, shape), m in zip(points, measured, strict=True)],
    }


def figure(results: dict[str, Any], path: Path) -> None:
    """The map at a glance: BPO minus the best independent AUC per cell (95% interval) at
    matched env steps and flops, eta and the fork cost beside, predicted against measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["cells"])
    rows = [results["cells"][n] for n in names]
    y = np.arange(len(names))[::-1]
    fig, axes = plt.subplots(1, 4, figsize=(17, 0.45 * len(names) + 2.2), gridspec_kw={"width_ratios": [3, 1.2, 1.2, 2.2]})
    ax = axes[0]
    for offset, unit, color in ((0.15, "env_steps", "tab:blue"), (-0.15, "flops", "tab:orange")):
        d = [r["matched"][unit]["diff"] for r in rows]
        ci = [r["matched"][unit]["diff_ci95"] for r in rows]
        ax.errorbar(d, y + offset, xerr=ci, fmt="o", color=color, label=f"matched {unit.replace('_', ' ')}", capsize=3)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(y)
    ax.set_yticklabels([f"{n}\n{r['tuning']['chosen']['bpo']} vs {r['tuning']['chosen']['independent']}" for n, r in zip(names, rows, strict=True)], fontsize=7)
    ax.set_xlabel("AUC: BPO - best independent (exact expected return)")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("where branching pays (95% CI over seeds)", fontsize=9)
    chosen = [r["variance"]["shapes"].get(r["tuning"]["chosen"]["bpo"], {}).get("mechanism", {}) for r in rows]
    eta = [m.get("prefix_explained") or 0.0 for m in chosen]
    lo = [max(0.0, (m.get("prefix_explained") or 0.0) - (m.get("prefix_explained_ci95") or [0, 0])[0]) for m in chosen]
    hi = [max(0.0, (m.get("prefix_explained_ci95") or [0, 0])[1] - (m.get("prefix_explained") or 0.0)) for m in chosen]
    axes[1].barh(y, eta, xerr=[lo, hi], color="tab:green", alpha=0.7)
    axes[1].set_yticks([])
    axes[1].set_xlabel("eta at branch points")
    axes[1].axvline(0, color="k", lw=0.8)
    cost = [m.get("fork_cost_ratio") or 0.0 for m in chosen]
    axes[2].barh(y, cost, color="tab:purple", alpha=0.7)
    axes[2].axvline(1, color="k", lw=0.8)
    axes[2].set_yticks([])
    axes[2].set_xlabel("fork cost (steps/leaf / steps/episode)")
    pts = results["predictor"]["points"]
    ax = axes[3]
    if pts:
        ax.scatter([p[2] for p in pts], [p[3] for p in pts], s=14)
        lim = [min(min(p[2], p[3]) for p in pts) * 0.8, max(max(p[2], p[3]) for p in pts) * 1.2]
        ax.plot(lim, lim, "k--", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
    s = results["predictor"]
    ci = s.get("ci95") or [float("nan")] * 2
    ax.set_title(f"gradient-variance ratio vs RLOO: Spearman {s.get('rho') or float('nan'):.2f} [{ci[0]:.2f}, {ci[1]:.2f}]", fontsize=8)
    ax.set_xlabel("predicted (mechanism model)")
    ax.set_ylabel("measured")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _ci(ci: Sequence[float] | None) -> str:
    return f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "-"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _ratio(shape: dict[str, Any]) -> str:
    measured, ci, predicted = shape.get("measured_ratio"), shape.get("measured_ratio_ci95"), shape.get("predicted_ratio")
    text = "-" if measured is None else f"{measured:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")
    return f"{text} / {'-' if predicted is None else f'{predicted:.2f}'}"


def markdown(results: dict[str, Any]) -> str:
    """The map's table (verdicts after Holm over the cells) and the predictor's line; with a
    replication, its table of both runs' verdicts, the agreement and the opposite verdicts."""
    lines = [
        "| cell | BPO vs best independent | matched env steps: diff [95% CI] | p (Holm) | verdict | matched flops: diff [95% CI] "
        "| eta | fork cost | var ratio measured [95% CI] / predicted |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results["cells"].items():
        c = r["tuning"]["chosen"]
        kept = {k: " (default)" if d.get("kept_default") else "" for k, d in r["tuning"].get("decisions", {}).items()}
        shape = r["variance"]["shapes"].get(c["bpo"], {})
        m = shape.get("mechanism", {})
        eta = m.get("prefix_explained")
        fmt = {
            unit: f"{d['diff']:+.4f} [{d['diff'] - d['diff_ci95']:+.4f}, {d['diff'] + d['diff_ci95']:+.4f}]"
            for unit, d in r["matched"].items()
        }
        steps = r["matched"]["env_steps"]
        p, p_holm = steps.get("p"), steps.get("p_holm")
        lines.append(
            f"| {name} | {c['bpo']}{kept.get('bpo', '')} vs {c['independent']}{kept.get('independent', '')} | {fmt['env_steps']} "
            f"| {_p(p)} ({_p(p_holm)}) | {steps.get('verdict', '-')} "
            f"| {fmt['flops']} | {_num(eta)} | {m.get('fork_cost_ratio') or float('nan'):.2f} | {_ratio(shape)} |"
        )
    s = results["predictor"]
    ci = s.get("ci95")
    lines.append("")
    lines.append(f"Predictor (out of sample: its inputs from other seeds' batches): Spearman {_num(s.get('rho'))} "
                 f"(95% CI {_ci(ci)}) over {s.get('n')} (cell, shape) points, "
                 f"each measured ratio from {s.get('seeds_per_point')} seeds.")
    rep = results.get("replication")
    if rep:
        lines += ["", "Replication (verdicts at matched env steps after Holm, two runs on disjoint seeds):", "",
                  "| cell | run 1 | run 2 |", "|---|---|---|"]
        lines += [f"| {name} | {a} | {b} |" for name, (a, b) in rep["verdicts"].items()]
        rhos = ", ".join(_num(run["predictor"].get("rho")) for run in rep["runs"])
        lines += ["", f"Agreement {_num(rep['agreement'])}; opposite verdicts: {', '.join(rep['opposite']) or 'none'}; "
                  f"predictor Spearman per run: {rhos}."]
        if "predictor" in rep:
            pr = rep["predictor"]
            per_run = ", ".join(f"{_num(row.get('rho'))} {_ci(row.get('ci95'))}" for row in pr["pooled"])
            seeds = pr["pooled"][0].get("seeds_per_point") if pr["pooled"] else None
            lines += ["", f"The predictor against the ratios measured on both runs' variance seeds ({seeds} a point): "
                      f"Spearman per run {per_run}; the two runs' measured ratios rank each other with "
                      f"{_num(pr['measured_test_retest'].get('rho'))} {_ci(pr['measured_test_retest'].get('ci95'))}, "
                      f"their predictions with {_num(pr['predicted_test_retest'].get('rho'))}."]
        if "consistency" in rep:
            pooled = rep["pooled"]
            lines += ["", f"Estimates: the two runs' differences agree (Welch, Holm over the cells) in "
                      f"{_num(rep['consistent'])} of the cells; verdict agreement expected at this power if the pooled "
                      f"differences were the truth: {_num(rep['expected_agreement'])}. Pooled over both runs' seeds "
                      f"(cells whose runs compared the same pair, Holm over them):", "",
                      "| cell | run 1 − run 2: p (Holm) | pooled diff [95% CI] | n | p (Holm) | verdict |",
                      "|---|---|---|---|---|---|"]
            for name, c in rep["consistency"].items():
                row = pooled.get(name)
                both = (f"{row['diff']:+.4f} [{row['diff'] - row['diff_ci95']:+.4f}, {row['diff'] + row['diff_ci95']:+.4f}] | "
                        f"{row['n']} | {_p(row['p'])} ({_p(row['p_holm'])}) | {row['verdict']}") if row else "different pairs | | |"
                lines.append(f"| {name} | {_p(c['p'])} ({_p(c['p_holm'])}) | {both} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/regime", help="output folder (regime.json, regime.png, regime.md)")
    parser.add_argument("--quick", action="store_true", help="3 cells, 3 seeds, fewer configurations (< 2 min)")
    parser.add_argument("--replicate", action="store_true",
                        help="run the whole map twice on disjoint seeds and record whether its verdicts replicate")
    parser.add_argument("--cells", nargs="+", help="only these cells, in this order")
    parser.add_argument("--render", action="store_true",
                        help="only re-write --out's regime.json, regime.md and regime.png from the runs its regime.json "
                             "holds, under this version's summary (nothing trains)")
    parser.add_argument("--seed-block", dest="first_block", type=int, default=0,
                        help="the first block of seeds of every kind (the map runs block B, its replication B + 1): "
                             "a block no earlier map used gives a map on fresh seeds")
    parser.add_argument("--seeds", type=int, default=24, help="evaluation seeds per cell")
    parser.add_argument("--tuning-seeds", type=int, default=8,
                        help="tuning seeds per configuration (at least 2 for any test; at 4 the BPO shapes 0.01 apart "
                             "were told apart in one run of two: docs/regime.md, \"Method\")")
    parser.add_argument("--updates", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.3, help="Adam learning rate of the tabular policy")
    parser.add_argument("--variance-seeds", type=int, default=MIN_VARIANCE_SEEDS,
                        help=f"seeds per measured variance ratio (at least {MIN_VARIANCE_SEEDS})")
    parser.add_argument("--predictor-seeds", type=int, default=2, help="seeds of the batches the predictor reads (disjoint)")
    parser.add_argument("--variance-batches", type=int, default=12, help="gradient batches per configuration and seed at the prior")
    args = parser.parse_args(argv)
    if args.render:
        results = render(Path(args.out))
        print(markdown(results))
        return results
    configs: Sequence[str] = list(CONFIGS)
    if args.quick:
        args.seeds, args.tuning_seeds, args.updates, args.variance_batches, args.predictor_seeds = 3, 1, 4, 3, 1
        configs = QUICK_CONFIGS
    if args.variance_seeds < MIN_VARIANCE_SEEDS:
        parser.error(f"--variance-seeds {args.variance_seeds}: a measured ratio needs at least {MIN_VARIANCE_SEEDS} seeds")
    if args.predictor_seeds < 1 or args.variance_batches < 2 or args.seeds < 2:
        parser.error("--predictor-seeds >= 1, --variance-batches >= 2 and --seeds >= 2 (a variance and an interval need two)")
    grid = cells(args.quick)
    if args.cells:
        by_name = {c.name: c for c in cells(False)}
        unknown = [n for n in args.cells if n not in by_name]
        if unknown:
            raise SystemExit(f"unknown cell(s) {unknown}; known: {list(by_name)}")
        grid = [by_name[n] for n in args.cells]  # in the order given
    torch.manual_seed(0)
    start = time.perf_counter()
    out = Path(args.out)
    total = 2 if args.replicate else 1
    runs: list[dict[str, Any]] = []

    def label(run: int, name: str) -> str:
        return f"run {run + 1}: {name}" if args.replicate else name

    for run in range(total):
        seeds = map_seeds(args, args.first_block + run)
        runs.append({"seeds": asdict(seeds), "cells": {}})
        for cell in grid:
            runs[run]["cells"][cell.name] = run_cell(cell, args, configs, seeds)
            print(f"{label(run, cell.name)}: {runs[run]['cells'][cell.name]['seconds']:.0f} s", flush=True)
            # written after every cell, so an interrupted map keeps the cells it finished
            pending = [label(r, c.name) for r in range(total) for c in grid if r >= len(runs) or c.name not in runs[r]["cells"]]
            write(args, configs, runs, out, start, pending)
    results = write(args, configs, runs, out, start, [])
    print(markdown(results))
    print(f"wrote {out / 'regime.json'}, {out / 'regime.md'} and {out / 'regime.png'} in {results['seconds']:.0f} s")
    return results


def write(args: argparse.Namespace, configs: Sequence[str], runs: list[dict[str, Any]], out: Path, start: float,
          pending: Sequence[str]) -> dict[str, Any]:
    """``regime.json``, ``regime.md`` and ``regime.png`` of the cells so far: the first run's map
    (``cells``, ``predictor``), Holm's adjustment over each run's cells, and with two runs the
    ``replication`` (``pending``: the cells not yet run, recorded in the JSON)."""
    results = summarize(vars(args), configs, runs, pending)
    results["seconds"] = time.perf_counter() - start
    results["load_average"] = list(os.getloadavg())
    results["cpu_count"] = os.cpu_count()
    return save(results, out)


def summarize(args: dict[str, Any], configs: Sequence[str], runs: list[dict[str, Any]], pending: Sequence[str]) -> dict[str, Any]:
    """The map's results from its runs' cells: Holm over each run's cells, the first run's map
    (``cells``, ``predictor``) and with two runs the ``replication``."""
    for run in runs:
        adjust(run["cells"])
    results: dict[str, Any] = {"args": args, "configs": list(configs), "seeds": runs[0]["seeds"], "cells": runs[0]["cells"]}
    results["pending_cells"] = list(pending)
    results["predictor"] = predictor_summary(results["cells"])
    if len(runs) == 2:
        results["replication"] = {**replication(runs), "second_run_cells": runs[1]["cells"]}
    return results


def render(out: Path) -> dict[str, Any]:
    """Re-write ``out``'s ``regime.json``, ``regime.md`` and ``regime.png`` from the runs its
    ``regime.json`` holds, under this version's summary (nothing trains; the cells' own
    measurements, seeds, arguments, time and load are kept)."""
    old = json.loads((out / "regime.json").read_text())
    runs = [{"seeds": old["seeds"], "cells": old["cells"]}]
    if "replication" in old:
        runs.append({"seeds": old["replication"]["runs"][1]["seeds"], "cells": old["replication"]["second_run_cells"]})
    results = summarize(old["args"], old["configs"], runs, old.get("pending_cells", []))
    results.update({k: old[k] for k in ("seconds", "load_average", "cpu_count") if k in old})
    return save(results, out)


def save(results: dict[str, Any], out: Path) -> dict[str, Any]:
    """``regime.json``, ``regime.md`` and ``regime.png`` of ``results`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "regime.json", json.dumps(results, indent=1, default=float))
    atomic_write(out / "regime.md", markdown(results))
    figure(results, out / "regime.png")
    return results


@ends_on_ctrl_c("bpo-regime")
def cli() -> None:
    """Console entry point (``bpo-regime``)."""
    main()


if __name__ == "__main__":
    cli()

"""Statistics of the main job: intervals over seeds, the evaluated-curve metrics, the paired
comparison with the comparator, its minimal detectable effect, and the per-env summary.

The seeds are the independent units (each has its own warm start and task sequence). Every
algorithm of a seed starts from the same policy, sees the same tasks and is evaluated on the
same episodes (common random numbers), so a difference is taken *per seed* and its spread over
seeds gives the interval (docs/main-job.md, "Statistics"):

* ``diff`` = mean over seeds of ``d_s = m_T(s) - m_C(s)`` for a metric ``m``, treatment ``T``
  and comparator ``C``; ``diff_ci95`` = ``t_{0.975, n-1} sd(d) / sqrt(n)`` (half-width);
* ``mde`` = ``(t_{0.975, n-1} + t_{0.80, n-1}) sd(d) / sqrt(n)``: the true difference a
  two-sided 5% paired t-test over these ``n`` seeds detects with 80% power, given the
  observed spread (the standard formula with the t quantiles of the test's degrees of
  freedom). A difference whose interval covers 0 is "not detected", and says which effects it
  could have detected, never "a tie".

The three metrics of an evaluated curve (success after ``0 = c_0 < c_1 < ... < c_K`` units of
the budget unit, linear in between) are fixed before the run:

* ``final``: the last evaluated success;
* ``auc``: ``(1 / H) * integral_0^H success(c) dc`` with ``H`` = updates x the per-update budget
  (the nominal total; a run that ends earlier keeps its last value), in [0, 1]: high when an
  algorithm gets high early, which final success on a plateau cannot show;
* ``compute_to_threshold``: the compute at which the curve first reaches ``w + f (target - w)``
  (``w`` the seed's warm start, ``f`` = ``EvaluationSpec.threshold_fraction``, ``target`` =
  ``EvaluationSpec.target_success``), interpolated; a run that never reaches it counts as its whole
  compute (censored: a lower bound; the number of such runs is reported).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from bpo_experiments.run_config import ComparisonConfig, EnvConfig
from bpo_experiments.significance import mean_ci, minimal_detectable_effect, paired_p_value, t975

METRICS: tuple[str, ...] = ("auc", "final", "compute_to_threshold")
"""The three headline metrics, in the report's order."""
HIGHER_IS_BETTER = {"auc": True, "final": True, "compute_to_threshold": False}


def paired_difference(diffs: Sequence[float]) -> dict[str, Any]:
    """``diff``, ``diff_ci95`` (half-width), ``diff_per_seed``, ``mde``, ``n`` and ``detected``
    (the 95% interval excludes 0) of per-seed differences."""
    d = np.asarray(diffs, dtype=float)
    n = len(d)
    if n == 0:
        return {"diff": float("nan"), "diff_ci95": float("nan"), "diff_per_seed": [], "mde": float("nan"), "n": 0, "detected": False}
    diff, ci = mean_ci(d)
    sd = float(d.std(ddof=1)) if n > 1 else float("nan")
    return {
        "diff": diff,
        "diff_ci95": ci,
        "diff_per_seed": d.tolist(),
        "sd": sd,
        "mde": minimal_detectable_effect(sd, n),
        "n": n,
        "detected": bool(n > 1 and abs(diff) > ci),
    }


def curve_band(curves: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-point mean over seeds and the half-width of its 95% t-interval."""
    c = np.asarray(curves, dtype=float)
    mean = c.mean(axis=0)
    if len(c) < 2:
        return mean, np.zeros_like(mean)
    return mean, t975(len(c) - 1) * c.std(axis=0, ddof=1) / math.sqrt(len(c))


def curve_metrics(compute: Sequence[float], success: Sequence[float], horizon: float, threshold: float) -> dict[str, Any]:
    """``final``, ``auc`` and ``compute_to_threshold`` of one evaluated curve (module docstring).

    ``compute``: the cumulative compute at each evaluation (starting at 0, the warm start);
    ``success``: the evaluated success there; ``horizon``: ``H``; ``threshold``: the success
    ``compute_to_threshold`` waits for."""
    x = np.asarray(compute, dtype=float)
    y = np.asarray(success, dtype=float)
    if len(x) < 1 or x[0] != 0:
        raise ValueError("an evaluated curve starts at compute 0 (the warm start)")
    if not horizon > 0:
        raise ValueError(f"horizon must be > 0, got {horizon}")
    # up to H: the curve cut at H, or held at its last value to H
    grid_x = np.append(x[x < horizon], horizon)
    grid_y = np.interp(grid_x, x, y)  # np.interp holds the last value past the end
    auc = float(np.sum((grid_x[1:] - grid_x[:-1]) * (grid_y[1:] + grid_y[:-1]) / 2) / horizon)
    above = np.nonzero(y >= threshold - 1e-12)[0]
    if above.size:
        k = int(above[0])
        if k == 0:
            reached_at = 0.0
        else:  # linear between the last evaluation below and the first at or above
            x0, x1, y0, y1 = x[k - 1], x[k], y[k - 1], y[k]
            reached_at = float(x0 + (threshold - y0) / (y1 - y0) * (x1 - x0))
        reached = True
    else:  # censored: at least the whole run
        reached_at, reached = float(x[-1]), False
    return {"final": float(y[-1]), "auc": auc, "compute_to_threshold": reached_at, "reached": reached}


def run_metrics(run: dict[str, Any], env: EnvConfig) -> dict[str, Any]:
    """:func:`curve_metrics` of one run's evaluated curve on ``env`` (the run's env's settings), in
    its budget unit.

    A run at ``budget_multiple`` times the per-update budget (the calibration control) is read
    per update: its compute divided by the multiple, so its metrics are what it reaches after
    the same number of updates as the others (what an estimator with its lower variance at the
    others' cost would reach)."""
    if run["env"] != env.name:
        raise ValueError(f"a run of {run['env']} measured with the settings of {env.name}")
    warm = run["evals"][0]["success"]
    threshold = warm + env.evaluation.threshold_fraction * (env.evaluation.target_success - warm)
    multiple = float(run.get("budget_multiple", 1.0))
    compute = [e["compute"][env.budget_unit] / multiple for e in run["evals"]]
    metrics = curve_metrics(compute, [e["success"] for e in run["evals"]], env.horizon, threshold)
    metrics["threshold"] = threshold
    return metrics


def _by_seed(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {r["seed"]: r for r in rows}


def compare_with(rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]], metrics: dict[tuple[str, int], dict[str, Any]], a: str, b: str) -> dict[str, Any]:
    """``a - b`` paired by seed for every metric (:func:`paired_difference`)."""
    seeds = sorted(set(_by_seed(rows_a)) & set(_by_seed(rows_b)))
    out: dict[str, Any] = {}
    for m in METRICS:
        out[m] = paired_difference([metrics[(a, s)][m] - metrics[(b, s)][m] for s in seeds])
        out[m]["seeds"] = seeds
        out[m]["higher_is_better"] = HIGHER_IS_BETTER[m]
    return out


def verdict(d: dict[str, Any], metric: str) -> str:
    """``"better"``, ``"worse"`` (the 95% interval excludes 0, in the metric's good direction)
    or ``"not detected"``."""
    if not d["detected"]:
        return "not detected"
    up = d["diff"] > 0
    return "better" if up == HIGHER_IS_BETTER[metric] else "worse"


def _probe_summary(rs: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    probes = [r["probes"][name] for r in rs if r.get("probes", {}).get(name)]
    if not probes:
        return None
    snrs = [p["snr"] for p in probes]
    finite = [v for v in snrs if v is not None and np.isfinite(v)]
    out: dict[str, Any] = {
        "seeds": [r["seed"] for r in rs if r.get("probes", {}).get(name)],
        "batches": probes[0]["batches"],
        "update": probes[0].get("update"),
        "snr_per_seed": snrs,
        "snr_ci95_per_seed": [p["snr_ci95"] for p in probes],
        "snr": float(np.mean(finite)) if finite else float("nan"),
        "trace_var": float(np.mean([p["trace_var"] for p in probes])),
        "signal": float(np.mean([p["signal"] for p in probes])),
        "grad_norm_var": float(np.mean([p.get("grad_norm_var", float("nan")) for p in probes])),
    }
    cos = [p for p in probes if "cosine" in p]
    if cos:
        out["cosine_per_seed"] = [p["cosine"] for p in cos]
        out["cosine_ci95_per_seed"] = [p["cosine_ci95"] for p in cos]
        values = [p["cosine"] for p in cos if np.isfinite(p["cosine"])]
        out["cosine"] = float(np.mean(values)) if values else float("nan")
    return out


DEFAULTS = "@default"
"""The label suffix of a run at the preset's untuned options beside a tuned comparison."""


def mechanism_summary(rs: list[dict[str, Any]], point: str) -> dict[str, Any] | None:
    """The mechanism (docs/mechanism.md) of one algorithm at one point, over its seeds: each
    quantity's mean over the seeds that measured it; ``prefix_explained`` with the 95% t-interval
    over seeds (each seed's own bootstrap interval over branch nodes in ``per_seed``); the branch
    depths summed."""
    found = [(r["seed"], r["mechanism"][point]) for r in rs if (r.get("mechanism") or {}).get(point)]
    if not found:
        return None

    def mean_of(key: str) -> float | None:
        values = [m[key] for _, m in found if m.get(key) is not None]
        return float(np.mean(values)) if values else None

    etas = [m["prefix_explained"] for _, m in found if m.get("prefix_explained") is not None]
    depths: dict[str, int] = {}
    for _, m in found:
        for d, n in (m.get("branch_depths") or {}).items():
            depths[d] = depths.get(d, 0) + n
    out: dict[str, Any] = {
        "update": found[0][1].get("update"),
        "seeds": [s for s, _ in found],
        "prefix_explained": None,
        "prefix_explained_ci95": None,
        "prefix_explained_seeds": len(etas),
        "branch_nodes": int(sum(m.get("branch_nodes", 0) for _, m in found)),
        "branch_depths": dict(sorted(depths.items(), key=lambda kv: int(kv[0]))),
        **{k: mean_of(k) for k in ("fork_steps_per_leaf", "independent_steps_per_trajectory", "fork_cost_ratio",
                                   "zero_variance_groups", "distinct_siblings", "tasks_per_update")},
        "per_seed": {str(s): m for s, m in found},
    }
    if etas:
        mean, half = mean_ci(etas)
        out["prefix_explained"] = mean
        out["prefix_explained_ci95"] = [mean - half, mean + half] if len(etas) > 1 else None
    return out


def split_summary(rows: dict[str, list[dict[str, Any]]], eval_split: str, treatment: str, comparator: str) -> dict[str, Any]:
    """Final evaluated success per evaluation split: the primary ``eval_split`` (the runs'
    ``evals``) and every further split (their ``extra_eval``, :attr:`EnvSetup.extra_eval`). Per
    split: the warm start (mean and 95% interval over seeds), each algorithm's final success and
    its paired difference from the warm start, and the treatment minus the comparator (paired by
    seed; :func:`paired_difference`)."""
    per_split: dict[str, dict[str, dict[int, tuple[float, float]]]] = {}
    for a, rs in rows.items():
        for r in rs:
            per_split.setdefault(eval_split, {}).setdefault(a, {})[r["seed"]] = (r["evals"][0]["success"], r["final_success"])
            for split, v in (r.get("extra_eval") or {}).items():
                per_split.setdefault(split, {}).setdefault(a, {})[r["seed"]] = (v["warm"], v["final"])
    out: dict[str, Any] = {}
    for split, by_algorithm in per_split.items():
        warm = {s: w for seeds in by_algorithm.values() for s, (w, _) in seeds.items()}
        mean, half = mean_ci([warm[s] for s in sorted(warm)])
        entry: dict[str, Any] = {"primary": split == eval_split, "warm_start": {"mean": mean, "ci95": half, "per_seed": [warm[s] for s in sorted(warm)]},
                                 "algorithms": {}}  # fmt: skip
        for a, seeds in by_algorithm.items():
            finals = [seeds[s][1] for s in sorted(seeds)]
            mean, half = mean_ci(finals)
            entry["algorithms"][a] = {"final": mean, "final_ci95": half, "per_seed": finals,
                                      "vs_warm_start": paired_difference([seeds[s][1] - seeds[s][0] for s in sorted(seeds)])}  # fmt: skip
        t, c = by_algorithm.get(treatment), by_algorithm.get(comparator)
        if t and c and treatment != comparator:
            common = sorted(set(t) & set(c))
            entry["treatment_vs_comparator"] = {"treatment": treatment, "comparator": comparator, "metric": "final",
                                                **paired_difference([t[s][1] - c[s][1] for s in common])}  # fmt: skip
        out[split] = entry
    return out


def aggregate(runs: list[dict[str, Any]], comparison: ComparisonConfig, envs: list[str], labels: Sequence[str] | None = None) -> dict[str, Any]:
    """``results.json``: per env and algorithm, evaluated curves and metrics with intervals over
    seeds; per env the treatment and every algorithm against the comparator, the controls (the
    calibration control among them), the comparator against its warm start, the mechanism, the
    untuned defaults' headline (labels ``NAME@default``, against the comparator's defaults), and
    the post-hoc best-of-the-others; across envs. ``labels``: the runs' algorithm labels
    (default: the preset's algorithms)."""
    unit = comparison.budget_unit
    algorithms = list(labels) if labels is not None else list(comparison.algorithms)
    comparator, treatment, primary = comparison.comparator, comparison.treatment, comparison.primary_metric
    per_env = {env: _env_result(env, runs, comparison, algorithms) for env in envs}
    overall: dict[str, Any] = {}
    for a in (a for a in algorithms if DEFAULTS not in a):  # the comparison's own algorithms
        items = [per_env[e]["algorithms"][a] for e in envs if a in per_env[e]["algorithms"]]
        if items:
            overall[a] = {
                "success": float(np.mean([i["success"] for i in items])),
                "compute": {k: float(np.mean([i["compute"][k] for i in items])) for k in items[0]["compute"]},
                "auc": float(np.mean([i["metrics"]["auc"]["mean"] for i in items])),
            }
    seeds = sorted({s for e in envs for s in comparison.envs[e].seeds})
    return {
        "budget_unit": unit,
        "treatment": treatment,
        "comparator": comparator,
        "primary_metric": primary,
        "algorithms": overall,
        "per_env": per_env,
        "envs": envs,
        "seeds": seeds,
        "preset": comparison.settings,
    }


def _env_result(env: str, runs: list[dict[str, Any]], comparison: ComparisonConfig, algorithms: list[str]) -> dict[str, Any]:
    """``per_env[env]`` of ``results.json``: its setting and warm start, every algorithm's
    summary (:func:`algorithm_summary`), each against the comparator, the headline and the controls
    (:func:`_headlines`), the mechanism, the splits (see :func:`aggregate`)."""
    unit = comparison.budget_unit
    comparator, treatment, primary = comparison.comparator, comparison.treatment, comparison.primary_metric
    rows = {a: sorted((r for r in runs if r["env"] == env and r["algorithm"] == a), key=lambda r: r["seed"]) for a in algorithms}
    settings = comparison.envs[env]
    metrics = {(r["algorithm"], r["seed"]): run_metrics(r, settings) for rs in rows.values() for r in rs}
    warm_per_seed = {r["seed"]: r["evals"][0]["success"] for rs in rows.values() for r in rs}
    env_result: dict[str, Any] = {
        "budget": settings.budget,
        "budget_unit": unit,
        "horizon": settings.horizon,
        "seeds": list(settings.seeds),
        "eval_split": settings.setup.eval_split,
        "eval_episodes": settings.evaluation.episodes,
        "warm_start": {"per_seed": [warm_per_seed[s] for s in sorted(warm_per_seed)], "mean": float(np.mean(list(warm_per_seed.values())))},
        "threshold": {"target_success": settings.evaluation.target_success, "fraction": settings.evaluation.threshold_fraction},
        "algorithms": {},
    }
    for a, rs in rows.items():
        if rs:
            env_result["algorithms"][a] = algorithm_summary(rs, a, metrics, comparison, env)
    # every algorithm against the comparator (a default against the comparator's default), paired by seed
    vs: dict[str, Any] = {}
    for a, rs in rows.items():
        against = comparator + DEFAULTS if a.endswith(DEFAULTS) else comparator
        if a != against and rs and rows.get(against):
            vs[a] = compare_with(rs, rows[against], metrics, a, against)
    env_result["vs_comparator"] = vs
    env_result["comparator"] = comparator
    env_result["primary_metric"] = primary
    env_result.update(_headlines(vs, rows, comparison))
    mechanism = {}
    for a, rs in rows.items():
        points = {p: mechanism_summary(rs, p) for p in ("warm", "mid")}
        if any(points.values()):
            mechanism[a] = {p: v for p, v in points.items() if v is not None}
    if mechanism:
        env_result["mechanism"] = mechanism
    if rows.get(comparator):
        rises = paired_difference([metrics[(comparator, r["seed"])]["final"] - r["evals"][0]["success"] for r in rows[comparator]])
        env_result["comparator_vs_warm_start"] = {"metric": "final", **rises}
    env_result["treatment_vs_best_baseline"] = best_of_others(rows, env_result["algorithms"], treatment, comparison)
    env_result["splits"] = split_summary(rows, settings.setup.eval_split, treatment, comparator)
    return env_result


def algorithm_summary(rs: list[dict[str, Any]], a: str, metrics: dict[tuple[str, int], dict[str, Any]], comparison: ComparisonConfig,
                      env: str) -> dict[str, Any]:
    """``per_env[env]["algorithms"][a]``: algorithm ``a``'s runs ``rs`` (one per seed) summarised: final
    success, evaluated curve, compute, the metrics with their intervals, the gradient probes."""
    unit = comparison.budget_unit
    success, ci = mean_ci([r["final_success"] for r in rs])
    _, band = curve_band([r["curve"] for r in rs])
    updates = [e["update"] for e in rs[0]["evals"]]
    eval_success = [[e["success"] for e in r["evals"]] for r in rs]
    eval_mean, eval_band = curve_band(eval_success)
    summary: dict[str, Any] = {
        "success": success,
        "success_ci95": ci,
        "success_per_seed": [r["final_success"] for r in rs],
        "compute": {k: float(np.mean([r["compute_per_update"][k] for r in rs])) for k in rs[0]["compute_per_update"]},
        "compute_total": {k: float(np.mean([r["compute_total"][k] for r in rs])) for k in rs[0]["compute_total"]},
        "eval_curve": {
            "updates": updates,
            "success": eval_mean.tolist(),
            "success_ci95": eval_band.tolist(),
            "success_per_seed": eval_success,
            "env_steps_per_seed": [[e["compute"]["env_steps"] for e in r["evals"]] for r in rs],
            "flops_per_seed": [[e["compute"]["flops"] for e in r["evals"]] for r in rs],
            f"{unit}_per_seed": [[e["compute"][unit] for e in r["evals"]] for r in rs],
        },
        "metrics": {},
        "curve": np.mean([r["curve"] for r in rs], axis=0).tolist(),
        "curve_ci95": band.tolist(),
        "compute_curve": np.mean([r["compute_cumulative"] for r in rs], axis=0).tolist(),
        "grad_norm_var_train": float(np.mean([r["grad_norm_var_train"] for r in rs])),
        "budget_used_ratio": float(np.mean([r["compute_per_update"][unit] for r in rs]) / comparison.envs[env].budget),
        "seconds_per_run": float(np.mean([r["seconds"] for r in rs])),
        # absent when a run was written before runs recorded their CPU
        "seconds_cpu_per_run": float(np.mean([r["seconds_cpu"] for r in rs])) if all("seconds_cpu" in r for r in rs) else None,
        "budget_multiple": float(rs[0].get("budget_multiple", 1.0)),
    }
    for m in METRICS:
        values = [metrics[(a, r["seed"])][m] for r in rs]
        mean, half = mean_ci(values)
        summary["metrics"][m] = {"mean": mean, "ci95": half, "per_seed": values}
    summary["metrics"]["compute_to_threshold"]["not_reached"] = sum(not metrics[(a, r["seed"])]["reached"] for r in rs)
    for name in ("initial", "mid"):
        probe = _probe_summary(rs, name)
        if probe is not None:
            summary[f"gradient_{name}"] = probe
    return summary


def _headlines(vs: dict[str, Any], rows: dict[str, list[dict[str, Any]]], comparison: ComparisonConfig) -> dict[str, Any]:
    """The headline and the controls from the differences against the comparator ``vs``: the
    positive control, the handicapped control, the treatment against the comparator, the
    calibration control and the untuned defaults."""
    comparator, treatment, primary = comparison.comparator, comparison.treatment, comparison.primary_metric
    out: dict[str, Any] = {}
    control = comparison.positive_control if comparison.positive_control in vs else None
    detected = None
    if control is not None:
        d = vs[control][primary]
        detected = verdict(d, primary) == "worse"
        out["positive_control"] = {"algorithm": control, "metric": primary, **d, "detected_as_worse": detected}
    handicap = comparison.handicapped_control if comparison.handicapped_control in vs else None
    if handicap is not None:
        d = vs[handicap][primary]
        out["handicapped_control"] = {
            "algorithm": handicap, "metric": primary, **d,
            "ranked_below": d["diff"] < 0 if HIGHER_IS_BETTER[primary] else d["diff"] > 0,
            "verdict": verdict(d, primary),
        }
    if treatment in vs:
        head = vs[treatment]
        out["treatment_vs_comparator"] = {
            "treatment": treatment,
            "comparator": comparator,
            "metric": primary,
            **{k: head[primary][k] for k in ("diff", "diff_ci95", "diff_per_seed", "mde", "n", "detected", "sd")},
            "verdict": verdict(head[primary], primary),
            "underpowered": detected is False,
            "metrics": head,
        }
    calibration = comparison.calibration_control if comparison.calibration_control in vs else None
    if calibration is not None:
        d = vs[calibration][primary]
        multiple = float(rows[calibration][0].get("budget_multiple", 1.0))
        out["calibration"] = {
            "algorithm": calibration, "comparator": comparator, "metric": primary, "budget_multiple": multiple,
            **{k: d[k] for k in ("diff", "diff_ci95", "diff_per_seed", "mde", "n", "detected", "sd")},
            "verdict": verdict(d, primary),
        }
        if treatment in vs:
            out["treatment_vs_calibration"] = treatment_vs_calibration(vs[treatment][primary], d, treatment, calibration, primary)
    defaults = treatment + DEFAULTS
    if defaults in vs:
        d = vs[defaults][primary]
        out["defaults_vs_comparator"] = {
            "treatment": defaults, "comparator": comparator + DEFAULTS, "metric": primary,
            **{k: d[k] for k in ("diff", "diff_ci95", "diff_per_seed", "mde", "n", "detected", "sd")},
            "verdict": verdict(d, primary),
        }
    return out


def treatment_vs_calibration(treatment: dict[str, Any], calibration: dict[str, Any], treatment_name: str, calibration_name: str,
                             metric: str) -> dict[str, Any]:
    """``per_env[env]["treatment_vs_calibration"]``: the treatment minus the calibration control,
    paired by seed, from their differences against the comparator (``d_T(s) - d_cal(s) =
    m_T(s) - m_cal(s)`` on the seeds both have): :func:`paired_difference` with the paired
    t-test's ``p`` and the verdict. Where the treatment is at or above the calibration, it buys at
    least what halving the gradient variance would."""
    by_seed = dict(zip(calibration["seeds"], calibration["diff_per_seed"], strict=True))
    seeds = [s for s in treatment["seeds"] if s in by_seed]
    own = dict(zip(treatment["seeds"], treatment["diff_per_seed"], strict=True))
    diffs = [own[s] - by_seed[s] for s in seeds]
    d = paired_difference(diffs)
    return {"treatment": treatment_name, "calibration": calibration_name, "metric": metric, **d, "seeds": seeds,
            "p": paired_p_value(diffs), "verdict": verdict(d, metric)}


def best_of_others(rows: dict[str, list[dict[str, Any]]], summary: dict[str, Any], treatment: str, comparison: ComparisonConfig) -> dict[str, Any] | None:
    """Secondary, chosen after seeing the results: the treatment against the baseline with the
    highest mean final success, paired by seed (biased against the treatment when nothing
    differs: it is the maximum of several noisy means)."""
    controls = comparison.controls
    pool = comparison.competitors or tuple(summary)
    baselines = [b for b in pool if b in summary and b != treatment and b not in controls and DEFAULTS not in b]
    if treatment not in summary or not baselines:
        return None
    best = max(baselines, key=lambda b: summary[b]["success"])
    by_seed = {r["seed"]: r["final_success"] for r in rows[best]}
    diffs = [r["final_success"] - by_seed[r["seed"]] for r in rows[treatment] if r["seed"] in by_seed]
    d = paired_difference(diffs)
    return {
        "treatment": treatment,
        "best_baseline": best,
        "chosen_after_the_results": True,
        "success_diff": d["diff"],
        "success_diff_ci95": d["diff_ci95"],
        "success_diff_per_seed": d["diff_per_seed"],
        "mde": d["mde"],
    }


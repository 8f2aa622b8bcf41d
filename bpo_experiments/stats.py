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
  (``w`` the seed's warm start, ``f`` = ``Preset.threshold_fraction``, ``target`` =
  ``Preset.target_success``), interpolated; a run that never reaches it counts as its whole
  compute (censored: a lower bound; the number of such runs is reported).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from bpo_experiments.presets import Preset, preset_dict

METRICS: tuple[str, ...] = ("auc", "final", "compute_to_threshold")
"""The three headline metrics, in the report's order."""
HIGHER_IS_BETTER = {"auc": True, "final": True, "compute_to_threshold": False}


def t_cdf(x: float, dof: int) -> float:
    """Student's t distribution function (the regularised incomplete beta, by its continued
    fraction)."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {dof}")
    if x == 0:
        return 0.5
    z = dof / (dof + x * x)
    tail = 0.5 * _betainc(dof / 2.0, 0.5, z)
    return 1.0 - tail if x > 0 else tail


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta ``I_x(a, b)`` (Lentz's continued fraction)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _betainc(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    f, c, d = 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            numerator = 1.0
        elif i % 2 == 0:
            numerator = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            numerator = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + numerator * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + numerator / c
        c = c if abs(c) > tiny else tiny
        f *= c * d
        if abs(1.0 - c * d) < 1e-14:
            break
    return front * (f - 1.0)


@functools.lru_cache(maxsize=1024)
def t_quantile(p: float, dof: int) -> float:
    """The ``p`` quantile of Student's t with ``dof`` degrees of freedom (bisection on
    :func:`t_cdf`)."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p}")
    lo, hi = -1e3, 1e3
    for _ in range(70):  # 2000 / 2^70: far below a double's resolution of the answer
        mid = (lo + hi) / 2
        if t_cdf(mid, dof) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def t975(dof: int) -> float:
    """The 0.975 quantile of Student's t with ``dof`` degrees of freedom."""
    return t_quantile(0.975, dof)


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of a 95% t-interval over seeds (0 for one seed)."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return float(x.mean()), 0.0
    return float(x.mean()), float(t975(len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))


def minimal_detectable_effect(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """``(t_{1 - alpha/2, n-1} + t_{power, n-1}) sd / sqrt(n)``: the true mean difference a
    two-sided level-``alpha`` paired t-test over ``n`` pairs with spread ``sd`` detects with
    probability ``power`` (nan for fewer than 2 pairs)."""
    if n < 2:
        return float("nan")
    return float((t_quantile(1 - alpha / 2, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n))


def power(effect: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """The probability that a two-sided level-``alpha`` paired t-test over ``n`` pairs with
    spread ``sd`` detects a true mean difference ``effect``: under it the statistic is noncentral
    t, ``T = (Z + d) / S`` with ``d = |effect| sqrt(n) / sd``, ``Z`` standard normal and ``S^2``
    a chi-square over its ``n - 1`` degrees of freedom, so the power is
    ``E_S[1 - Phi(c S - d) + Phi(-c S - d)]`` with ``c = t_{1-alpha/2, n-1}``, integrated over
    ``U = sqrt(n - 1) S`` (density ``u^(k-1) e^(-u^2/2) / (2^(k/2-1) Gamma(k/2))``, ``k = n - 1``)
    by the trapezoid rule. nan for fewer than 2 pairs or no spread."""
    if n < 2 or not sd > 0:
        return float("nan")
    k = n - 1
    crit = t_quantile(1 - alpha / 2, k)
    shift = abs(effect) * math.sqrt(n) / sd
    u = np.linspace(0.0, math.sqrt(k) + 12.0, 4001)
    log_u = np.log(u, out=np.full_like(u, -np.inf), where=u > 0)
    power_term = (k - 1) * log_u if k > 1 else np.zeros_like(u)  # u^0 = 1, also at u = 0
    density = np.exp(power_term - u * u / 2 - (k / 2 - 1) * math.log(2) - math.lgamma(k / 2))
    scale = u / math.sqrt(k)
    phi = np.vectorize(lambda x: 0.5 * math.erfc(-x / math.sqrt(2)))
    reject = 1.0 - phi(crit * scale - shift) + phi(-crit * scale - shift)
    return float(np.clip(np.trapezoid(density * reject, u), 0.0, 1.0))


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


def paired_p_value(diffs: Sequence[float]) -> float | None:
    """Two-sided p-value of the paired t-test of ``mean(d) = 0``: ``2 (1 - F_t(|t|, n-1))`` with
    ``t = mean(d) / (sd(d) / sqrt(n))`` (None for fewer than 2 pairs; with no spread, 0 when the
    mean is not 0, else 1)."""
    d = np.asarray(diffs, dtype=float)
    n = len(d)
    if n < 2:
        return None
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if sd == 0:
        return 0.0 if mean != 0 else 1.0
    t = mean / (sd / math.sqrt(n))
    return float(min(1.0, 2.0 * (1.0 - t_cdf(abs(t), n - 1))))


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family of ``m`` p-values (None: no test, left None and not
    counted in ``m``): sorted ascending ``p_(1) <= ... <= p_(m)``, the adjusted
    ``p~_(i) = max_{j <= i} min(1, (m - j + 1) p_(j))``, returned in the input's order. Rejecting
    where ``p~ < alpha`` keeps the family-wise error rate at ``alpha``."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m = len(tested)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * float(p)))
        out[i] = running
    return out


def f_survival(x: float, dof_between: int, dof_within: int) -> float:
    """``P(F > x)`` for Snedecor's F with ``(dof_between, dof_within)`` degrees of freedom:
    ``I_{d2 / (d2 + d1 x)}(d2 / 2, d1 / 2)``."""
    if dof_between < 1 or dof_within < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {dof_between}, {dof_within}")
    if x <= 0:
        return 1.0
    return float(_betainc(dof_within / 2.0, dof_between / 2.0, dof_within / (dof_within + dof_between * x)))


def one_way_anova(groups: Sequence[Sequence[float]], alpha: float = 0.05, power: float = 0.8) -> dict[str, Any]:
    """The one-way F-test that ``k`` groups (here: tuning candidates, each scored on its seeds)
    share one mean, and the smallest difference of two group means it could detect.

    ``F = (SSB / (k - 1)) / (SSW / (N - k))`` with ``SSB = sum_i n_i (mean_i - mean)^2``,
    ``SSW = sum_i sum_j (x_ij - mean_i)^2``; ``p = P(F_{k-1, N-k} > F)``. ``detectable_difference``
    = ``(t_{1 - alpha/2, N-k} + t_{power, N-k}) sqrt(MSW (1/n_a + 1/n_b))`` for the two smallest
    groups: the difference of two candidates' means a level-``alpha`` comparison of those two
    detects with probability ``power``. ``distinguishable``: ``p < alpha``. With fewer than two
    groups or no replicate within a group (``N - k = 0``) nothing is testable: ``p`` and
    ``detectable_difference`` are None and ``distinguishable`` is False (and with no spread
    within the groups ``F`` is None, ``p`` 0 when the means differ, else 1)."""
    data = [np.asarray(g, dtype=float) for g in groups]
    k, total = len(data), sum(len(g) for g in data)
    dof_b, dof_w = k - 1, total - k
    means = [float(g.mean()) for g in data if len(g)]
    out: dict[str, Any] = {"test": "one-way F-test", "groups": k, "observations": total, "dof": [dof_b, dof_w],
                           "F": None, "p": None, "alpha": alpha, "power": power, "detectable_difference": None,
                           "spread": float(max(means) - min(means)) if means else None, "distinguishable": False}
    if k < 2 or dof_w < 1 or any(len(g) == 0 for g in data):
        return out
    grand = float(np.concatenate(data).mean())
    ssb = float(sum(len(g) * (g.mean() - grand) ** 2 for g in data))
    ssw = float(sum(((g - g.mean()) ** 2).sum() for g in data))
    msw = ssw / dof_w
    if msw == 0:
        f, p = None, (0.0 if ssb > 0 else 1.0)  # no spread within: F is infinite or undefined
    else:
        f = (ssb / dof_b) / msw
        p = f_survival(f, dof_b, dof_w)
    sizes = sorted(len(g) for g in data)[:2]
    detectable = (t_quantile(1 - alpha / 2, dof_w) + t_quantile(power, dof_w)) * math.sqrt(msw * (1 / sizes[0] + 1 / sizes[1]))
    out.update({"F": f, "p": p, "msw": msw, "detectable_difference": float(detectable), "distinguishable": bool(p < alpha)})
    return out


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


def run_metrics(run: dict[str, Any], preset: Preset, unit: str) -> dict[str, Any]:
    """:func:`curve_metrics` of one run's evaluated curve, in the budget unit ``unit``.

    A run at ``budget_multiple`` times the per-update budget (the calibration control) is read
    per update: its compute divided by the multiple, so its metrics are what it reaches after
    the same number of updates as the others (what an estimator with its lower variance at the
    others' cost would reach)."""
    env = run["env"]
    horizon = preset.trainer_for(env).updates * preset.budget[env]
    warm = run["evals"][0]["success"]
    target = preset.for_env("target_success", env)
    threshold = warm + preset.threshold_fraction * (target - warm)
    multiple = float(run.get("budget_multiple", 1.0))
    compute = [e["compute"][unit] / multiple for e in run["evals"]]
    metrics = curve_metrics(compute, [e["success"] for e in run["evals"]], horizon, threshold)
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


def aggregate(runs: list[dict[str, Any]], preset: Preset, envs: list[str], labels: Sequence[str] | None = None) -> dict[str, Any]:
    """``results.json``: per env and algorithm, evaluated curves and metrics with intervals over
    seeds; per env the treatment and every algorithm against the comparator, the controls (the
    calibration control among them), the comparator against its warm start, the mechanism, the
    untuned defaults' headline (labels ``NAME@default``, against the comparator's defaults), and
    the post-hoc best-of-the-others; across envs. ``labels``: the runs' algorithm labels
    (default: the preset's algorithms)."""
    unit = preset.budget_unit
    algorithms = list(labels) if labels is not None else list(preset.algorithms)
    comparator, treatment, primary = preset.comparator, preset.treatment, preset.primary_metric
    per_env = {env: _env_result(env, runs, preset, algorithms) for env in envs}
    overall: dict[str, Any] = {}
    for a in (a for a in algorithms if DEFAULTS not in a):  # the comparison's own algorithms
        items = [per_env[e]["algorithms"][a] for e in envs if a in per_env[e]["algorithms"]]
        if items:
            overall[a] = {
                "success": float(np.mean([i["success"] for i in items])),
                "compute": {k: float(np.mean([i["compute"][k] for i in items])) for k in items[0]["compute"]},
                "auc": float(np.mean([i["metrics"]["auc"]["mean"] for i in items])),
            }
    seeds = sorted({s for e in envs for s in preset.for_env("seeds", e)})
    return {
        "budget_unit": unit,
        "treatment": treatment,
        "comparator": comparator,
        "primary_metric": primary,
        "algorithms": overall,
        "per_env": per_env,
        "envs": envs,
        "seeds": seeds,
        "preset": preset_dict(preset),
    }


def _env_result(env: str, runs: list[dict[str, Any]], preset: Preset, algorithms: list[str]) -> dict[str, Any]:
    """``per_env[env]`` of ``results.json``: its setting and warm start, every algorithm's
    summary (:func:`algorithm_summary`), each against the comparator, the headline and the controls
    (:func:`_headlines`), the mechanism, the splits (see :func:`aggregate`)."""
    unit = preset.budget_unit
    comparator, treatment, primary = preset.comparator, preset.treatment, preset.primary_metric
    rows = {a: sorted((r for r in runs if r["env"] == env and r["algorithm"] == a), key=lambda r: r["seed"]) for a in algorithms}
    metrics = {(r["algorithm"], r["seed"]): run_metrics(r, preset, unit) for rs in rows.values() for r in rs}
    warm_per_seed = {r["seed"]: r["evals"][0]["success"] for rs in rows.values() for r in rs}
    env_result: dict[str, Any] = {
        "budget": preset.budget[env],
        "budget_unit": unit,
        "horizon": preset.trainer_for(env).updates * preset.budget[env],
        "seeds": list(preset.for_env("seeds", env)),
        "eval_split": preset.envs[env].eval_split,
        "eval_episodes": preset.for_env("eval_episodes", env),
        "warm_start": {"per_seed": [warm_per_seed[s] for s in sorted(warm_per_seed)], "mean": float(np.mean(list(warm_per_seed.values())))},
        "threshold": {"target_success": preset.for_env("target_success", env), "fraction": preset.threshold_fraction},
        "algorithms": {},
    }
    for a, rs in rows.items():
        if rs:
            env_result["algorithms"][a] = algorithm_summary(rs, a, metrics, preset, env)
    # every algorithm against the comparator (a default against the comparator's default), paired by seed
    vs: dict[str, Any] = {}
    for a, rs in rows.items():
        against = comparator + DEFAULTS if a.endswith(DEFAULTS) else comparator
        if a != against and rs and rows.get(against):
            vs[a] = compare_with(rs, rows[against], metrics, a, against)
    env_result["vs_comparator"] = vs
    env_result["comparator"] = comparator
    env_result["primary_metric"] = primary
    env_result.update(_headlines(vs, rows, preset))
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
    env_result["treatment_vs_best_baseline"] = best_of_others(rows, env_result["algorithms"], treatment, preset)
    env_result["splits"] = split_summary(rows, preset.envs[env].eval_split, treatment, comparator)
    return env_result


def algorithm_summary(rs: list[dict[str, Any]], a: str, metrics: dict[tuple[str, int], dict[str, Any]], preset: Preset,
                      env: str) -> dict[str, Any]:
    """``per_env[env]["algorithms"][a]``: algorithm ``a``'s runs ``rs`` (one per seed) summarised: final
    success, evaluated curve, compute, the metrics with their intervals, the gradient probes."""
    unit = preset.budget_unit
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
        "budget_used_ratio": float(np.mean([r["compute_per_update"][unit] for r in rs]) / preset.budget[env]),
        "seconds_per_run": float(np.mean([r["seconds"] for r in rs])),
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


def _headlines(vs: dict[str, Any], rows: dict[str, list[dict[str, Any]]], preset: Preset) -> dict[str, Any]:
    """The headline and the controls from the differences against the comparator ``vs``: the
    positive control, the handicapped control, the treatment against the comparator, the
    calibration control and the untuned defaults."""
    comparator, treatment, primary = preset.comparator, preset.treatment, preset.primary_metric
    out: dict[str, Any] = {}
    control = preset.positive_control if preset.positive_control in vs else None
    detected = None
    if control is not None:
        d = vs[control][primary]
        detected = verdict(d, primary) == "worse"
        out["positive_control"] = {"algorithm": control, "metric": primary, **d, "detected_as_worse": detected}
    handicap = preset.handicapped_control if preset.handicapped_control in vs else None
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
    calibration = preset.calibration_control if preset.calibration_control in vs else None
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


def best_of_others(rows: dict[str, list[dict[str, Any]]], summary: dict[str, Any], treatment: str, preset: Preset) -> dict[str, Any] | None:
    """Secondary, chosen after seeing the results: the treatment against the baseline with the
    highest mean final success, paired by seed (biased against the treatment when nothing
    differs: it is the maximum of several noisy means)."""
    controls = {preset.positive_control, preset.handicapped_control, preset.calibration_control}
    pool = preset.competitors or tuple(summary)
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


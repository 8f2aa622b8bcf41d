"""Statistics of the main job: intervals over seeds, the per-env summary, paired comparisons.

Every interval is a two-sided 95% Student-t interval over seeds (the seeds are the independent
units: each has its own warm start and task sequence). The treatment (BPO by default) is
compared with the best baseline *paired by seed*: both start from the same policy and see the
same tasks, so the seed-to-seed spread cancels in the difference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from bpo_algos.experiments.presets import Preset, preset_dict

# two-sided 95% Student-t quantiles by degrees of freedom
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t975(dof: int) -> float:
    """The 0.975 quantile of Student's t with ``dof`` degrees of freedom (Cornish-Fisher past 30)."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {dof}")
    if dof <= len(_T975):
        return _T975[dof - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * dof)


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of a 95% t-interval over seeds (0 for one seed)."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return float(x.mean()), 0.0
    return float(x.mean()), float(t975(len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))


def curve_band(curves: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-update mean over seeds and the half-width of its 95% t-interval."""
    c = np.asarray(curves, dtype=float)
    mean = c.mean(axis=0)
    if len(c) < 2:
        return mean, np.zeros_like(mean)
    return mean, t975(len(c) - 1) * c.std(axis=0, ddof=1) / math.sqrt(len(c))


def smooth(curve: np.ndarray, window: int = 3) -> np.ndarray:
    """Trailing moving average (shorter windows at the start)."""
    out = np.convolve(curve, np.ones(window) / window, mode="full")[: len(curve)]
    counts = np.minimum(np.arange(1, len(curve) + 1), window)
    return out * window / counts


def aggregate(runs: list[dict[str, Any]], preset: Preset, envs: list[str]) -> dict[str, Any]:
    """``results.json``: per env and algorithm, means and intervals over seeds; across envs."""
    unit = preset.budget_unit
    algorithms = list(preset.algorithms)
    baselines = [a for a in (preset.competitors or algorithms) if a != preset.treatment]
    per_env: dict[str, Any] = {}
    for env in envs:
        rows = {a: [r for r in runs if r["env"] == env and r["algorithm"] == a] for a in algorithms}
        mean_curves = {a: np.mean([r["curve"] for r in rows[a]], axis=0) for a in algorithms if rows[a]}
        final_train = {a: float(np.mean(c[-3:])) for a, c in mean_curves.items()}
        targets = [final_train[b] for b in baselines if b in final_train]
        target = max(targets) if targets else max(final_train.values())
        env_result: dict[str, Any] = {
            "budget": preset.budget[env],
            "target_success": target,
            "seeds": list(preset.for_env("seeds", env)),
            "algorithms": {},
        }
        for a, rs in rows.items():
            if not rs:
                continue
            reached = np.nonzero(smooth(mean_curves[a]) >= target - 1e-9)[0]
            success, ci = mean_ci([r["final_success"] for r in rs])
            _, band = curve_band([r["curve"] for r in rs])
            env_result["algorithms"][a] = {
                "success": success,
                "success_ci95": ci,
                "success_per_seed": [r["final_success"] for r in rs],
                "final_train_success": final_train[a],
                "compute": {k: float(np.mean([r["compute_per_update"][k] for r in rs])) for k in rs[0]["compute_per_update"]},
                "curve": mean_curves[a].tolist(),
                "curve_ci95": band.tolist(),
                "compute_curve": np.mean([r["compute_cumulative"] for r in rs], axis=0).tolist(),
                "grad_norm_var": float(np.mean([r["grad_norm_var_initial"] for r in rs])),
                "grad_trace_var": float(np.mean([r["grad_trace_var_initial"] for r in rs])),
                "grad_noise_to_signal": float(np.median([r.get("grad_noise_to_signal_initial", np.nan) for r in rs])),
                "grad_norm_var_train": float(np.mean([r["grad_norm_var_train"] for r in rs])),
                "updates_to_target": int(reached[0]) + 1 if len(reached) else None,
                "budget_used_ratio": float(np.mean([r["compute_per_update"][unit] for r in rs]) / preset.budget[env]),
            }
        env_result["treatment_vs_best_baseline"] = paired_comparison(rows, env_result["algorithms"], preset.treatment, baselines)
        # the name of earlier results (and of the README): BPO is the default treatment
        env_result["bpo_vs_best_baseline"] = env_result["treatment_vs_best_baseline"]
        env_result["eval_split"] = preset.envs[env].eval_split
        per_env[env] = env_result
    # across envs: the mean of the per-env figures (curves resampled to a common progress grid
    # when the envs ran different numbers of updates)
    overall: dict[str, Any] = {}
    for a in algorithms:
        items = [per_env[e]["algorithms"][a] for e in envs if a in per_env[e]["algorithms"]]
        if not items:
            continue
        length = max(len(i["curve"]) for i in items)
        grid = np.linspace(0.0, 1.0, length)
        curves = [np.interp(grid, np.linspace(0.0, 1.0, len(i["curve"])), i["curve"]) for i in items]
        overall[a] = {
            "success": float(np.mean([i["success"] for i in items])),
            "compute": {k: float(np.mean([i["compute"][k] for i in items])) for k in items[0]["compute"]},
            "curve": np.mean(curves, axis=0).tolist(),
            "grad_norm_var": float(np.mean([i["grad_norm_var"] for i in items])),
            "updates_to_target": [i["updates_to_target"] for i in items],
        }
    seeds = sorted({s for e in envs for s in preset.for_env("seeds", e)})
    return {
        "budget_unit": unit,
        "treatment": preset.treatment,
        "algorithms": overall,
        "per_env": per_env,
        "envs": envs,
        "seeds": seeds,
        "preset": preset_dict(preset),
    }


def paired_comparison(
    rows: dict[str, list[dict[str, Any]]], summary: dict[str, Any], treatment: str = "bpo", baselines: Sequence[str] | None = None
) -> dict[str, Any] | None:
    """The treatment against the best baseline (highest mean final success), paired by seed.

    ``success_diff``: mean over seeds of ``success_T(s) - success_best(s)`` and its 95%
    t-interval; ``grad_norm_var_ratio`` / ``grad_trace_var_ratio``: the treatment's over the best
    baseline's, at the initial policy and the same budget; ``*_vs`` give them against every
    baseline. RLOO's advantages have BPO's scale (returns minus a baseline), GRPO's are divided
    by the group's return std, so its gradients are larger by design: ``noise_to_signal`` is the
    scale-free comparison.
    """
    baselines = [b for b in (baselines if baselines is not None else summary) if b in summary and b != treatment]
    if treatment not in summary or not baselines:
        return None
    best = max(baselines, key=lambda b: summary[b]["success"])
    by_seed = {r["seed"]: r["final_success"] for r in rows[best]}
    diffs = [r["final_success"] - by_seed[r["seed"]] for r in rows[treatment] if r["seed"] in by_seed]
    diff, ci = mean_ci(diffs) if diffs else (float("nan"), float("nan"))

    def ratio(key: str, baseline: str) -> float:
        return summary[treatment][key] / summary[baseline][key] if summary[baseline][key] > 0 else float("nan")

    return {
        "treatment": treatment,
        "best_baseline": best,
        "success_diff": diff,
        "success_diff_ci95": ci,
        "success_diff_per_seed": diffs,
        "grad_norm_var_ratio": ratio("grad_norm_var", best),
        "grad_trace_var_ratio": ratio("grad_trace_var", best),
        "grad_norm_var_ratio_vs": {b: ratio("grad_norm_var", b) for b in baselines},
        "noise_to_signal_ratio_vs": {b: ratio("grad_noise_to_signal", b) for b in baselines},
    }

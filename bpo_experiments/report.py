"""The main job's report: ``results.md`` and the plots.

``results.md`` leads with the controls (was the positive control detected on each env, is the
handicapped learner ranked below the comparator, does the comparator rise above its warm
start), the calibration control (what halving the variance is worth, and whether the
instrument can see it) and the mechanism (docs/mechanism.md), then the tuning (each algorithm's
candidates, scores and choice), then the headline (the tuned treatment − the tuned comparator,
paired by seed, for the three metrics fixed before the run, each with its interval and minimal
detectable effect; the untuned defaults as a secondary row), then per env the metrics of every
algorithm, the gradient diagnostics and every compute meter. The plots
show what the tables say: evaluated success against env steps and flops with the warm start
and 95% bands, final success, and the gradient signal-to-noise with its bootstrap intervals.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from bpo_algos.compute import COMPUTE_UNITS

logger = logging.getLogger(__name__)


METER_COLUMNS = (*COMPUTE_UNITS, "resets", "failures", "dropped_steps")
"""Every compute-meter field, in the order of the per-env compute table."""


def _number(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"


def _source(p: dict[str, Any]) -> str:
    if p.get("data_source") == "bundled-generator":
        return f"bundled generator `{p.get('generator')}` v{p.get('generator_version')}"
    digest = p.get("files_sha256") or ""
    return f"data `{p.get('data_dir')}` (sha256 {digest[:12]})"


def data_line(data: dict[str, Any]) -> str:
    """One sentence naming the data and splits behind an env's numbers."""
    train, evals = data.get("train", {}), data.get("eval", {})
    text = (
        f"Data: {_source(train)}; trained on {train.get('tasks_used')} of the {train.get('task_count')} "
        f"`{train.get('split')}` tasks, evaluated on {evals.get('tasks_used')} of the {evals.get('task_count')} "
        f"`{evals.get('split')}` tasks"
    )
    if evals.get("eval_split") in ("held-out", "train"):
        text += f" ({evals['eval_split']})"
    if _source(evals) != _source(train):
        text += f" from {_source(evals)}"
    extras = [f"{k}={train[k]}" for k in ("search_actions", "goals", "noun_parser") if k in train]
    if "reward" in train:
        extras.append("reward " + ", ".join(f"{k}={v}" for k, v in train["reward"].items()))
    return text + (f" ({'; '.join(extras)})." if extras else ".")


def split_lines(er: dict[str, Any]) -> list[str]:
    """Final success on every evaluation split (``per_env[env]["splits"]``), when there is more
    than one: the warm start, each algorithm and its paired difference from the warm start."""
    splits = er.get("splits") or {}
    if len(splits) < 2:
        return []
    lines = ["", "Final evaluated success on each evaluation split (mean [95% interval over seeds]; Δ: paired by seed):", "",
             "| split | warm start | " + " | ".join(f"{a} (Δ vs warm start)" for a in next(iter(splits.values()))["algorithms"]) + " |",
             "|---|---:|" + "---:|" * len(next(iter(splits.values()))["algorithms"])]  # fmt: skip
    for split, entry in splits.items():
        w = entry["warm_start"]
        cells = [f"{unit_interval(v['per_seed'], v['final_ci95'])} ({_diff(v['vs_warm_start'])})" for v in entry["algorithms"].values()]
        lines.append(f"| {split}{' (primary)' if entry.get('primary') else ''} | {unit_interval(w['per_seed'], w['ci95'])} | "
                     + " | ".join(cells) + " |")
    return lines


MIN_SEEDS = 3
"""The fewest seeds an interval or a minimal detectable effect is printed for: below it, a
t-interval has one or two degrees of freedom and says nothing (the report prints "n/a: 2 seeds")."""


def _na(n: int) -> str:
    return f"n/a: {n} seed{'s' if n != 1 else ''}"


def _pm(value: float, half: float, digits: int = 3, n: int | None = None) -> str:
    """``+0.125 ± 0.050``; ``+0.125 (n/a: 2 seeds)`` over fewer than :data:`MIN_SEEDS` seeds."""
    if n is not None and n < MIN_SEEDS:
        return f"{value:+.{digits}f} ({_na(n)})"
    return f"{value:+.{digits}f} ± {half:.{digits}f}"


def _mde(d: dict[str, Any], digits: int = 3) -> str:
    """``MDE 0.120`` of a paired difference ``d``; ``MDE n/a: 2 seeds`` below :data:`MIN_SEEDS`."""
    n = _seeds(d)
    return f"MDE {_na(n)}" if n < MIN_SEEDS else f"MDE {d['mde']:.{digits}f}"


def _seeds(d: dict[str, Any]) -> int:
    """The seeds behind a paired difference (its ``n``, else its per-seed list's length)."""
    per_seed = d.get("diff_per_seed", d.get("success_diff_per_seed"))
    return int(d.get("n", len(per_seed) if per_seed is not None else MIN_SEEDS))


def _diff(d: dict[str, Any], digits: int = 3) -> str:
    """A paired difference with its interval (``n/a`` below :data:`MIN_SEEDS` seeds)."""
    return _pm(d["diff"], d["diff_ci95"], digits, _seeds(d))


def unit_interval(per_seed: list[float], half: float | None = None, digits: int = 3) -> str:
    """The mean of per-seed values in [0, 1] (success, AUC) and its 95% interval, never outside
    [0, 1]: the t-interval (half-width ``half``) where it stays inside, else the 2.5 and 97.5
    percentiles of the mean over 2000 bootstrap resamples of the seeds (``bootstrap``);
    ``n/a`` below :data:`MIN_SEEDS` seeds."""
    x = np.asarray(per_seed, dtype=float)
    if len(x) == 0:
        return "–"
    mean = float(x.mean())
    if len(x) < MIN_SEEDS:
        return f"{mean:.{digits}f} ({_na(len(x))})"
    if half is not None and np.isfinite(half) and 0.0 <= mean - half and mean + half <= 1.0:
        return f"{mean:.{digits}f} [{mean - half:.{digits}f}, {mean + half:.{digits}f}]"
    rng = np.random.default_rng(0)
    means = x[rng.integers(0, len(x), size=(2000, len(x)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return f"{mean:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}] (bootstrap)"


def _metric_value(metric: str, value: float) -> str:
    return f"{value:.3f}" if metric != "compute_to_threshold" else _number(value)


_METRIC_NAMES = {
    "auc": "AUC (evaluated success vs compute, [0, 1])",
    "final": "final evaluated success",
    "compute_to_threshold": "compute to the threshold",
}


def _snr_cell(probe: dict[str, Any] | None, key: str = "snr") -> str:
    if not probe:
        return "–"
    values = probe.get(f"{key}_per_seed") or []
    intervals = probe.get(f"{key}_ci95_per_seed") or []
    if not values:
        return "–"
    if len(values) == 1:
        lo, hi = intervals[0]
        return f"{values[0]:.3g} [{lo:.3g}, {hi:.3g}]"
    return f"{probe[key]:.3g} (mean of {len(values)} seeds; seed {probe['seeds'][0]}: [{intervals[0][0]:.3g}, {intervals[0][1]:.3g}])"


def controls_lines(results: dict[str, Any]) -> list[str]:
    """The report's first lines: whether each env's controls were detected."""
    lines = []
    for env, er in results["per_env"].items():
        metric = er.get("primary_metric", "auc")
        pc = er.get("positive_control")
        parts = []
        if pc:
            state = "**detected**" if pc["detected_as_worse"] else "**not detected**: every headline of this env is underpowered"
            parts.append(f"positive control `{pc['algorithm']}` − {er['comparator']}: {_diff(pc)} ({_mde(pc)}) — {state}")
        else:
            parts.append("no positive control ran")
        hc = er.get("handicapped_control")
        if hc:
            ranked = "ranked below" if hc["ranked_below"] else "not ranked below"
            sure = "significantly" if hc["verdict"] == "worse" else "not significantly"
            parts.append(f"handicapped `{hc['algorithm']}` − {er['comparator']}: {_diff(hc)} ({_mde(hc)}): {ranked} "
                         f"{er['comparator']} ({sure})")
        rise = er.get("comparator_vs_warm_start")
        if rise:
            state = "rises above it" if rise["detected"] and rise["diff"] > 0 else "does not rise detectably above it"
            parts.append(f"{er['comparator']} final − warm start: {_diff(rise)} ({state})")
        lines.append(f"* **{env}** ({metric}): " + "; ".join(parts) + ".")
        cal = er.get("calibration")
        if cal:
            if cal["detected"]:
                seen = "**detected**: the instrument can see what halving the gradient variance is worth here"
            else:
                seen = ("**not detected**: the instrument cannot see an effect of the size a halving of the gradient variance "
                        "implies here, so a null headline says nothing about the paper's variance claim")
            lines.append(f"* **{env}** calibration `{cal['algorithm']}` ({cal['budget_multiple']:g}x the budget per update, its "
                         f"curve read per update) − {cal['comparator']}: {_diff(cal)} ({_mde(cal)}) — {seen}.")
    return lines


def _options_text(options: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in options.items()) or "defaults"


def tuning_lines(results: dict[str, Any]) -> list[str]:
    """Each tuned env's tuning: per kind of algorithm its candidates with their scores (the
    criterion's mean over the tuning seeds), the one chosen, and the F-test across the candidates
    with the smallest difference it could detect (when it cannot tell them apart, the defaults
    are kept and this says so); under the table, the options the user fixed (``fixed_by_user``:
    pinned, never tuned)."""
    lines: list[str] = []
    for env, er in results["per_env"].items():
        tuning = er.get("tuning")
        if not tuning:
            continue
        first = next(iter(tuning.values()))
        if "vs_default" in first:
            rule = ("a candidate replaces the defaults only where its mean is detectably above theirs (t-tests against the "
                    "defaults on the pooled variance, Holm-adjusted; the highest mean of those), else the defaults are kept")
        elif "f_test" in first:  # results written before that rule
            rule = "the highest mean is chosen when the one-way F-test across the candidates tells them apart, else the defaults are kept"
        else:
            rule = "the highest mean is chosen"
        lines += [f"**{env}**: {first['criterion']}, tuning seeds {first['seeds']} (disjoint from the evaluation seeds); "
                  f"{rule}, before any evaluation run.", "",
                  "| algorithm | candidate | score (mean over tuning seeds) | per tuning seed | chosen |", "|---|---|---:|---|---|"]
        for kind, t in tuning.items():
            mark = "**chosen** (defaults kept)" if t.get("kept_defaults") else "**chosen**"
            for i, (candidate, score) in enumerate(zip(t["candidates"], t["scores"], strict=True)):
                if score is None:  # the user's pins left one candidate: nothing to choose, nothing ran
                    lines.append(f"| {kind} | {_options_text(candidate) if candidate else 'nothing left to tune'} | not run | – | **chosen** |")
                    continue
                per_seed = ", ".join(f"{v:.3f}" for v in t["scores_per_seed"][i])
                lines.append(f"| {kind} | {_options_text(candidate)} | {score:.3f} | {per_seed} | {mark if i == t['chosen_index'] else ''} |")
            if t.get("kept_defaults") and t.get("chosen_index") is None:
                lines.append(f"| {kind} | {_options_text(t['chosen'])} (the defaults) | – | – | {mark} |")
        lines.append("")
        for kind, t in tuning.items():
            if "decision" in t:
                lines.append(f"* {kind}: {t['decision']}.")
        lines.append("")
        lines += [f"* {kind}: {_options_text(t['fixed_by_user'])} **fixed by the user** (never tuned; the grid's other options "
                  "are tuned)." for kind, t in tuning.items() if t.get("fixed_by_user")]
        lines.append("")
    return lines


def _eta_cell(m: dict[str, Any] | None) -> str:
    if not m or m.get("prefix_explained") is None:
        return "–"
    ci, n = m.get("prefix_explained_ci95"), m["prefix_explained_seeds"]
    if n < MIN_SEEDS:
        return f"{m['prefix_explained']:+.2f} ({_na(n)})"
    return f"{m['prefix_explained']:+.2f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else "") + f" ({n} seeds)"


def _maybe(value: Any, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def mechanism_lines(results: dict[str, Any]) -> list[str]:
    """The mechanism per env and algorithm, from its own training batches at the warm start and
    mid-training (docs/mechanism.md)."""
    lines: list[str] = []
    for env, er in results["per_env"].items():
        mech = er.get("mechanism")
        if not mech:
            continue
        lines += [f"**{env}** (each seed's training batch of the warm-start policy, then of the mid-training policy; η's "
                  "interval: 95% t over seeds):", "",
                  "| algorithm | point | η = prefix-explained share of return variance | branch nodes (by depth) | env steps per leaf "
                  "| steps per independent episode | zero-variance sibling groups | distinct siblings per branch point | tasks per update |",
                  "|---|---|---:|---|---:|---:|---:|---:|---:|"]
        for a, points in mech.items():
            for point, m in points.items():
                depths = ", ".join(f"d{d}: {n}" for d, n in m["branch_depths"].items())
                lines.append(
                    f"| {a} | {point} (update {m.get('update', 0) - 1}) | {_eta_cell(m)} | {m['branch_nodes']} ({depths or '–'}) "
                    f"| {_maybe(m.get('fork_steps_per_leaf'), '.2f')} | {_maybe(m.get('independent_steps_per_trajectory'), '.2f')} "
                    f"| {_maybe(m.get('zero_variance_groups'), '.0%')} | {_maybe(m.get('distinct_siblings'), '.2f')} "
                    f"| {_maybe(m.get('tasks_per_update'), '.1f')} |"
                )
        lines.append("")
    return lines


def _headline_row(env: str, name: str, d: dict[str, Any], verdict: str, digits: int = 3) -> str:
    """One row of the headline table; below :data:`MIN_SEEDS` seeds its interval, MDE and
    verdict read ``n/a`` (two seeds give no estimate of the spread worth printing)."""
    n = _seeds(d)
    per_seed = ", ".join(f"{v:+.{digits}f}" for v in d["diff_per_seed"])
    if n < MIN_SEEDS:
        return f"| {env} | {name} | {d['diff']:+.{digits}f} | {_na(n)} | {_na(n)} | {per_seed} | {_na(n)} |"
    return (f"| {env} | {name} | {d['diff']:+.{digits}f} | ± {d['diff_ci95']:.{digits}f} | {d['mde']:.{digits}f} | "
            f"{per_seed} | {verdict} |")


def headline_lines(results: dict[str, Any]) -> list[str]:
    """The headline table: the treatment − the comparator, per env and metric; the treatment −
    the calibration control (paired by seed) and the untuned defaults as secondary rows."""
    lines = [
        "| env | metric | " + f"{results['treatment']} − {results['comparator']}" + " | 95% CI | MDE (80% power) | per seed | verdict |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for env, er in results["per_env"].items():
        head = er.get("treatment_vs_comparator")
        if not head:
            continue
        for m, d in head["metrics"].items():
            verdict = "detected" if d["detected"] else f"not detected (effects below {d['mde']:.3g} cannot be excluded)"
            if head.get("underpowered"):
                verdict += "; **underpowered** (control not detected)"
            name = f"**{m}** (primary)" if m == head["metric"] else m
            lines.append(_headline_row(env, name, d, verdict, 3 if m != "compute_to_threshold" else 0))
        cal = er.get("treatment_vs_calibration")
        if cal:
            if cal["detected"]:
                verdict = (f"detected (p {cal['p']:.2g}): {cal['treatment']} is "
                           + ("above" if cal["verdict"] == "better" else "below") + " what halving the gradient variance buys")
            else:
                verdict = f"not detected (effects below {cal['mde']:.3g} cannot be excluded)"
            name = f"{cal['metric']}, **against the calibration** ({cal['treatment']} − {cal['calibration']}, paired by seed)"
            lines.append(_headline_row(env, name, cal, verdict))
        defaults = er.get("defaults_vs_comparator")
        if defaults:
            verdict = "detected" if defaults["detected"] else f"not detected (effects below {defaults['mde']:.3g} cannot be excluded)"
            name = f"{defaults['metric']}, **untuned defaults** ({defaults['treatment']} − {defaults['comparator']}; secondary)"
            lines.append(_headline_row(env, name, defaults, verdict))
    return lines


def _interrupted(results: dict[str, Any]) -> list[str]:
    unfinished = {e: v for e, v in (results.get("unfinished_seeds") or {}).items() if v}
    if not unfinished:
        return []
    return [f"**Interrupted**: the comparison was stopped before seeds {unfinished} finished; every figure below is over the "
            "seeds whose runs had all finished (`--report-only`).", ""]


def markdown(results: dict[str, Any]) -> str:
    unit = results["budget_unit"]
    algorithms = list(results["preset"].get("algorithms", ()))
    comparator = results.get("comparator", "rloo")
    lines = [
        f"# {' vs '.join(a.upper() for a in algorithms) or 'Comparison'} at matched compute",
        "",
        *_pipeline_check_lines(results),
        f"Budget unit: `{unit}` per update; seeds {results['seeds']}; comparator **{comparator}** and primary metric "
        f"**{results.get('primary_metric')}**, both fixed before the run; every difference is paired by seed, with its 95% "
        "t-interval and the minimal detectable effect (MDE: the true difference a two-sided 5% paired t-test over these seeds "
        f"detects with 80% power, from the per-seed spread; docs/main-job.md); with fewer than {MIN_SEEDS} seeds neither "
        "means anything and the report prints n/a. Success and AUC intervals stay in [0, 1] (a bootstrap over seeds where "
        "the t-interval would leave it).",
        "",
        *_interrupted(results),
        "## Controls",
        "",
        *controls_lines(results),
        "",
    ]
    mechanism = mechanism_lines(results)
    if mechanism:
        lines += ["## Mechanism (docs/mechanism.md)", "", *mechanism]
    tuning = tuning_lines(results)
    if tuning:
        lines += ["## Tuning (fixed before the run; docs/main-job.md, \"Tuning\")", "", *tuning]
    tuned = " (each tuned; the controls at their algorithm's choice)" if tuning else ""
    lines += [
        f"## Headline: {results['treatment']} − {comparator}{tuned}",
        "",
        *headline_lines(results),
        "",
        *_few_seeds_lines(results),
        *_figure_lines(results, "success.png", "evaluated success"),
    ]
    for env, er in results["per_env"].items():
        lines += _env_lines(env, er, unit, comparator)
    for name, alt in (("final_success.png", "final success"), ("gradient_snr.png", "gradient signal-to-noise"),
                      ("grad_norm_variance.png", "gradient-norm variance"), ("training_success.png", "training batch success")):
        lines += _figure_lines(results, name, alt)
    lines += _trees_lines(results.get("example_trees") or {})
    lines += _provenance_lines(results)
    return "\n".join(lines) + "\n"


def _pipeline_check_lines(results: dict[str, Any]) -> list[str]:
    """The smoke preset's warning, first: it checks that every part of the job runs; its numbers
    mean nothing."""
    if results.get("base_preset") != "smoke":
        return []
    return ["> **Pipeline check, not a result.** This is the smoke preset (`bpo-compare --smoke`): tiny envs, "
            f"{len(results.get('seeds') or [])} seeds and a few updates, sized to check in about a minute that every part of "
            "the main job runs (tuning, controls, probes, mechanism, report). Its numbers mean nothing about BPO or any "
            "baseline. The comparison itself: `bpo-compare` (docs/main-job.md).", ""]


def _few_seeds_lines(results: dict[str, Any]) -> list[str]:
    """Under the headline: a note where an env has fewer than :data:`MIN_SEEDS` seeds."""
    few = {env: len(er.get("seeds") or []) for env, er in results["per_env"].items() if len(er.get("seeds") or []) < MIN_SEEDS}
    if not few:
        return []
    return [f"With fewer than {MIN_SEEDS} seeds ({', '.join(f'{e}: {_na(n)}' for e, n in few.items())}) no interval, MDE or "
            "verdict above is an estimate: read the per-seed values only.", ""]


PLOTS_WITHOUT_DATA = "plots_without_data"
"""``results.json`` key: ``{plot file: why it was not drawn}`` (:func:`plots`)."""


def probed_envs(results: dict[str, Any]) -> list[str]:
    """The envs where some run probed its gradient (a finite SNR): the gradient plots draw these
    only (an env with ``grad_seeds`` 0 would be an empty panel)."""
    return [env for env, er in results["per_env"].items()
            if any(v is not None and np.isfinite(v) for r in er["algorithms"].values()
                   for v in ((r.get("gradient_initial") or {}).get("snr_per_seed") or []))]


def empty_plots(results: dict[str, Any]) -> dict[str, str]:
    """``{plot file: why}`` of the plots that would have no data: the gradient plots when no
    run probed its gradient (``grad_seeds`` 0, or an FSDP preset)."""
    rows = [r for er in results["per_env"].values() for r in er["algorithms"].values()]
    probes = [r.get("gradient_initial") or {} for r in rows]
    reason = "no run probed its gradient (grad_seeds is 0 on every env, or the policy is sharded)"
    out: dict[str, str] = {}
    if not any(np.isfinite(v) for p in probes for v in (p.get("snr_per_seed") or []) if v is not None):
        out["gradient_snr.png"] = reason
    if not any(np.isfinite(p.get("grad_norm_var", np.nan)) for p in probes):
        out["grad_norm_variance.png"] = reason
    if not any(r.get("eval_curve") for r in rows):
        out["success.png"] = out["final_success.png"] = "no run was evaluated"
    if not any(len(r.get("curve") or []) for r in rows):
        out["training_success.png"] = "no run trained an update"
    return out


def _figure_lines(results: dict[str, Any], name: str, alt: str) -> list[str]:
    """A plot's link, or why it was not drawn."""
    why = empty_plots(results).get(name)
    if why:
        return [f"*{alt.capitalize()} ({name}): not drawn, {why}.*", ""]
    unprobed = [e for e in results["per_env"] if e not in probed_envs(results)]
    if name in GRADIENT_PLOTS and unprobed:
        return [f"![{alt}]({name})", "", f"*No gradient probes on {', '.join(unprobed)} (grad_seeds 0 there): not drawn.*", ""]
    return [f"![{alt}]({name})", ""]


def _env_lines(env: str, er: dict[str, Any], unit: str, comparator: str) -> list[str]:
    """One env's section of ``results.md``: its setting, the metrics table, the splits, the
    gradient probes, every compute meter and the post-hoc best-of-the-others."""
    lines: list[str] = []
    horizon = er.get("horizon")
    th = er.get("threshold", {})
    lines += [
        f"## {env} (budget {er['budget']} {unit}/update, {horizon:,.0f} {unit} in all; evaluated on {er.get('eval_split')} tasks, "
        f"{er.get('eval_episodes')} episode(s) each; seeds {er.get('seeds')})",
        "",
    ]
    if er.get("data", {}).get("train", {}).get("data_source"):
        lines += [data_line(er["data"]), ""]
    warm = er.get("warm_start", {})
    lines += [
        f"Warm start (update 0, the same policy for every algorithm of a seed): {warm.get('mean', float('nan')):.3f} "
        f"(per seed {', '.join(f'{v:.3f}' for v in warm.get('per_seed', []))}). Threshold: warm start + "
        f"{th.get('fraction')} × ({th.get('target_success')} − warm start).",
        "",
        f"| algorithm | AUC | final success | {unit} to threshold (not reached) | Δ{er.get('primary_metric')} vs {comparator} (MDE) "
        "| env steps/update | flops/update | budget used |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a, r in er["algorithms"].items():
        m = r["metrics"]
        vs = er.get("vs_comparator", {}).get(a, {}).get(er.get("primary_metric", "auc"))
        delta = f"{_diff(vs)} ({_mde(vs)})" if vs else "(comparator)"
        c2t = m["compute_to_threshold"]
        n = len(m["auc"].get("per_seed") or [])
        c2t_cell = f"{_number(c2t['mean'])} ({_na(n)})" if n < MIN_SEEDS else f"{_number(c2t['mean'])} ± {_number(c2t['ci95'])}"
        lines.append(
            f"| {a} | {unit_interval(m['auc']['per_seed'], m['auc']['ci95'])} | {unit_interval(m['final']['per_seed'], m['final']['ci95'])} "
            f"| {c2t_cell} ({c2t.get('not_reached', 0)}) | {delta} "
            f"| {r['compute']['env_steps']:.0f} | {r['compute'].get('flops', float('nan')):.3g} | {r['budget_used_ratio']:.2f} |"
        )
    lines += split_lines(er)
    lines += _gradient_lines(er)
    lines += _meter_lines(er, unit)
    best = er.get("treatment_vs_best_baseline")
    if best:
        lines += [
            "",
            f"Secondary, chosen after seeing the results (biased against the treatment when nothing differs): "
            f"{best['treatment']} − {best['best_baseline']} (the baseline with the best mean final success) "
            f"{_pm(best['success_diff'], best['success_diff_ci95'], 3, _seeds(best))} final success ({_mde(best)}).",
        ]
    lines.append("")
    return lines


def _gradient_lines(er: dict[str, Any]) -> list[str]:
    """The gradient probes' table of one env (none when no run probed)."""
    if not any(r.get("gradient_initial") for r in er["algorithms"].values()):
        return []
    lines: list[str] = []
    first = next(r for r in er["algorithms"].values() if r.get("gradient_initial"))
    probe = first["gradient_initial"]
    mid = first.get("gradient_mid") or {}
    lines += [
        "",
        f"Gradient signal-to-noise `ŝ / tr Cov(g)` ({probe['batches']} independent batches at the training budget; "
        f"[95% bootstrap interval]) at the warm start and at update {mid.get('update', '–')}; alignment with RLOO: "
        "`ḡ · r̄ / √(signal · signal_ref)` against a reference RLOO gradient at the same policy, the cosine of the two "
        "expected gradients estimated without the noise's pull towards 0, so that with few batches it can pass ±1 (1: "
        "the same direction; docs/main-job.md):",
        "",
        "| algorithm | SNR, warm start | SNR, mid-training | alignment with RLOO, warm start | alignment with RLOO, mid-training |",
        "|---|---:|---:|---:|---:|",
    ]
    for a, r in er["algorithms"].items():
        lines.append(
            f"| {a} | {_snr_cell(r.get('gradient_initial'))} | {_snr_cell(r.get('gradient_mid'))} "
            f"| {_snr_cell(r.get('gradient_initial'), 'cosine')} | {_snr_cell(r.get('gradient_mid'), 'cosine')} |"
        )
    return lines


def _meter_lines(er: dict[str, Any], unit: str) -> list[str]:
    """Every compute meter per update of one env (the budget unit is one of them)."""
    lines: list[str] = []
    meters = [k for k in METER_COLUMNS if all(k in r["compute"] for r in er["algorithms"].values())]
    lines += [
        "",
        "Compute per update (every meter; the budget unit is one of them):",
        "",
        "| algorithm | " + " | ".join(k.replace("_", " ") for k in meters) + " |",
        "|---|" + "---:|" * len(meters),
    ]
    for a, r in er["algorithms"].items():
        lines.append(f"| {a} | " + " | ".join(_number(r["compute"][k]) for k in meters) + " |")
    return lines


def _trees_lines(trees: dict[str, dict[str, str]]) -> list[str]:
    """Links to the example rollout trees (none when no tree was drawn)."""
    lines: list[str] = []
    if trees:
        lines += [
            "## Example rollout trees",
            "",
            "One tree of the last training batch of each env and algorithm (first seed): where it branched, "
            "with what decision entropy, what each leaf returned, and each step's advantage (colour) and weight "
            "(width). `bpo-trees RUN_DIR` draws the others.",
            "",
        ]
        for env, pictures in trees.items():
            links = " · ".join(f"[{a}]({p})" for a, p in pictures.items())
            lines.append(f"* {env}: {links}")
        lines.append("")
    return lines


def _provenance_lines(results: dict[str, Any]) -> list[str]:
    """Which code versions made the results, and the wall time."""
    lines: list[str] = []
    versions = results.get("code_versions") or []
    if len(versions) > 1:
        lines += [f"**Made by {len(versions)} code versions** (a folder resumed after the code changed): "
                  + "; ".join(versions) + ". Numbers from different versions may not be comparable; run into a new "
                  "`--out` for one version.", ""]
    elif versions:
        lines += [f"Code: {versions[0]}.", ""]
    timing = results.get("timing")
    if timing:
        sessions = timing.get("sessions") or []
        total = timing.get("total_wall_seconds", timing["wall_seconds"])
        text = f"Wall time: {total / 60:.1f} min with {timing['jobs']} job(s)" + (f" on Ray ({timing['ray']})" if timing.get("ray") else "")
        if len(sessions) > 1:
            text += f", over {len(sessions)} sessions (" + ", ".join(f"{s['wall_seconds'] / 60:.1f}" for s in sessions) + " min)"
        loads = [s["load_start"][0] for s in sessions if s.get("load_start")] + [s["load_now"][0] for s in sessions if s.get("load_now")]
        if loads:
            text += f"; 1-min load average {min(loads):.1f}–{max(loads):.1f} on {timing.get('cpu_count')} cores"
        text += f"; the runs' own time adds up to {timing['run_seconds_total'] / 60:.1f} min"
        if timing.get("tuning_run_seconds_total"):
            text += f", the tuning runs' {timing['tuning_run_seconds_total'] / 60:.1f} min"
        lines += [text + ".", ""]
    return lines


def example_trees(runs: list[dict[str, Any]], out: Path) -> dict[str, dict[str, str]]:
    """Draw one tree per env and algorithm into ``out/trees/ENV-ALGORITHM.png``.

    From the first seed's run of each, the last saved batch (``TrainerConfig.save_trees_every``),
    the tree with the most branch nodes (the first of those). Returns the pictures' paths
    relative to ``out``, by env then algorithm; a run that saved no trees (cached by an older
    version) is skipped with a warning.
    """
    from bpo_algos.tree import load_trees
    from bpo_algos.viz import draw_tree, tree_files
    from bpo_experiments.output import run_dir

    firsts: dict[tuple[str, str], int] = {}
    for run in runs:
        firsts.setdefault((run["env"], run["algorithm"]), run["seed"])
    pictures: dict[str, dict[str, str]] = {}
    for (env, algorithm), seed in firsts.items():
        folder = run_dir(out, env, algorithm, seed)
        files = tree_files(folder) if folder.is_dir() else []
        trees = load_trees(files[-1]) if files else []
        if not trees:
            logger.warning("no saved trees in %s: no example tree for %s/%s", folder, env, algorithm)
            continue
        tree = max(trees, key=lambda t: len(t.branch_nodes()))
        path = draw_tree(tree, out / "trees" / f"{env}-{algorithm}.png", title=f"{env} · {algorithm} · seed {seed} · task {tree.task_id}")
        pictures.setdefault(env, {})[algorithm] = path.relative_to(out).as_posix()
    return pictures


def plots(results: dict[str, Any], out: Path) -> list[Path]:
    """``success.png``: evaluated success against env steps and against flops (mean over seeds,
    95% band, the warm start as a dashed line); ``final_success.png``; ``gradient_snr.png``
    (signal-to-noise at the warm start and mid-training, bootstrap intervals);
    ``training_success.png`` (the training batches' success, for reference) and
    ``grad_norm_variance.png``. A plot without data (:func:`empty_plots`) is not drawn: the
    report says why instead. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(results["per_env"])
    algorithms = list(dict.fromkeys(a for e in envs for a in results["per_env"][e]["algorithms"]))
    colours = {a: plt.get_cmap("tab10")(i % 10) for i, a in enumerate(algorithms)}
    figures = {"success.png": _success_figure, "training_success.png": _training_figure, "final_success.png": _final_figure,
               "gradient_snr.png": _snr_figure, "grad_norm_variance.png": _grad_norm_variance_figure}
    empty = empty_plots(results)
    probed = probed_envs(results)
    return [figure(results, out, probed if name in GRADIENT_PLOTS else envs, algorithms, colours)
            for name, figure in figures.items() if name not in empty]


GRADIENT_PLOTS = ("gradient_snr.png", "grad_norm_variance.png")
"""The plots of the gradient probes: drawn for the envs that probed (:func:`probed_envs`)."""


def _save(fig: Any, path: Path, **savefig: Any) -> Path:
    """Lay out ``fig``, write it to ``path`` (110 dpi) and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110, **savefig)
    plt.close(fig)
    return path


def _success_figure(results: dict[str, Any], out: Path, envs: list[str], algorithms: list[str], colours: dict[str, Any]) -> Path:
    """``success.png``: evaluated success against env steps and against flops."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(envs), figsize=(9 * len(envs), 8), squeeze=False)  # legends right of the axes
    for j, env in enumerate(envs):
        er = results["per_env"][env]
        for a, r in er["algorithms"].items():
            curve = r["eval_curve"]
            mean = np.asarray(curve["success"])
            band = np.asarray(curve["success_ci95"])
            # a calibration control at k x the budget is drawn per update (its compute / k), as its metrics read it
            multiple = r.get("budget_multiple", 1.0)
            name = a if multiple == 1 else f"{a} ({multiple:g}x budget; drawn per update: compute / {multiple:g})"
            n_seeds = len(curve["env_steps_per_seed"])
            if n_seeds != len(er.get("seeds") or []):  # e.g. the untuned defaults, run on fewer seeds
                name += f" ({n_seeds} seeds)"
            for ax, key in ((axes[0][j], "env_steps_per_seed"), (axes[1][j], "flops_per_seed")):
                xs = np.mean(np.asarray(curve[key], dtype=float), axis=0) / multiple
                style = "--" if a == (er.get("positive_control") or {}).get("algorithm") or "@" in a else "-"
                ax.plot(xs, mean, style, marker="o", markersize=3, label=name, color=colours[a])
                ax.fill_between(xs, np.clip(mean - band, 0, 1), np.clip(mean + band, 0, 1), color=colours[a], alpha=0.15, linewidth=0)
        warm = er.get("warm_start", {}).get("mean")
        seeds = len(er.get("seeds") or [])
        for ax, xlabel in ((axes[0][j], "env steps"), (axes[1][j], "flops (2P per policy token + 6P per trained token)")):
            if warm is not None:
                ax.axhline(warm, color="grey", linestyle=":", linewidth=1.2, label=f"warm start {warm:.3f}")
            ax.set(xlabel=xlabel, ylabel=f"evaluated success ({er.get('eval_split')})\nmean of {seeds} seeds, 95% band")
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        axes[0][j].set_title(f"{env}: evaluated success vs env steps")
        axes[1][j].set_title(f"{env}: evaluated success vs flops")
    return _save(fig, out / "success.png", bbox_inches="tight")


def _training_figure(results: dict[str, Any], out: Path, envs: list[str], algorithms: list[str], colours: dict[str, Any]) -> Path:
    """``training_success.png``: the training batches' success."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(envs), figsize=(6 * len(envs), 4), squeeze=False)
    for j, env in enumerate(envs):
        ax = axes[0][j]
        for a, r in results["per_env"][env]["algorithms"].items():
            mean = np.asarray(r["curve"])
            band = np.asarray(r.get("curve_ci95", np.zeros_like(mean)))
            x = np.arange(1, len(mean) + 1)
            ax.plot(x, mean, label=a, color=colours[a])
            ax.fill_between(x, np.clip(mean - band, 0, 1), np.clip(mean + band, 0, 1), color=colours[a], alpha=0.15, linewidth=0)
        ax.set(title=f"{env}: training batches' success (the tasks drawn that update)", xlabel="update", ylabel="batch success")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=8)
    return _save(fig, out / "training_success.png")


def _final_figure(results: dict[str, Any], out: Path, envs: list[str], algorithms: list[str], colours: dict[str, Any]) -> Path:
    """``final_success.png``: final evaluated success, mean and 95% interval, seeds as dots."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(envs), figsize=(1.5 + 1.3 * len(algorithms) * len(envs), 4), squeeze=False)
    for j, env in enumerate(envs):
        er = results["per_env"][env]
        names = [a for a in algorithms if a in er["algorithms"]]
        values = [er["algorithms"][a]["success"] for a in names]
        errors = [er["algorithms"][a]["success_ci95"] for a in names]
        ax = axes[0][j]
        low = [min(e, v) for v, e in zip(values, errors, strict=True)]
        high = [min(e, 1 - v) for v, e in zip(values, errors, strict=True)]
        ax.bar(range(len(names)), values, yerr=[low, high], capsize=5, color=[colours[a] for a in names])
        for k, (v, e) in enumerate(zip(values, errors, strict=True)):
            ax.annotate(f"{v:.3f} ± {e:.3f}", (k, min(1.0, v + high[k])), textcoords="offset points", xytext=(0, 4), ha="center", fontsize=8)
        for k, a in enumerate(names):
            for s in er["algorithms"][a]["success_per_seed"]:
                ax.plot(k, s, "k.", alpha=0.5, markersize=4)
        warm = er.get("warm_start", {}).get("mean")
        if warm is not None:
            ax.axhline(warm, color="grey", linestyle=":", linewidth=1.2, label="warm start")
            ax.legend(fontsize=8)
        ax.set_xticks(range(len(names)), names, rotation=20)
        ax.set(title=f"{env}: final evaluated success ({er.get('eval_split', 'held-out')})", ylabel="success (mean, 95% CI; dots: seeds)")
        ax.set_ylim(0, 1.08)
    return _save(fig, out / "final_success.png")


def _snr_figure(results: dict[str, Any], out: Path, envs: list[str], algorithms: list[str], colours: dict[str, Any]) -> Path:
    """``gradient_snr.png``: gradient signal-to-noise at the warm start and mid-training."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(envs), figsize=(1.5 + 1.3 * len(algorithms) * len(envs), 4), squeeze=False)
    for j, env in enumerate(envs):
        er = results["per_env"][env]
        ax = axes[0][j]
        names = [a for a in algorithms if a in er["algorithms"]]
        for offset, (name, marker) in ((-0.15, ("initial", "o")), (0.15, ("mid", "s"))):
            labelled = False
            for k, a in enumerate(names):
                probe = er["algorithms"][a].get(f"gradient_{name}")
                if not probe:
                    continue
                for v, (lo, hi) in zip(probe["snr_per_seed"], probe["snr_ci95_per_seed"], strict=True):
                    if v is None or not np.isfinite(v):
                        if offset < 0:
                            ax.annotate("no gradient\n(zero loss)", (k, 0), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
                        continue
                    ax.errorbar(k + offset, v, yerr=[[max(v - lo, 0)], [max(hi - v, 0)]], fmt=marker, color=colours[a], capsize=3,
                                label=None if labelled else ("warm start" if name == "initial" else "mid-training"))
                    labelled = True
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(names)), names, rotation=20)
        ax.set(title=f"{env}: gradient SNR ŝ / tr Cov(g) (o warm start, □ mid)", ylabel="SNR per batch [95% bootstrap]")
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(fontsize=8)
    return _save(fig, out / "gradient_snr.png")


def _grad_norm_variance_figure(results: dict[str, Any], out: Path, envs: list[str], algorithms: list[str], colours: dict[str, Any]) -> Path:
    """``grad_norm_variance.png``: gradient-norm variance at the warm start."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 2.5 + 2 * len(envs)), 4))
    width = 0.8 / max(1, len(algorithms))
    positive = False
    for i, a in enumerate(algorithms):
        values = [(results["per_env"][e]["algorithms"].get(a, {}).get("gradient_initial") or {}).get("grad_norm_var", np.nan) for e in envs]
        positive = positive or any(np.isfinite(v) and v > 0 for v in values)
        ax.bar(np.arange(len(envs)) + (i - (len(algorithms) - 1) / 2) * width, values, width, label=a, color=colours[a])
    ax.set_xticks(np.arange(len(envs)), envs)
    # a log axis needs a positive value (a policy that never earns a reward has no gradient)
    scale = "log" if positive else "linear"
    ax.set(title="gradient-norm variance at the warm start (same budget)", ylabel=f"Var ||g|| ({scale} scale)")
    ax.set_yscale(scale)
    ax.legend(fontsize=8)
    return _save(fig, out / "grad_norm_variance.png")



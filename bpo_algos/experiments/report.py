"""The main job's report: ``results.md`` and the plots.

The plots show what the table says: success over training as the mean over seeds with a shaded
95% band, the final success on the evaluation tasks per algorithm with its 95% interval, and the
gradient-norm variance at the initial policy.
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


def markdown(results: dict[str, Any]) -> str:
    unit = results["budget_unit"]
    algorithms = list(results["preset"].get("algorithms", ()))
    lines = [
        f"# {' vs '.join(a.upper() for a in algorithms) or 'Comparison'} at matched compute",
        "",
        f"Budget unit: `{unit}` per update; seeds {results['seeds']}; means with 95% t-intervals over seeds.",
        "`success`: final policy, sampled, on each env's evaluation tasks (the split named in its heading and data line); "
        "`grad-norm var`: variance of the gradient norm over "
        "independent batches at the initial policy (same budget); `noise/signal`: tr Cov(g) / ||E g||^2 there "
        "(median over seeds; scale-free, so GRPO's std scaling does not count); `updates to target`: updates to reach the best "
        "baseline's final training success.",
        "",
    ]
    for env, er in results["per_env"].items():
        lines += [
            f"## {env} (budget {er['budget']} {unit}/update, target {er['target_success']:.3f}, "
            f"success on {er.get('eval_split', 'held-out')} tasks, seeds {er.get('seeds')})",
            "",
            f"| algorithm | success | {unit}/update | budget used | leaves/update | env steps/update | grad-norm var | tr Cov(g) "
            "| noise/signal | updates to target |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        if er.get("data", {}).get("train", {}).get("data_source"):
            lines[-2:-2] = [data_line(er["data"]), ""]
        for a, r in er["algorithms"].items():
            lines.append(
                f"| {a} | {r['success']:.3f} ± {r['success_ci95']:.3f} | {r['compute'][unit]:.0f} | {r['budget_used_ratio']:.2f} "
                f"| {r['compute']['leaves']:.1f} | {r['compute']['env_steps']:.0f} | {r['grad_norm_var']:.3g} "
                f"| {r['grad_trace_var']:.3g} | {r.get('grad_noise_to_signal', float('nan')):.3g} "
                f"| {r['updates_to_target'] if r['updates_to_target'] is not None else 'not reached'} |"
            )
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
        paired = er.get("treatment_vs_best_baseline")
        if paired:
            lines += [
                "",
                f"{paired['treatment'].upper()} − {paired['best_baseline']} (the best baseline), paired by seed: success "
                f"{paired['success_diff']:+.3f} ± {paired['success_diff_ci95']:.3f}; gradient-norm variance "
                f"{paired['grad_norm_var_ratio']:.2f}×, tr Cov(g) {paired['grad_trace_var_ratio']:.2f}× the baseline's "
                "(gradient-norm variance against each baseline: "
                + ", ".join(f"{b} {v:.2f}×" for b, v in paired["grad_norm_var_ratio_vs"].items())
                + "; noise/signal: "
                + ", ".join(f"{b} {v:.2f}×" for b, v in paired["noise_to_signal_ratio_vs"].items())
                + ").",
            ]
        lines.append("")
    lines += [
        "![success](success.png)",
        "",
        "![final success](final_success.png)",
        "",
        "![gradient-norm variance](grad_norm_variance.png)",
        "",
    ]
    trees = results.get("example_trees") or {}
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
    return "\n".join(lines) + "\n"


def example_trees(runs: list[dict[str, Any]], out: Path) -> dict[str, dict[str, str]]:
    """Draw one tree per env and algorithm into ``out/trees/ENV-ALGORITHM.png``.

    From the first seed's run of each, the last saved batch (``TrainerConfig.save_trees_every``),
    the tree with the most branch nodes (the first of those). Returns the pictures' paths
    relative to ``out``, by env then algorithm; a run that saved no trees (cached by an older
    version) is skipped with a warning.
    """
    from bpo_algos.experiments.runner import run_dir
    from bpo_algos.tree import load_trees
    from bpo_algos.viz import draw_tree, tree_files

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
    """``success.png`` (vs updates and vs compute, mean over seeds and 95% band),
    ``final_success.png`` (evaluation success and interval) and ``grad_norm_variance.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(results["per_env"])
    algorithms = list(results["preset"].get("algorithms") or results["algorithms"])
    colours = {a: plt.get_cmap("tab10")(i % 10) for i, a in enumerate(algorithms)}
    paths = []
    fig, axes = plt.subplots(2, len(envs), figsize=(5 * len(envs), 7), squeeze=False)
    for j, env in enumerate(envs):
        for a, r in results["per_env"][env]["algorithms"].items():
            mean = np.asarray(r["curve"])
            band = np.asarray(r.get("curve_ci95", np.zeros_like(mean)))
            x = np.arange(1, len(mean) + 1)
            compute = np.asarray(r["compute_curve"])
            for ax, xs in ((axes[0][j], x), (axes[1][j], compute)):
                ax.plot(xs, mean, label=a, color=colours[a])
                # a success rate lives in [0, 1]; the t-band of few seeds can reach past it
                ax.fill_between(xs, np.clip(mean - band, 0, 1), np.clip(mean + band, 0, 1), color=colours[a], alpha=0.2, linewidth=0)
        seeds = len(results["per_env"][env].get("seeds") or [])
        axes[0][j].set(title=f"{env}: training success", xlabel="update", ylabel=f"batch success (mean of {seeds} seeds, 95% band)")
        axes[1][j].set(title=f"{env}: success vs compute", xlabel=results["budget_unit"], ylabel="batch success")
        for ax in (axes[0][j], axes[1][j]):
            ax.set_ylim(-0.02, 1.02)
            ax.legend()
    fig.tight_layout()
    paths.append(out / "success.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

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
        ax.set_xticks(range(len(names)), names)
        ax.set(title=f"{env}: final success ({er.get('eval_split', 'held-out')} tasks)", ylabel="success (mean, 95% CI; dots: seeds)")
        ax.set_ylim(0, 1.08)
    fig.tight_layout()
    paths.append(out / "final_success.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(2.5 + 2 * len(envs), 4))
    width = 0.8 / max(1, len(algorithms))
    positive = False
    for i, a in enumerate(algorithms):
        values = [results["per_env"][e]["algorithms"].get(a, {}).get("grad_norm_var", np.nan) for e in envs]
        positive = positive or any(np.isfinite(v) and v > 0 for v in values)
        ax.bar(np.arange(len(envs)) + (i - (len(algorithms) - 1) / 2) * width, values, width, label=a, color=colours[a])
    ax.set_xticks(np.arange(len(envs)), envs)
    # a log axis needs a positive value (a policy that never earns a reward has no gradient)
    scale = "log" if positive else "linear"
    ax.set(title="gradient-norm variance at the initial policy (same budget)", ylabel=f"Var ||g|| ({scale} scale)")
    ax.set_yscale(scale)
    ax.legend()
    fig.tight_layout()
    paths.append(out / "grad_norm_variance.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths

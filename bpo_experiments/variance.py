"""Bias and variance of each estimator at a fixed policy on TreeMDP, per unit of compute.

For every setting (a TreeMDP and a fixed tabular policy) and every algorithm configuration:

* per tree: ``--batches`` one-tree gradient estimates; bias as z-scores of their mean against
  the exact gradient (by enumeration) along the true gradient and 3 random directions;
  variance ``tr Cov(g)`` and the variance along the true gradient, each times the mean cost of
  a tree in env steps (and in leaves) — the variance of an average within a budget ``B`` is
  ``var * cost / B``, so lower is better at matched compute;
* at a matched budget: ``--budget-batches`` batches of ``--budget`` env steps each, the
  variance of the batch gradient and of its norm (what a training run sees).

Writes ``variance.json`` and ``variance.md`` to ``--out``; ratios are against RLOO(4).

    bpo-variance --out results/variance          # ~10 min on 2 cores
    bpo-variance --quick --out /tmp/variance     # ~1 min
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tqdm.auto import tqdm

import bpo_envs  # noqa: F401 - registers the ids
from baselines import GRPO, RLOO, GiGPO, TreeGRPO
from bpo_algos import BPO, Budget, EnvPool, TabularPolicy
from bpo_algos.algorithm import Algorithm
from bpo_algos.diagnostics import GradientSamples, flat_gradient, gradient_samples, variance_summary
from bpo_algos.policy.tabular import _key
from bpo_envs.console import ends_on_ctrl_c
from bpo_envs.files import atomic_write, write_json

REFERENCE = "rloo-4"


def random_logits(tree: Any, rng: np.random.Generator, path: tuple[int, ...]) -> np.ndarray:
    return rng.normal(0.0, 1.0, tree.n_actions)


def agent_logits(tree: Any, rng: np.random.Generator, path: tuple[int, ...]) -> np.ndarray:
    """Confident (p ~ 0.9) at routine levels, near-uniform at decisive ones, as an LLM agent
    is on routine steps versus real decisions."""
    if len(path) in tree.decisive_levels:
        return rng.normal(0.0, 0.3, tree.n_actions)
    logits = np.zeros(tree.n_actions)
    logits[rng.integers(tree.n_actions)] = 3.0
    return logits


SETTINGS: dict[str, dict[str, Any]] = {
    "random-d4": {
        "env": {"depth": 4, "n_actions": 3, "seed": 0},
        "logits": random_logits,
        "budget": 96,
        "about": "random leaf rewards, depth 4, 3 actions, random N(0,1) logits",
    },
    "structured-d5": {
        "env": {"depth": 5, "n_actions": 3, "seed": 1, "decisive_levels": (1, 3), "routine_weight": 0.05},
        "logits": random_logits,
        "budget": 120,
        "about": "decisive levels 1 and 3 of depth 5, random N(0,1) logits",
    },
    "agent-like-d8": {
        "env": {"depth": 8, "n_actions": 3, "seed": 2, "decisive_levels": (5,), "routine_weight": 0.05},
        "logits": agent_logits,
        "budget": 192,
        "about": "depth 8, one decisive level (5); policy confident except there",
    },
    "agent-state-d8": {
        "env": {"depth": 8, "n_actions": 3, "seed": 2, "decisive_levels": (5,), "routine_weight": 0.05, "observe": "state"},
        "logits": agent_logits,
        "budget": 192,
        "about": "as agent-like-d8, observing the state (depth, decisions so far) instead of the path",
    },
}


def configurations(quick: bool) -> dict[str, Callable[[], Algorithm]]:
    common = {"aggregation": "step-sum"}
    configs: dict[str, Callable[[], Algorithm]] = {
        "rloo-4": lambda: RLOO(group_size=4, **common),
        "rloo-8": lambda: RLOO(group_size=8, **common),
        "grpo-4": lambda: GRPO(group_size=4, **common),
        "bpo-K0=2-K=2-h>0": lambda: BPO(backbones=2, branch_factor=2, entropy_threshold=0.0, **common),
        "bpo-K0=2-K=4-q0.8": lambda: BPO(backbones=2, branch_factor=4, entropy_quantile=0.8, **common),
        "bpo-K0=4-K=2-q0.8": lambda: BPO(backbones=4, branch_factor=2, entropy_quantile=0.8, **common),
        "bpo-K0=2-K=3-M2-q0.5": lambda: BPO(backbones=2, branch_factor=3, max_branch_points=2, entropy_quantile=0.5, **common),
        "bpo-K0=2-K=4-q0.95": lambda: BPO(backbones=2, branch_factor=4, entropy_quantile=0.95, **common),
        "bpo-nested-K0=2-K=2-d2": lambda: BPO(backbones=2, branch_factor=2, max_depth=2, entropy_quantile=0.5, **common),
        # state-anchored baselines (docs/unbiasedness.md, rule 6) and the published step-level methods
        "rloo-4-anchored": lambda: RLOO(group_size=4, baseline="anchored", **common),
        "rloo-4-anchored+history": lambda: RLOO(group_size=4, baseline="anchored+history", **common),
        "bpo-K0=2-K=4-q0.8-anchored": lambda: BPO(backbones=2, branch_factor=4, entropy_quantile=0.8, baseline="anchored", **common),
        "bpo-K0=2-K=4-q0.8-anchored+history": lambda: BPO(
            backbones=2, branch_factor=4, entropy_quantile=0.8, baseline="anchored+history", **common
        ),
        "rloo-4-anchored-min3": lambda: RLOO(group_size=4, baseline="anchored", min_matches=3, **common),
        "bpo-K0=2-K=4-q0.8-anchored+history-min3": lambda: BPO(
            backbones=2, branch_factor=4, entropy_quantile=0.8, baseline="anchored+history", min_matches=3, **common
        ),
        "gigpo-4": lambda: GiGPO(group_size=4, **common),
        "tree-grpo-m2n2l1k3": lambda: TreeGRPO(**common),
    }
    if quick:
        keep = ("rloo-4", "grpo-4", "bpo-K0=2-K=2-h>0", "bpo-K0=2-K=4-q0.8", "rloo-4-anchored", "gigpo-4", "tree-grpo-m2n2l1k3")
        configs = {k: v for k, v in configs.items() if k in keep}
    return configs


def fixed_policy(setting: dict[str, Any], seed: int) -> tuple[Any, TabularPolicy, Callable[[], gym.Env]]:
    kwargs = setting["env"]

    def make() -> gym.Env:
        return gym.make("BPO-TreeMDP-v0", **kwargs)

    tree = make().unwrapped
    rng = np.random.default_rng(seed)
    policy = TabularPolicy(seed=seed)
    for depth in range(tree.depth):
        for prefix in np.ndindex(*([tree.n_actions] * depth)):
            policy.set_logits(tree.observation_of(0, tuple(prefix)), setting["logits"](tree, rng, tuple(prefix)))
    for p in policy.parameters():
        p.requires_grad_(True)
    return tree, policy, make


def level_coordinates(tree: Any, policy: TabularPolicy) -> dict[int, list[int]]:
    """Indices into the flat gradient of the table entries of each depth (decision level)."""
    offsets, start = {}, 0
    for name, p in policy.table.items():
        offsets[name] = (start, start + p.numel())
        start += p.numel()
    levels: dict[int, set[int]] = {}
    for depth in range(tree.depth):
        for prefix in np.ndindex(*([tree.n_actions] * depth)):
            name = _key(tree.observation_of(0, tuple(prefix)))
            if name in offsets:
                levels.setdefault(depth, set()).update(range(*offsets[name]))
    return {d: sorted(ix) for d, ix in sorted(levels.items())}


def per_level_variance(samples: GradientSamples, levels: dict[int, list[int]]) -> dict[str, float]:
    """``tr Cov(g)`` restricted to each level's coordinates, times the mean env steps."""
    g = samples.grads.double()
    cost = samples.mean_cost("env_steps")
    out = {}
    for depth, ix in levels.items():
        sub = g[:, [i for i in ix if i < g.shape[1]]]
        out[str(depth)] = float(sub.var(dim=0, unbiased=True).sum()) * cost
    return out


def exact_gradient(tree: Any, policy: TabularPolicy) -> torch.Tensor:
    policy.zero_grad()
    tree.expected_return(policy.log_probs).backward()
    grad = flat_gradient(list(policy.parameters())).clone()
    policy.zero_grad()
    return grad


def measure(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"settings": {}, "reference": REFERENCE, "args": vars(args)}
    configs = configurations(args.quick)
    if args.configs:
        unknown = sorted(set(args.configs) - set(configs))
        if unknown:
            raise SystemExit(f"unknown --configs {unknown}; known: {', '.join(configs)}")
        configs = {k: v for k, v in configs.items() if k in args.configs or k == REFERENCE}
    for name in args.settings:
        setting = SETTINGS[name]
        tree, policy, make = fixed_policy(setting, args.seed)
        truth = exact_gradient(tree, policy)
        levels = level_coordinates(tree, policy)
        rows: dict[str, Any] = {}
        bar = tqdm(configs.items(), desc=name, leave=False)
        for label, factory in bar:
            bar.set_postfix(config=label)
            start = time.perf_counter()
            algorithm = factory()
            if args.warmup:  # let adaptive thresholds settle on earlier batches
                _samples(algorithm, policy, make, args.warmup)
            one_tree = _samples(algorithm, policy, make, args.batches)
            per_tree = variance_summary(one_tree, truth)
            per_tree["per_level_trace_var_x_env_steps"] = per_level_variance(one_tree, levels)
            matched = variance_summary(
                _samples(algorithm, policy, make, args.budget_batches, Budget("env_steps", setting["budget"])),
                truth,
            )
            rows[label] = {
                "per_tree": per_tree,
                "matched_budget": {"env_steps": setting["budget"], **matched},
                "threshold": algorithm.threshold,
                "seconds": time.perf_counter() - start,
            }
        add_ratios(rows)
        results["settings"][name] = {
            "about": setting["about"],
            "env": {k: v for k, v in setting["env"].items()},
            "true_grad_norm": float(truth.norm()),
            "configs": rows,
        }
    return results


def _samples(algorithm: Algorithm, policy: TabularPolicy, make: Callable[[], gym.Env], n: int, budget: Budget | None = None) -> GradientSamples:
    """``n`` gradient samples on task 0 from a fresh pool of two TreeMDP envs, stepped in this
    thread: a TreeMDP step is microseconds of Python, and the pools' default per-step deadline
    would hand each step to a worker thread, costing more than the step (same samples)."""
    pool = EnvPool([make, make], step_timeout_s=None)
    try:
        return gradient_samples(algorithm, policy, pool, [0], n, budget)
    finally:
        pool.close()


def add_ratios(rows: dict[str, Any]) -> None:
    """``ratios_vs_reference`` of every row, against :data:`REFERENCE`."""
    ref = rows.get(REFERENCE)
    if ref is None:
        return
    for row in rows.values():
        pt, rt = row["per_tree"], ref["per_tree"]
        mb, rb = row["matched_budget"], ref["matched_budget"]
        row["ratios_vs_reference"] = {
            "trace_var_x_env_steps": pt["trace_var_x_env_steps"] / rt["trace_var_x_env_steps"],
            "trace_var_x_leaves": pt["trace_var_x_leaves"] / rt["trace_var_x_leaves"],
            "var_along_truth_x_env_steps": pt["var_along_truth_x_env_steps"] / rt["var_along_truth_x_env_steps"],
            "matched_trace_var": mb["trace_var"] / rb["trace_var"],
            "matched_grad_norm_var": mb["grad_norm_var"] / rb["grad_norm_var"],
            # scale-free (std-normalised estimators inflate every variance by a constant)
            "noise_to_signal_x_env_steps": (pt["noise_to_signal"] * pt["cost"]["env_steps"])
            / (rt["noise_to_signal"] * rt["cost"]["env_steps"]),
            "matched_noise_to_signal": mb["noise_to_signal"] / rb["noise_to_signal"],
            "per_level_trace_var_x_env_steps": {
                d: v / rt["per_level_trace_var_x_env_steps"][d] if rt["per_level_trace_var_x_env_steps"].get(d) else float("nan")
                for d, v in pt["per_level_trace_var_x_env_steps"].items()
            },
        }


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "# Gradient bias and variance at a fixed policy (TreeMDP)",
        "",
        f"Ratios are against {REFERENCE}; below 1 means less variance for the same compute.",
        "`var x steps` = tr Cov(g) of a one-tree estimate x its mean env steps; `along` = the same",
        "along the true gradient; `matched` = at a fixed env-step budget per batch; `N/S` = the",
        "scale-free noise-to-signal tr Cov(g) / ||E g||^2 (x env steps for one tree; at the matched",
        "budget), the fair figure for the std-normalised GRPO and Tree-GRPO.",
        "",
    ]
    for name, setting in results["settings"].items():
        lines += [
            f"## {name}: {setting['about']}",
            "",
            "| config | max abs z | steps/tree | leaves/tree | var x steps (ratio) | var x leaves (ratio) | along x steps (ratio) | matched tr var (ratio) | matched grad-norm var (ratio) | N/S x steps (ratio) | matched N/S (ratio) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for label, row in setting["configs"].items():
            pt, r = row["per_tree"], row.get("ratios_vs_reference", {})
            lines.append(
                f"| {label} | {pt['max_abs_z']:.1f} | {pt['cost']['env_steps']:.1f} | {pt['cost']['leaves']:.1f} "
                f"| {pt['trace_var_x_env_steps']:.3g} ({r.get('trace_var_x_env_steps', float('nan')):.2f}) "
                f"| {pt['trace_var_x_leaves']:.3g} ({r.get('trace_var_x_leaves', float('nan')):.2f}) "
                f"| {pt['var_along_truth_x_env_steps']:.3g} ({r.get('var_along_truth_x_env_steps', float('nan')):.2f}) "
                f"| {row['matched_budget']['trace_var']:.3g} ({r.get('matched_trace_var', float('nan')):.2f}) "
                f"| {row['matched_budget']['grad_norm_var']:.3g} ({r.get('matched_grad_norm_var', float('nan')):.2f}) "
                f"| {r.get('noise_to_signal_x_env_steps', float('nan')):.2f} | {r.get('matched_noise_to_signal', float('nan')):.2f} |"
            )
        lines.append("")
        levels = next(iter(setting["configs"].values()))["per_tree"].get("per_level_trace_var_x_env_steps", {})
        if levels:
            lines += [
                f"Per decision level (tr Cov(g) over that depth's table entries x env steps, ratio to {REFERENCE}):",
                "",
                "| config | " + " | ".join(f"depth {d}" for d in levels) + " |",
                "|---|" + "---:|" * len(levels),
            ]
            for label, row in setting["configs"].items():
                r = row.get("ratios_vs_reference", {}).get("per_level_trace_var_x_env_steps", {})
                lines.append(f"| {label} | " + " | ".join(f"{r.get(d, float('nan')):.2f}" for d in levels) + " |")
            lines.append("")
    lines.append(
        "GRPO, GiGPO and Tree-GRPO are biased as published (std divisions; group means that include "
        "the sample itself), so a large |z| is expected of them."
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/variance", help="output folder")
    parser.add_argument("--batches", type=int, default=1500, help="one-tree estimates per config")
    parser.add_argument("--budget-batches", type=int, default=300, help="matched-budget batches per config")
    parser.add_argument("--warmup", type=int, default=20, help="batches that set adaptive thresholds first")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--configs", nargs="+", help="only these configurations (and the reference)")
    parser.add_argument("--quick", action="store_true", help="fewer configs and samples (~1 min)")
    args = parser.parse_args(argv)
    if args.quick:
        args.batches, args.budget_batches, args.warmup = 300, 60, 10
    torch.manual_seed(args.seed)
    results = measure(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "variance.json", results, indent=2)
    atomic_write(out / "variance.md", markdown(results))
    print(markdown(results))
    print(f"wrote {out / 'variance.json'} and {out / 'variance.md'}")
    return results


@ends_on_ctrl_c("bpo-variance")
def cli() -> None:
    """Console entry point (``bpo-variance``)."""
    main()


if __name__ == "__main__":
    cli()

"""Distinct siblings and the measured branch rule against BPO's defaults, on exact TreeMDPs.

For each TreeMDP setting of ``bpo-variance`` (a TreeMDP and a fixed tabular policy,
:data:`bpo_experiments.variance.SETTINGS`) and each configuration: ``--batches`` one-tree
gradient estimates at the fixed policy after ``--warmup`` batches (adaptive thresholds and the
measured rule's plan settle on earlier batches, and keep updating while measured, as in
training; a batch is one tree here, so the measured rules read 64 of them, about the trees of the
default 8 training batches), and ``--budget-batches`` batches at the setting's env-step budget. Reported:

* bias: z-scores of the mean against the exact gradient (true direction and 3 random ones);
* ``trace_var_x_env_steps``: ``tr Cov(g)`` of one tree times its mean env steps (lower is better
  at matched compute), as a ratio to RLOO(4), with a 95% bootstrap interval (resampling the
  estimates of both);
* the same at the matched budget (``matched_trace_var``), and where the configuration branched.

    python benchmarks/bench_siblings.py --out docs/results/siblings           # ~25 min on 2 shared cores
    python benchmarks/bench_siblings.py --quick --out /tmp/siblings           # ~1 min

``--webshop``: instead, WebShop with the CPU default's policy (the text scorer, warm-started by
behaviour cloning on the expert, preset ``cpu``) at a fixed policy: ``--webshop-batches`` batch
gradients at the preset's env-step budget (256) per configuration after ``--webshop-warmup``
batches, over its first 16 training tasks; the ratio of their trace variance to RLOO(4)'s, with a
95% bootstrap interval, and where each configuration branched (``webshop.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from baselines import RLOO
from bpo_algos import BPO, Budget
from bpo_algos.algorithm import Algorithm
from bpo_algos.diagnostics import gradient_samples, projection_z_scores, variance_summary
from bpo_envs.seeding import key_seed
from bpo_experiments.variance import SETTINGS, exact_gradient, fixed_policy

REFERENCE = "rloo-4"
BASE = {"backbones": 2, "branch_factor": 4, "entropy_quantile": 0.8, "aggregation": "step-sum"}
MEASURED = {"measure_window": 64}
"""Here a batch is one tree; 64 of them are about the 8 training batches the default window reads."""


def configurations() -> dict[str, Callable[[], Algorithm]]:
    return {
        "rloo-4": lambda: RLOO(group_size=4, aggregation="step-sum"),
        "bpo-entropy-iid": lambda: BPO(**BASE),
        "bpo-entropy-distinct": lambda: BPO(**BASE, siblings="distinct"),
        "bpo-entropy-distinct+backbones": lambda: BPO(**BASE, siblings="distinct", distinct_backbones=True),
        "bpo-measured-iid": lambda: BPO(**BASE, **MEASURED, branch_rule="measured"),
        "bpo-entropy+measured-iid": lambda: BPO(**BASE, **MEASURED, branch_rule="entropy+measured"),
        "bpo-measured-distinct+backbones": lambda: BPO(**BASE, **MEASURED, branch_rule="measured", siblings="distinct", distinct_backbones=True),
    }


def trace_var(g: torch.Tensor) -> float:
    return float(g.double().var(dim=0, unbiased=True).sum())


def _resampled_trace_var(gram: np.ndarray, idx: np.ndarray) -> float:
    """``tr Cov`` of the rows ``idx`` (with repeats) from the Gram matrix of the rows:
    ``(sum_i G_ii - sum_ij G_ij / n) / (n - 1)``."""
    sub = gram[np.ix_(idx, idx)]
    n = len(idx)
    return float((np.trace(sub) - sub.sum() / n) / (n - 1))


def ratio_interval(g: torch.Tensor, cost: np.ndarray, ref: torch.Tensor, ref_cost: np.ndarray, seed: int, draws: int) -> list[float]:
    """95% percentile bootstrap of ``(tr Cov(g) x mean cost) / (same for ref)``."""
    rng = np.random.default_rng(seed)
    gram, ref_gram = (x.double() @ x.double().T for x in (g, ref))
    gram, ref_gram = gram.numpy(), ref_gram.numpy()
    out = []
    for _ in range(draws):
        a = rng.integers(len(g), size=len(g))
        b = rng.integers(len(ref), size=len(ref))
        out.append(_resampled_trace_var(gram, a) * cost[a].mean() / (_resampled_trace_var(ref_gram, b) * ref_cost[b].mean()))
    return [float(np.nanpercentile(out, 2.5)), float(np.nanpercentile(out, 97.5))]


def add_ratios(rows: dict[str, dict[str, Any]], kept: dict[str, tuple[torch.Tensor, np.ndarray]],
               statistic: str, seed: int, draws: int) -> None:
    """Each row's ``ratio_vs_rloo4`` (its ``statistic`` over RLOO(4)'s) and ``ratio_vs_rloo4_ci95``
    (:func:`ratio_interval` of the gradients and costs ``kept[label]``), the bootstrap keyed by
    ``(seed, the row's position)``."""
    ref, ref_cost = kept[REFERENCE]
    for i, (label, row) in enumerate(rows.items()):
        g, cost = kept[label]
        row["ratio_vs_rloo4"] = row[statistic] / rows[REFERENCE][statistic]
        row["ratio_vs_rloo4_ci95"] = ratio_interval(g, cost, ref, ref_cost, key_seed(seed, i), draws)


def branch_depths(algorithm: Algorithm, policy: Any, make: Callable[[], Any], batches: int) -> dict[str, int]:
    counts: Counter[int] = Counter()
    for _ in range(batches):
        batch = algorithm.collect(policy, [make, make], [0], finish=False)
        counts.update(n.depth for t in batch.trees for n in t.branch_nodes() if n is not t.root)
        algorithm.end_batch(batch)
    return {str(d): c for d, c in sorted(counts.items())}


def save(results: dict[str, Any], out: Path, name: str, text: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(results, indent=1))
    (out / ("README.md" if name == "siblings" else f"{name}.md")).write_text(text)


def run(args: argparse.Namespace) -> dict[str, Any]:
    configs = configurations()
    results: dict[str, Any] = {
        "about": "distinct siblings (rule 7) and the measured branch rule vs BPO's defaults, fixed tabular policy, exact TreeMDPs",
        "args": vars(args),
        "load_average_at_start": os.getloadavg(),
        "machine": platform.platform(),
        "settings": {},
    }
    for name in args.settings:
        setting = SETTINGS[name]
        tree, policy, make = fixed_policy(setting, args.seed)
        truth = exact_gradient(tree, policy)
        rows: dict[str, Any] = {}
        kept: dict[str, tuple[torch.Tensor, np.ndarray]] = {}
        for label, factory in configs.items():
            start = time.perf_counter()
            algorithm = factory()
            if args.warmup:
                gradient_samples(algorithm, policy, [make, make], [0], args.warmup)
            one = gradient_samples(algorithm, policy, [make, make], [0], args.batches, keep_grads=True)
            cost = np.array([c["env_steps"] for c in one.costs])
            kept[label] = (one.grads, cost)
            per_tree = variance_summary(one, truth)
            matched = variance_summary(
                gradient_samples(algorithm, policy, [make, make], [0], args.budget_batches, budget=Budget("env_steps", setting["budget"])),
                truth,
            )
            rows[label] = {
                "z_scores": projection_z_scores(one.grads, truth),
                "trace_var_x_env_steps": trace_var(one.grads) * float(cost.mean()),
                "env_steps_per_tree": float(cost.mean()),
                "var_along_truth_x_env_steps": per_tree["var_along_truth_x_env_steps"],
                "matched_trace_var": matched["trace_var"],
                "branch_depths": branch_depths(algorithm, policy, make, args.depth_batches),
                "plan": {str(d): q for d, q in algorithm.depths.plan().items()} if isinstance(algorithm, BPO) else None,
                "seconds": time.perf_counter() - start,
            }
            print(f"{name} {label}: {rows[label]['trace_var_x_env_steps']:.4g} ({rows[label]['seconds']:.0f} s)", flush=True)
        add_ratios(rows, kept, "trace_var_x_env_steps", args.seed, args.boot)
        for row in rows.values():
            row["matched_ratio_vs_rloo4"] = row["matched_trace_var"] / rows[REFERENCE]["matched_trace_var"]
        results["settings"][name] = {"about": setting["about"], "env": dict(setting["env"]), "configs": rows}
        results["load_average_at_end"] = os.getloadavg()
        save(results, Path(args.out), "siblings", markdown(results))  # each setting as it finishes
    return results


WEBSHOP_CONFIGS = ("rloo-4", "bpo-entropy-iid", "bpo-entropy-distinct+backbones", "bpo-measured-iid", "bpo-entropy+measured-iid")


def run_webshop(args: argparse.Namespace) -> dict[str, Any]:
    from bpo_algos.rollout import EnvPool
    from bpo_experiments.build import make_policy
    from bpo_experiments.presets import PRESETS
    from bpo_experiments.run_config import env_config
    from bpo_experiments.tasks import env_factory, task_split

    load_at_start = os.getloadavg()
    preset = PRESETS["cpu"]
    setup = preset.envs["webshop"]
    train, _ = task_split(setup)
    tasks = train[:16]
    torch.set_num_threads(1)
    webshop = env_config(preset, "webshop")
    policy = make_policy(webshop.policy, setup, args.seed, train)
    budget = Budget("env_steps", webshop.budget)
    pool = EnvPool([env_factory(setup)] * 2)
    configs = configurations()
    rows: dict[str, Any] = {}
    kept: dict[str, tuple[torch.Tensor, np.ndarray]] = {}
    try:
        for label in WEBSHOP_CONFIGS:
            start = time.perf_counter()
            algorithm = configs[label]()
            if args.webshop_warmup:
                gradient_samples(algorithm, policy, pool, tasks, args.webshop_warmup, budget=budget, keep_grads=False)
            depths: Counter[int] = Counter()
            grads, steps = [], []
            for _ in range(args.webshop_batches):  # one batch at a time, to count where it branched
                batch = algorithm.collect(policy, pool, tasks, budget, finish=False)
                depths.update(n.depth for t in batch.trees for n in t.branch_nodes() if n is not t.root)
                params = [p for p in policy.parameters() if p.requires_grad]
                for p in params:
                    p.grad = None
                algorithm.loss(policy, batch).backward()
                grads.append(-torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]))
                steps.append(batch.compute.env_steps)
                algorithm.end_batch(batch)
            for p in policy.parameters():
                p.grad = None
            g = torch.stack(grads)
            kept[label] = (g, np.ones(len(g)))  # batches at one budget: their trace variance, not times a cost
            rows[label] = {
                "trace_var": trace_var(g),
                "env_steps_per_batch": float(np.mean(steps)),
                "branch_depths": {str(d): c for d, c in sorted(depths.items())},
                "plan": {str(d): q for d, q in algorithm.depths.plan().items()} if isinstance(algorithm, BPO) else None,
                "seconds": time.perf_counter() - start,
            }
            print(f"webshop {label}: {rows[label]['trace_var']:.4g} ({rows[label]['seconds']:.0f} s)", flush=True)
    finally:
        pool.close()
    add_ratios(rows, kept, "trace_var", args.seed, args.boot)
    return {
        "about": "batch-gradient trace variance at the CPU default's env-step budget, WebShop, warm-started text scorer, fixed policy",
        "args": vars(args),
        "env": {"id": setup.env_id, **setup.kwargs, "tasks": len(tasks), "budget_env_steps": budget.amount},
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        "configs": rows,
    }


def _ratio_and_depths(row: dict[str, Any]) -> tuple[str, str]:
    """A table row's cells: the ratio to RLOO(4) with its 95% interval, and where it branched."""
    ci = row["ratio_vs_rloo4_ci95"]
    depths = ", ".join(f"{d}:{c}" for d, c in row["branch_depths"].items()) or "-"
    return f"{row['ratio_vs_rloo4']:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]", depths


def webshop_markdown(results: dict[str, Any]) -> str:
    a = results["args"]
    lines = [
        "# WebShop: distinct siblings and the measured branch rule at a fixed policy",
        "",
        f"`python benchmarks/bench_siblings.py --webshop --out {a['out']}`: {a['webshop_batches']} batch gradients per "
        f"configuration at {results['env']['budget_env_steps']} env steps a batch, after {a['webshop_warmup']} warm-up "
        "batches; the CPU default's warm-started text scorer (preset `cpu`, seed "
        f"{a['seed']}), {results['env']['tasks']} training tasks. Ratio = trace of the batch gradient's covariance "
        "against RLOO(4)'s (95% bootstrap interval). Load average at start "
        f"{', '.join(f'{x:.1f}' for x in results['load_average_at_start'])} (2 cores shared).",
        "",
        "| config | trace var vs RLOO-4 [95% CI] | env steps/batch | branch depths |",
        "|---|---|---:|---|",
    ]
    for label, r in results["configs"].items():
        ratio, depths = _ratio_and_depths(r)
        lines.append(f"| {label} | {ratio} | {r['env_steps_per_batch']:.0f} | {depths} |")
    return "\n".join(lines) + "\n"


def markdown(results: dict[str, Any]) -> str:
    a = results["args"]
    lines = [
        "# Distinct siblings and the measured branch rule (exact TreeMDPs)",
        "",
        f"`python benchmarks/bench_siblings.py --out {a['out']}{' --quick' if a['quick'] else ''}`: "
        f"{a['batches']} one-tree gradient estimates per configuration after {a['warmup']} warm-up batches, "
        f"{a['budget_batches']} batches at the setting's env-step budget; fixed policy (seed {a['seed']}). "
        "`tr Var x steps` = trace of the gradient covariance of one tree times its env steps (lower is better at "
        "matched compute), as a ratio to RLOO(4) with a 95% bootstrap interval; `matched` = the ratio of the "
        "batch gradient's trace variance at the env-step budget; `max|z|` = bias check against the exact gradient "
        "(|z| < 4 expected). Load average at start "
        f"{', '.join(f'{x:.1f}' for x in results['load_average_at_start'])} (2 cores shared).",
    ]
    for name, s in results["settings"].items():
        lines += ["", f"## {name}: {s['about']}", "",
                  "| config | tr Var x steps vs RLOO-4 [95% CI] | matched | steps/tree | max abs z | branch depths |",
                  "|---|---|---:|---:|---:|---|"]
        for label, r in s["configs"].items():
            ratio, depths = _ratio_and_depths(r)
            lines.append(
                f"| {label} | {ratio} | {r['matched_ratio_vs_rloo4']:.2f} "
                f"| {r['env_steps_per_tree']:.1f} | {max(abs(z) for z in r['z_scores']):.2f} | {depths} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/results/siblings")
    parser.add_argument("--settings", nargs="+", default=["structured-d5", "agent-state-d8"], choices=sorted(SETTINGS))
    parser.add_argument("--batches", type=int, default=500)
    parser.add_argument("--budget-batches", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--depth-batches", type=int, default=60, help="batches whose branch depths are counted")
    parser.add_argument("--boot", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--webshop", action="store_true", help="the WebShop measurement instead (module docstring)")
    parser.add_argument("--webshop-batches", type=int, default=24)
    parser.add_argument("--webshop-warmup", type=int, default=6)
    args = parser.parse_args(argv)
    if args.webshop:
        torch.manual_seed(args.seed)
        results = run_webshop(args)
        save(results, Path(args.out), "webshop", webshop_markdown(results))
        print(webshop_markdown(results))
        return results
    if args.quick:
        args.batches, args.budget_batches, args.warmup, args.depth_batches, args.boot = 150, 20, 10, 20, 100
        args.settings = args.settings[:1]
    torch.manual_seed(args.seed)
    results = run(args)
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()

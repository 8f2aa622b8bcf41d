"""Benchmark: how closely a batch holds its budget with many trees in flight.

GRPO, RLOO and BPO collect batches on TreeMDP (a uniform ``TabularPolicy``) under a per-batch
budget, with ``max_parallel_trees`` of 1, 4 and 16 (pool as large). For every batch it records
what the batch used divided by the budget, and by how many trees' cost it overshot. Writes
JSON (no timing asserts: read the numbers).

    PYTHONPATH=. python benchmarks/bench_budget.py --out budget.json
    PYTHONPATH=. python benchmarks/bench_budget.py --unit leaves --budget 40
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import bpo_envs  # noqa: F401 - registers the env ids
from baselines import GRPO, RLOO
from bpo_algos import BPO, Budget, EnvPool, TabularPolicy


def algorithms(parallel: int, seed: int) -> dict[str, Any]:
    return {
        "grpo": GRPO(group_size=8, max_parallel_trees=parallel, seed=seed),
        "rloo": RLOO(group_size=8, max_parallel_trees=parallel, seed=seed),
        "bpo": BPO(backbones=2, branch_factor=4, max_parallel_trees=parallel, seed=seed),
    }


def run(unit: str, amount: float, depth: int, batches: int, parallels: list[int], seed: int) -> dict[str, Any]:
    make = lambda: gym.make("BPO-TreeMDP-v0", depth=depth, n_actions=3, seed=1, n_tasks=16)  # noqa: E731
    budget = Budget(unit, amount)
    rows = []
    for parallel in parallels:
        for name, algorithm in algorithms(parallel, seed).items():
            pool = EnvPool([make] * parallel)
            policy = TabularPolicy(seed=seed)
            ratios, overshoot_trees, trees = [], [], []
            try:
                for _ in range(batches):
                    batch = algorithm.collect(policy, pool, list(range(16)), budget)
                    used = batch.compute.get(unit)
                    costs = [t.compute.get(unit) for t in batch.trees]
                    ratios.append(used / amount)
                    overshoot_trees.append((used - amount) / float(np.mean(costs)))
                    trees.append(batch.n_trees)
            finally:
                pool.close()
            rows.append(
                {
                    "algorithm": name,
                    "max_parallel_trees": parallel,
                    "used_over_budget": ratios,
                    "used_over_budget_max": max(ratios),
                    "used_over_budget_min": min(ratios),
                    "used_over_budget_mean": float(np.mean(ratios)),
                    "overshoot_in_trees_max": max(overshoot_trees),
                    "trees_per_batch": trees,
                }
            )
            print(f"{name:5s} parallel={parallel:2d} used/budget mean {np.mean(ratios):.3f} min {min(ratios):.3f} max {max(ratios):.3f}", file=sys.stderr)
    return {"unit": unit, "budget": amount, "depth": depth, "batches": batches, "rows": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--unit", default="env_steps")
    parser.add_argument("--budget", type=float, default=240.0, help="per batch (default: five GRPO(8) trees of depth 6)")
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--parallel", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default: stdout)")
    args = parser.parse_args(argv)
    result = run(args.unit, args.budget, args.depth, args.batches, args.parallel, args.seed)
    text = json.dumps(result, indent=2)
    if args.out is None:
        print(text)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

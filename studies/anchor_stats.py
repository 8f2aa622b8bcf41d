"""How often anchors match on real envs: ``|S(e)|`` of the anchored baselines and GiGPO's
step-group sizes, on WebShop and ALFWorld trees of the warm-started CPU-default policy.

For each env of the ``cpu`` preset: the policy is warm-started as the main job does it (the text
scorer, behaviour cloning on the env expert), then RLOO(8) fans and BPO(K0=2, K=4) trees are
collected on a few training tasks. Per edge, ``|S(e)|`` (same-key edges of its tree outside its
lineage; docs/unbiasedness.md, rule 6) is counted under three anchor keys, all functions of the
history: ``observation`` (the default: task + observation), ``observation+depth`` (finer) and
``depth`` (coarsest: task + step index). GiGPO's step-group sizes (itself included) are counted
on the fans with the default key (``fraction_at_least_2``: the steps whose group holds another
step). Writes ``anchor_stats.json``.

    python studies/anchor_stats.py --out docs/results/anchor-stats      # a few minutes
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

import bpo_envs  # noqa: F401 - registers the ids
from baselines import RLOO
from bpo_algos import BPO
from bpo_algos.advantages import anchored_sets, gigpo_step_group_sizes, observation_key
from bpo_algos.rollout import EnvPool
from bpo_experiments.build import make_policy
from bpo_experiments.presets import PRESETS
from bpo_experiments.run_config import policy_settings
from bpo_experiments.tasks import env_factory, task_split

KEYS = {
    "observation": observation_key,
    "observation+depth": lambda tree, node: (observation_key(tree, node), node.depth),
    "depth": lambda tree, node: (repr(tree.task_id), node.depth),
}


def summary(sizes: list[int]) -> dict[str, Any]:
    a = np.asarray(sizes)
    counts = Counter(int(s) for s in sizes)
    return {
        "edges": int(a.size),
        "matched_fraction": float((a > 0).mean()) if a.size else 0.0,
        "fraction_at_least_2": float((a >= 2).mean()) if a.size else 0.0,
        "mean": float(a.mean()) if a.size else 0.0,
        "median": float(np.median(a)) if a.size else 0.0,
        "histogram": {str(k): counts[k] for k in sorted(counts)},
    }


def measure(env: str, args: argparse.Namespace) -> dict[str, Any]:
    preset = PRESETS["cpu"]
    setup = preset.envs[env]
    train, _ = task_split(setup)
    tasks = train[: args.tasks]
    torch.manual_seed(args.seed)
    policy = make_policy(policy_settings(preset, setup), setup, args.seed, train[: args.warm_tasks])
    pool = EnvPool([env_factory(setup)] * 2)
    out: dict[str, Any] = {"tasks": len(tasks), "env_id": setup.env_id, "env_kwargs": setup.kwargs}
    try:
        for label, algorithm in (
            ("rloo-8", RLOO(group_size=8, seed=args.seed)),
            ("bpo-K0=2-K=4-q0.8", BPO(backbones=2, branch_factor=4, entropy_quantile=0.8, seed=args.seed)),
        ):
            algorithm.collect(policy, pool, tasks)  # one batch to set BPO's adaptive threshold
            batch = algorithm.collect(policy, pool, tasks)
            row: dict[str, Any] = {
                "trees": batch.n_trees,
                "edges_per_tree": float(np.mean([len(t.edges()) for t in batch.trees])),
                "success": batch.success_rate(),
            }
            for name, key in KEYS.items():
                sizes = [len(s) for tree in batch.trees for _, _, s in anchored_sets(tree, key)]
                row[f"S(e) [{name}]"] = summary(sizes)
            if label.startswith("rloo"):
                row["gigpo_step_group [observation]"] = summary(
                    [s for tree in batch.trees for s in gigpo_step_group_sizes(tree)]
                )
            out[label] = row
    finally:
        pool.close()
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/anchor-stats")
    parser.add_argument("--envs", nargs="+", default=["webshop", "alfworld"])
    parser.add_argument("--tasks", type=int, default=8, help="tasks (one tree each) per algorithm")
    parser.add_argument("--warm-tasks", type=int, default=16, help="tasks whose expert demos warm-start the policy")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = {"args": vars(args), "envs": {env: measure(env, args) for env in args.envs}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "anchor_stats.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()

"""Seconds per training update on the CPU default (the ``cpu`` preset of ``bpo-compare``).

    python benchmarks/bench_update.py --out bench_update.json [--updates 4] [--algorithms bpo rloo]

For each env of the preset and each algorithm: the preset's initial policy (behaviour-cloned as
the main job does), then ``--updates`` updates of :class:`bpo_algos.Trainer` with the preset's
budget and settings. Writes the per-update wall and CPU (process) seconds, their medians, and
the medians over all runs (the figures to compare between two versions of the code; the CPU
seconds are the steadier on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from bpo_algos.rollout import EnvPool
from bpo_algos.trainer import Trainer
from bpo_experiments.build import make_policy
from bpo_experiments.presets import PRESETS
from bpo_experiments.run_config import algorithm_spec, env_config
from bpo_experiments.tasks import env_factory, task_split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench_update.json")
    parser.add_argument("--updates", type=int, default=4)
    parser.add_argument("--algorithms", nargs="+", default=["bpo", "rloo"])
    parser.add_argument("--envs", nargs="+", default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    preset = PRESETS["cpu"]
    if preset.torch_threads:
        torch.set_num_threads(preset.torch_threads)
    rows = []
    for env_name in args.envs or list(preset.envs):
        setup = preset.envs[env_name]
        train_tasks, _ = task_split(setup)
        for name in args.algorithms:
            settings = env_config(preset, env_name)
            policy = make_policy(settings.policy, setup, args.seed, train_tasks)
            pool = EnvPool([env_factory(setup)] * preset.pool_size, workers=setup.workers)
            try:
                config = settings.run_trainer(args.seed, len(train_tasks), updates=args.updates)
                trainer = Trainer(algorithm_spec(name, preset, args.seed, env_name).build(), policy, pool, train_tasks, config)
                t0 = time.perf_counter()
                cpu = []
                for _ in range(args.updates):
                    c0 = time.process_time()
                    trainer.step()
                    cpu.append(time.process_time() - c0)
                history = trainer.history
                total = time.perf_counter() - t0
            finally:
                pool.close()
            seconds = [row["seconds"] for row in history]
            rows.append({
                "env": env_name, "algorithm": name, "updates": len(history), "seconds": seconds,
                "median_s_per_update": statistics.median(seconds), "total_s": total,
                "cpu_seconds": cpu, "median_cpu_s_per_update": statistics.median(cpu),
                "env_steps": [row["compute"]["env_steps"] for row in history],
            })
            print(f"{env_name:9s} {name:6s} median {rows[-1]['median_s_per_update']:.3f} s/update, {rows[-1]['median_cpu_s_per_update']:.3f} CPU s")
    out = {"preset": "cpu", "updates": args.updates, "runs": rows,
           "median_s_per_update": statistics.median(r["median_s_per_update"] for r in rows),
           "median_cpu_s_per_update": statistics.median(r["median_cpu_s_per_update"] for r in rows)}
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"median over runs: {out['median_s_per_update']:.3f} s/update -> {args.out}")


if __name__ == "__main__":
    main()

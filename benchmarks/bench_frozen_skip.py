"""What ``frozen`` saves by skipping its collection (docs/main-job.md, "Scheduling"): one run of the
positive control on the CPU default's settings per env, collecting every update (before) and
skipping after the checked first update (after, the main job's default), alternated in one
process after a warm-up run, timed in the run's own CPU seconds (``run.json["seconds_cpu"]``).

The settings are the ``cpu`` preset's but for what keeps the benchmark short and leaves the
run's training as it is: WebShop seed 3 (no gradient probes, as 29 of the 32 seeds); ALFWorld
seed 0 without behaviour cloning (``sft_epochs`` 0) and 20 ``valid_seen`` evaluation games, no
further split (the evaluations are the warm start's in both: only the initial job plays them).
Both runs of a pair are checked to agree in every evaluation and in their final budget::

    python benchmarks/bench_frozen_skip.py --out docs/results/bench-main-job/frozen-skip
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bpo_experiments import runner
from bpo_experiments.presets import PRESETS
from bpo_experiments.run_config import env_config, run_config
from bpo_experiments.tasks import task_split


def preset_for(env: str) -> tuple[Any, int]:
    """The ``cpu`` preset restricted to ``env`` (its short settings, module docstring) and the seed."""
    cpu = PRESETS["cpu"]
    setup = cpu.envs[env]
    if env == "alfworld":
        setup = replace(setup, eval_tasks=20, extra_eval={}, sft_epochs=0)
        return replace(cpu, envs={env: setup}, algorithms=("rloo", "frozen")), 0
    return replace(cpu, envs={env: setup}, algorithms=("rloo", "frozen")), 3  # the 4th of its seeds: not probed


def one_run(out: Path, preset: Any, env: str, seed: int, train: list[Any], evals: list[Any], init: dict[str, Any], skip: bool) -> dict[str, Any]:
    config = run_config(preset, env, "frozen", seed, len(train))
    result = runner.run_one(out, config, init["policy"], init["warm"], init["reference"], train, evals, skip_zero_loss_collection=skip)
    return {
        "skip": skip, "seconds_cpu": result["seconds_cpu"], "seconds": result["seconds"], "collected_updates": result["collected_updates"],
        "evals": [(e["update"], e["success"]) for e in result["evals"]], "budget_unit_total": result["compute_total"][config.budget_unit],
        "updates": config.trainer.updates, "budget": config.trainer.budget.amount, "probed": config.probing, "load_average": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=["webshop", "alfworld"])
    parser.add_argument("--rounds", type=int, default=1, help="before/after pairs per env after the warm-up run")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    report: dict[str, Any] = {"command": f"python benchmarks/bench_frozen_skip.py --envs {' '.join(args.envs)} --rounds {args.rounds}",
                              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(), "envs": {}}
    for env in args.envs:
        preset, seed = preset_for(env)
        train, evals = task_split(preset.envs[env])
        t0 = time.process_time()
        init = runner.initial_job(env_config(preset, env), seed, train, evals)
        initial_cpu = time.process_time() - t0
        rows: list[dict[str, Any]] = []
        with tempfile.TemporaryDirectory(prefix="frozen-skip-") as tmp:
            # the warm-up makes every game the runs touch (an ALFWorld game is translated on first use)
            warmup = one_run(Path(tmp) / "warmup", preset, env, seed, train, evals, init, skip=False)
            for r in range(args.rounds):
                for skip in (False, True):
                    rows.append(one_run(Path(tmp) / f"r{r}-{'skip' if skip else 'collect'}", preset, env, seed, train, evals, init, skip))
        before = [row for row in rows if not row["skip"]]
        after = [row for row in rows if row["skip"]]
        assert all(row["evals"] == warmup["evals"] for row in rows), "the runs' evaluations differ"
        mean = {k: sum(row["seconds_cpu"] for row in v) / len(v) for k, v in (("before", before), ("after", after))}
        report["envs"][env] = {
            "seed": seed, "initial_job_cpu_seconds": initial_cpu, "warmup": warmup, "runs": rows,
            "seconds_cpu_before": mean["before"], "seconds_cpu_after": mean["after"], "seconds_cpu_saved": mean["before"] - mean["after"],
            "settings": {"updates": warmup["updates"], "budget": warmup["budget"], "eval_tasks": len(evals), "sft_epochs": preset.envs[env].sft_epochs},
        }
        print(f"{env}: frozen run {mean['before']:.1f} CPU s collecting, {mean['after']:.1f} skipping", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()

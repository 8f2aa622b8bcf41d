"""Time to generate (and planner-check) the ALFWorld games a preset uses, per generator version.

For each version: a fresh, empty game cache; the preset's train and evaluation task ids (as
``bpo_experiments.tasks.task_split`` draws them); each game generated once, timed, and
its planner verdicts counted. Writes JSON (one entry per version: total and per-game seconds,
the slowest games, rejected attempts by reason):

    python benchmarks/alfworld_gen_time.py --preset cpu --versions 1 3 --out gen_time.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any


def time_version(preset: str, version: int, planner_timeout: float) -> dict[str, Any]:
    from dataclasses import replace

    from bpo_envs.alfworld import ALFWorldEnv
    from bpo_experiments.presets import PRESETS
    from bpo_experiments.tasks import task_split

    setup = PRESETS[preset].envs["alfworld"]
    setup = replace(setup, kwargs={**setup.kwargs, "generator_version": version, "planner_timeout": planner_timeout})
    train, evals = task_split(setup)
    rows, rejected = [], Counter()
    for split, ids in ((setup.kwargs.get("split", "train"), train), (setup.eval_split, evals)):
        env = ALFWorldEnv(split=split, generator_version=version, planner_timeout=planner_timeout)
        try:
            for task_id in ids:
                start = time.perf_counter()
                env.games.game(task_id)
                rows.append({"split": split, "task_id": task_id, "seconds": round(time.perf_counter() - start, 3)})
            rejected.update(env.games.rejected)
        finally:
            env.close()
    seconds = [r["seconds"] for r in rows]
    return {
        "generator_version": version,
        "games": len(rows),
        "total_s": round(sum(seconds), 2),
        "median_s": round(statistics.median(seconds), 3),
        "max_s": max(seconds),
        "slowest": sorted(rows, key=lambda r: -r["seconds"])[:5],
        "rejected_attempts": dict(sorted(rejected.items())),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--versions", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--planner-timeout", type=float, default=None, help="default: the env's")
    ap.add_argument("--out", default="alfworld_gen_time.json")
    args = ap.parse_args(argv)
    from bpo_envs.alfworld.verify import PLANNER_TIMEOUT_S

    timeout = args.planner_timeout or PLANNER_TIMEOUT_S
    result: dict[str, Any] = {"preset": args.preset, "planner_timeout_s": timeout, "cpus": os.cpu_count(),
                              "machine": platform.machine(), "load_average_at_start": os.getloadavg(), "versions": []}  # fmt: skip
    for version in args.versions:
        with tempfile.TemporaryDirectory() as cache:
            os.environ["BPO_ALFWORLD_CACHE"] = cache
            result["versions"].append(time_version(args.preset, version, timeout))
        print(json.dumps(result["versions"][-1]), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()

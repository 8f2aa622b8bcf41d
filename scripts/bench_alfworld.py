"""Benchmark BPO-ALFWorld-v0: step, reset, snapshot, restore (native, re-rooted, portable) and
replay (reset + k steps) on generated games, plus memory per extra env. Writes JSON.

    python scripts/bench_alfworld.py --out bench_alfworld.json
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

import bpo_envs
from bpo_envs.alfworld import TASK_TYPES, ALFWorldEnv
from bpo_envs.timing import time_calls


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _size(env: ALFWorldEnv, task_id: str) -> dict[str, int]:
    problem = env.games.game(task_id)["pddl_problem"]
    objects = sum(1 for line in problem.splitlines() if line.strip().endswith(" - object") and "?" not in line)
    receptacles = sum(1 for line in problem.splitlines() if line.strip().endswith(" - receptacle") and "?" not in line)
    return {"objects": objects, "receptacles": receptacles}


def bench_task(env: ALFWorldEnv, task_id: str, steps: int, repeat: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    t = time.perf_counter()
    env.reset(options={"task_id": task_id})
    first_reset = (time.perf_counter() - t) * 1000
    reset = time_calls(lambda: env.reset(options={"task_id": task_id}), repeat, ms=True)

    # a random admissible walk that avoids winning, to time steps and build a replay prefix
    _, info = env.reset(options={"task_id": task_id})
    actions: list[str] = []
    step_ms = []
    for _ in range(steps):
        choices = [a for a in info["admissible_actions"] if not a.startswith(("move ", "put "))]
        action = choices[int(rng.integers(len(choices)))]
        t = time.perf_counter()
        _, _, term, trunc, info = env.step(action)
        step_ms.append((time.perf_counter() - t) * 1000)
        actions.append(action)
        if term or trunc:
            break
    snap_ms = time_calls(lambda: bpo_envs.snapshot(env), repeat, ms=True)
    snap = bpo_envs.snapshot(env)
    env.step(actions[0])
    restore_ms = time_calls(lambda: bpo_envs.restore(env, snap), repeat, ms=True)

    def replay() -> None:
        env.reset(options={"task_id": task_id})
        for a in actions:
            env.step(a)

    replay_ms = time_calls(replay, max(3, repeat // 5), ms=True)
    blob = snap.portable()

    def reroot() -> None:
        env.reset(options={"task_id": task_id})
        bpo_envs.restore(env, snap)

    reroot_ms = time_calls(reroot, max(3, repeat // 5), ms=True)
    portable_ms = time_calls(lambda: bpo_envs.restore(env, blob), max(3, repeat // 5), ms=True)
    med = statistics.median
    return {
        "task_id": task_id,
        "size": _size(env, task_id),
        "admissible_actions": len(info["admissible_actions"]),
        "steps_walked": len(actions),
        "first_reset_ms": first_reset,
        "reset_ms": med(reset),
        "step_ms": med(step_ms),
        "snapshot_ms": med(snap_ms),
        "restore_native_ms": med(restore_ms),
        "restore_after_reset_ms": med(reroot_ms),
        "restore_portable_ms": med(portable_ms),
        "portable_bytes": len(blob),
        "replay_steps": len(actions),
        "replay_ms": med(replay_ms),
        "replay_over_restore": med(replay_ms) / med(restore_ms),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="bench_alfworld.json")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--index", type=int, default=1, help="generated game index per type")
    args = parser.parse_args()

    env = ALFWorldEnv(games_per_type=max(8, args.index + 1))
    results = []
    for task_type in TASK_TYPES:
        task_id = f"{task_type}/{args.index:04d}"
        results.append(bench_task(env, task_id, args.steps, args.repeat))
        r = results[-1]
        print(
            f"{task_id:40s} {r['size']['receptacles']:3d} recep {r['size']['objects']:3d} obj | "
            f"reset {r['reset_ms']:6.1f} ms  step {r['step_ms']:5.2f} ms  snapshot {r['snapshot_ms']:5.3f} ms  "
            f"restore {r['restore_native_ms']:5.3f} ms  re-root {r['restore_after_reset_ms']:6.1f} ms  "
            f"replay {r['replay_ms']:7.1f} ms ({r['replay_over_restore']:.0f}x)"
        )
    # ALFWorld's real size: the largest generated room among the benchmarked ones
    real = max(results, key=lambda r: r["size"]["objects"] + r["size"]["receptacles"])

    rss0 = _rss_mb()
    extra = []
    for _ in range(4):
        e = ALFWorldEnv(games_per_type=max(8, args.index + 1))
        e.reset(options={"task_id": real["task_id"]})
        extra.append(e)
    mem_per_env = (_rss_mb() - rss0) / len(extra)

    keys = ["reset_ms", "step_ms", "snapshot_ms", "restore_native_ms", "restore_after_reset_ms", "restore_portable_ms"]
    summary = {k: statistics.median(r[k] for r in results) for k in keys}
    summary["replay_over_restore"] = statistics.median(r["replay_over_restore"] for r in results)
    summary["memory_per_extra_env_mb"] = mem_per_env
    out = {"summary_medians_over_task_types": summary, "real_size_game": real, "per_task_type": results}
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"\nreal-size game {real['task_id']} ({real['size']}): step {real['step_ms']:.2f} ms, "
          f"reset {real['reset_ms']:.1f} ms, restore {real['restore_native_ms']:.3f} ms, "
          f"replay/restore {real['replay_over_restore']:.0f}x")
    print("medians over task types:", json.dumps(summary, indent=1))
    print(f"memory per extra env: {mem_per_env:.1f} MB; wrote {args.out}")


if __name__ == "__main__":
    main()

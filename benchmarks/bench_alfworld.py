"""Benchmark BPO-ALFWorld-v0: step, reset, snapshot, restore (native, re-rooted, portable) and
replay (reset + k steps) on generated games, plus memory per extra env. Writes JSON.

    python benchmarks/bench_alfworld.py --out bench_alfworld.json

``--first-reset PRESET`` instead times the first reset of each of a preset's ALFWorld games (its
train and evaluation tasks, as the main job draws them) in a new process, once with the
games' on-disk translations removed (the process translates each problem and parses its
grammar) and once with them in place (it reads them); each process first resets one other
game, so imports and shared parses are not counted. Writes the per-game times and medians:

    python benchmarks/bench_alfworld.py --first-reset cpu --out first_reset.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import bpo_envs
from bpo_envs.alfworld import TASK_TYPES, ALFWorldEnv
from bpo_envs.alfworld.transitions import MEMO
from bpo_envs.timing import time_calls

# the engine's own costs: no step answered from the transition memo (docs/alfworld.md, "Transitions kept")
MEMO.max_bytes = 0


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


def _first_reset_worker(spec: str) -> None:
    """In this new process: reset ``warmup`` once, then time the first reset of each game."""
    job = json.loads(spec)
    env = ALFWorldEnv(split=job["split"], **job["kwargs"])
    env.reset(options={"task_id": job["warmup"]})
    out = []
    for task_id in job["tasks"]:
        t, cpu = time.perf_counter(), time.process_time()
        env.reset(options={"task_id": task_id})
        out.append({
            "split": job["split"], "task_id": task_id, "first_reset_ms": (time.perf_counter() - t) * 1000,
            "first_reset_cpu_ms": (time.process_time() - cpu) * 1000,
        })  # fmt: skip
    env.close()
    print(json.dumps(out))


def first_reset(preset: str, max_games: int | None) -> dict[str, Any]:
    from dataclasses import replace

    from bpo_envs.alfworld import _upstream
    from bpo_experiments.presets import PRESETS
    from bpo_experiments.tasks import task_split

    setup = PRESETS[preset].envs["alfworld"]
    kwargs = {k: v for k, v in setup.kwargs.items() if k not in ("split", "max_episode_steps", "expert")}
    train, evals = task_split(setup)
    groups = [(setup.kwargs.get("split", "train"), train), (setup.eval_split, evals)]
    if setup.eval_split == "valid_seen":  # the main job also reports valid_unseen
        groups.append(("valid_unseen", task_split(replace(setup, eval_split="valid_unseen"))[1]))
    if max_games:
        groups = [(split, ids[:max_games]) for split, ids in groups]
    result: dict[str, Any] = {"preset": preset, "games": sum(len(ids) for _, ids in groups), "modes": {}}
    for mode in ("translated_in_process", "read_from_disk"):
        rows: list[dict[str, Any]] = []
        for split, ids in groups:
            env = ALFWorldEnv(split=split, **kwargs)
            others = [t for t in env.task_ids() if t not in set(ids)]
            for task_id in ids:  # generated games are made (and cached) here, not timed
                env.games.game_path(task_id)  # makes a generated game
                if mode == "translated_in_process":
                    _upstream.translation_path(env.games.game(task_id)).unlink(missing_ok=True)
            env.games.game(others[0])
            job = json.dumps({"split": split, "kwargs": kwargs, "warmup": others[0], "tasks": ids})
            done = subprocess.run(
                [sys.executable, __file__, "--first-reset-worker", job], check=True, capture_output=True, text=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            )  # fmt: skip
            rows += json.loads(done.stdout.strip().splitlines()[-1])
        times = [r["first_reset_ms"] for r in rows]
        result["modes"][mode] = {
            "median_ms": statistics.median(times),
            # CPU time of the process: what the reset costs, less what other processes took
            "median_cpu_ms": statistics.median(r["first_reset_cpu_ms"] for r in rows),
            "p90_ms": float(np.percentile(times, 90)),
            "max_ms": max(times),
            "per_game": rows,
        }
    before, after = (result["modes"][m]["median_ms"] for m in ("translated_in_process", "read_from_disk"))
    result["median_ratio"] = before / after
    result["load_average_at_end"] = os.getloadavg()
    result["cpus"] = os.cpu_count()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="bench_alfworld.json")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--index", type=int, default=1, help="generated game index per type")
    parser.add_argument("--first-reset", metavar="PRESET", help="time first resets of a preset's games instead")
    parser.add_argument("--max-games", type=int, default=None, help="--first-reset: at most this many games per split")
    parser.add_argument("--first-reset-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.first_reset_worker:
        _first_reset_worker(args.first_reset_worker)
        return
    if args.first_reset:
        out = first_reset(args.first_reset, args.max_games)
        Path(args.out).write_text(json.dumps(out, indent=1))
        for mode, data in out["modes"].items():
            print(f"{mode}: median {data['median_ms']:.1f} ms (CPU {data['median_cpu_ms']:.1f} ms), p90 {data['p90_ms']:.1f} ms, max {data['max_ms']:.1f} ms")
        print(f"{out['games']} games; wrote {args.out}")
        return

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

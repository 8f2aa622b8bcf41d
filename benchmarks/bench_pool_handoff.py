"""What the pool's thread hand-off costs on ALFWorld (docs/algorithms.md, "Inline stepping"): real
``BPO-ALFWorld-v0`` envs (the ``cpu`` preset's train split and settings; games whose translation
is on disk reset in milliseconds) stepped through :meth:`EnvPool.step_many` with a pool of 8 and
16 envs, every env of the pool stepped once per call with a random admissible action drawn from a
seeded generator, ``step_timeout_s=None`` (steps in the caller's thread) against the default
deadline (steps on the pool's one daemon worker, ALFWorld's ``workers=1``).

The two modes are interleaved in one pool over one trajectory: each ``step_many`` call's mode is
drawn by a seeded coin (the benchmark sets ``pool.step_timeout_s``, which each call reads), so both
modes see the same mix of env work and the same machine load. Separate runs per mode, even paired
on the same actions, differed by up to 0.6 CPU s per 1,000 steps between repeats on a loaded 2-core
machine. Counted: CPU seconds of the process (``time.process_time``, every
thread) and wall seconds inside ``step_many`` only (resets at episode ends are outside), per 1,000
steps of each mode; the medians over the repeats (after a warm-up repeat) and the hand-off's share
``(cpu_deadline - cpu_inline) / cpu_deadline``, the median of the repeats' own shares.
The same two modes on a TreeMDP declaring ``step_may_block = True`` (a step of a few microseconds)
give the hand-off's own CPU per step with little env work around it (``handoff_floor``)::

    python benchmarks/bench_pool_handoff.py --out docs/results/bench-main-job/pool-handoff/after.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import bpo_envs
from bpo_envs.alfworld.transitions import MEMO
from bpo_envs.pool import DEFAULT_STEP_TIMEOUT_S, EnvPool

# the engine's own costs: no step answered from the transition memo (docs/alfworld.md, "Transitions kept")
MEMO.max_bytes = 0


class BlockingTreeMDP(bpo_envs.TreeMDPEnv):
    """A TreeMDP stepped on the pool's threads: nearly all of its step's cost is the hand-off."""

    step_may_block = True


ENV_KWARGS = {"max_episode_steps": 50, "split": "train", "expert": "handcoded"}  # the cpu preset's
MODES = {"inline": None, "deadline": DEFAULT_STEP_TIMEOUT_S}


def measure(n_envs: int, steps: int, seed: int, games: list[str]) -> dict[str, dict[str, float]]:
    """CPU and wall seconds inside ``step_many`` per 1,000 env steps in each mode, ``steps`` env
    steps over ``n_envs`` envs in all, each call's mode drawn by a seeded coin."""
    pool = EnvPool([lambda: gym.make("BPO-ALFWorld-v0", **ENV_KWARGS)] * n_envs)
    try:
        envs = [pool.acquire() for _ in range(n_envs)]
        # the action draws, the mode coin and each env's reset: separate streams of one SeedSequence
        action_seed, coin_seed, *reset_seeds = np.random.SeedSequence(seed).generate_state(2 + n_envs).tolist()
        rng, coin = random.Random(action_seed), random.Random(coin_seed)
        admissible = []
        for i, env in enumerate(envs):
            _, info = env.reset(seed=reset_seeds[i], options={"task_id": games[i % len(games)]})
            admissible.append(info["admissible_actions"])
        cpu, wall, done = dict.fromkeys(MODES, 0.0), dict.fromkeys(MODES, 0.0), dict.fromkeys(MODES, 0)
        next_game = n_envs
        while sum(done.values()) < steps:
            mode = coin.choice(list(MODES))
            pool.step_timeout_s = MODES[mode]  # read by each step_many call (EnvPool._submit)
            actions = [rng.choice(a) for a in admissible]
            c0, w0 = time.process_time(), time.perf_counter()
            results = pool.step_many(envs, actions)
            cpu[mode] += time.process_time() - c0
            wall[mode] += time.perf_counter() - w0
            done[mode] += len(envs)
            for i, result in enumerate(results):
                if isinstance(result, Exception):
                    raise result
                _, _, terminated, truncated, info = result
                if terminated or truncated:
                    _, info = envs[i].reset(options={"task_id": games[next_game % len(games)]})
                    next_game += 1
                admissible[i] = info["admissible_actions"]
        return {mode: {"cpu_per_1000": 1000 * cpu[mode] / done[mode], "wall_per_1000": 1000 * wall[mode] / done[mode],
                       "steps": done[mode]} for mode in MODES}
    finally:
        pool.close()


def floor(n_envs: int, steps: int, timeout: float | None) -> float:
    """CPU microseconds per step of :class:`BlockingTreeMDP` through ``step_many``."""
    pool = EnvPool([lambda: BlockingTreeMDP(depth=3, n_actions=3, seed=7)] * n_envs, step_timeout_s=timeout)
    try:
        envs = [pool.acquire() for _ in range(n_envs)]
        for env in envs:
            env.reset(options={"task_id": 0})
        cpu, done = 0.0, 0
        while done < steps:
            c0 = time.process_time()
            results = pool.step_many(envs, ["a0"] * n_envs)
            cpu += time.process_time() - c0
            done += n_envs
            for env, result in zip(envs, results, strict=True):
                if isinstance(result, Exception):
                    raise result
                if result[2] or result[3]:
                    env.reset(options={"task_id": 0})
        return 1e6 * cpu / done
    finally:
        pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pools", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--steps", type=int, default=2000, help="env steps per repeat, both modes together")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--games", type=int, default=32, help="the first N train games of the index")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    games = gym.make("BPO-ALFWorld-v0", **ENV_KWARGS).unwrapped.task_ids()[: args.games]
    report: dict[str, Any] = {
        "command": "python benchmarks/bench_pool_handoff.py " + " ".join(
            [f"--pools {' '.join(map(str, args.pools))}", f"--steps {args.steps}", f"--repeats {args.repeats}", f"--games {args.games}"]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
        "load_average_start": os.getloadavg(), "pools": {},
    }
    for n in args.pools:
        measure(n, args.steps, 0, games)  # warm-up: games loaded, code paths hot
        runs = [measure(n, args.steps, 1000 + r, games) for r in range(args.repeats)]
        med = {mode: {k: statistics.median(run[mode][k] for run in runs) for k in ("cpu_per_1000", "wall_per_1000")} for mode in MODES}
        shares = [(run["deadline"]["cpu_per_1000"] - run["inline"]["cpu_per_1000"]) / run["deadline"]["cpu_per_1000"] for run in runs]
        report["pools"][str(n)] = {"runs": runs, "median": med, "handoff_cpu_share_median": statistics.median(shares),
                                   "handoff_cpu_shares": shares,
                                   "handoff_cpu_per_1000": med["deadline"]["cpu_per_1000"] - med["inline"]["cpu_per_1000"]}
        floors = {mode: statistics.median(floor(n, 20 * args.steps, timeout) for _ in range(args.repeats))
                  for mode, timeout in MODES.items()}
        report["pools"][str(n)]["handoff_floor"] = {
            "cpu_us_per_step": floors, "handoff_cpu_us_per_step": floors["deadline"] - floors["inline"],
            "note": f"BlockingTreeMDP, {20 * args.steps} steps per measurement, median of {args.repeats}"}
        print(f"pool {n}: {json.dumps(med)} hand-off share {statistics.median(shares):.3f}; floor {floors}", flush=True)
    report["load_average_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()

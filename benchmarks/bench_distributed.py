"""Benchmark of ``RayEnvPool``: rollout throughput with 1, 2 and 4 actors, and snapshot placement
(restoring on the actor that holds the snapshot vs moving its portable bytes to another one).

    python benchmarks/bench_distributed.py --out bench_distributed.json

Throughput: BPO ``collect`` on TreeMDP, env steps per second (median of ``--repeats``), with a
simulated sandbox latency per step (``--step-ms``, as a step that waits on a container) and
without it (the pool's own overhead), next to a local ``EnvPool`` in one process. Placement:
median seconds per ``restore`` of a mid-episode snapshot on the same actor and on another actor
(bytes moved actor to actor), for TreeMDP and WebShop (when installed).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

import bpo_envs
from bpo_algos import BPO, EnvPool, TabularPolicy


class StepLatency(gym.Wrapper):
    """Adds a fixed wait to every step (a sandbox command's latency)."""

    def __init__(self, env: gym.Env, seconds: float) -> None:
        super().__init__(env)
        self.seconds = seconds

    def step(self, action: Any) -> Any:
        time.sleep(self.seconds)
        return self.env.step(action)


def tree_env(step_s: float = 0.0) -> gym.Env:
    env = gym.make("BPO-TreeMDP-v0", depth=5, n_actions=3, seed=0, n_tasks=16)
    return StepLatency(env, step_s) if step_s else env


def throughput(pool: Any, repeats: int, tasks: int) -> dict[str, float]:
    rates, seconds = [], []
    for r in range(repeats):
        algorithm = BPO(backbones=2, branch_factor=3, entropy_threshold=0.0, max_branch_points=2, seed=r)
        start = time.perf_counter()
        batch = algorithm.collect(TabularPolicy(seed=r), pool, [i % 16 for i in range(tasks)])
        elapsed = time.perf_counter() - start
        rates.append(batch.compute.env_steps / elapsed)
        seconds.append(elapsed)
    return {"env_steps_per_s": round(statistics.median(rates), 1), "seconds_per_batch": round(statistics.median(seconds), 3)}


def placement(RayEnvPool: Any, name: str, make: Any, walk: list[str], n: int) -> dict[str, Any]:
    with RayEnvPool(make, actors=2) as pool:
        a, b = pool.acquire(), pool.acquire()
        for env in (a, b):
            env.reset(seed=0)
        for action in walk:
            a.step(action)
        snap = bpo_envs.snapshot(a)
        out: dict[str, Any] = {}
        for label, target in (("same_actor", a), ("other_actor", b)):
            times = []
            for _ in range(n):
                t = time.perf_counter()
                bpo_envs.restore(target, snap)
                times.append(time.perf_counter() - t)
            out[f"{label}_restore_ms"] = round(1000 * statistics.median(times), 3)
        out["bytes_moved_per_restore"] = pool.stats["moved_bytes"] // max(pool.stats["moved_restores"], 1)
        snap.release()
    return {"env": name, **out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--envs-per-actor", type=int, default=2)
    parser.add_argument("--step-ms", type=float, default=5.0)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--restores", type=int, default=200)
    parser.add_argument("--num-cpus", type=int, default=None, help="ray.init(num_cpus=...) for a local cluster")
    parser.add_argument("--out", type=Path, default=Path("bench_distributed.json"))
    args = parser.parse_args(argv)

    import ray

    from bpo_envs.ray_pool import RayEnvPool

    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    result: dict[str, Any] = {"config": vars(args) | {"out": str(args.out)}, "throughput": [], "placement": []}
    try:
        for step_ms in (args.step_ms, 0.0):
            make = functools.partial(tree_env, step_ms / 1000)
            slots = args.envs_per_actor * max(args.actors)
            for label, workers in (("local", 1), ("local-threads", slots)):
                local = EnvPool([make] * slots, workers=workers)
                row = {"pool": label, "actors": 0, "slots": slots, "step_ms": step_ms, **throughput(local, args.repeats, args.tasks)}
                local.close()
                result["throughput"].append(row)
                print(row)
            for n in args.actors:
                with RayEnvPool(make, actors=n, envs_per_actor=args.envs_per_actor) as pool:
                    throughput(pool, 1, 2)  # warm-up: actors up, envs made
                    stats = dict(pool.stats)
                    row = {"pool": "ray", "actors": n, "slots": len(pool), "step_ms": step_ms, **throughput(pool, args.repeats, args.tasks)}
                    moved = pool.stats["moved_restores"] - stats["moved_restores"]
                    local_r = pool.stats["local_restores"] - stats["local_restores"]
                    row["restores_on_snapshot_actor"] = round(local_r / max(local_r + moved, 1), 3)
                result["throughput"].append(row)
                print(row)
        walks = {"treemdp": (functools.partial(tree_env), ["a1", "a2"])}
        try:
            import bpo_envs.webshop  # noqa: F401

            walks["webshop"] = (functools.partial(gym.make, "BPO-WebShop-v0"), None)
        except ImportError as exc:
            result["placement"].append({"env": "webshop", "skipped": str(exc)})
        for name, (make, walk) in walks.items():
            if walk is None:  # the first admissible actions of task 0
                env = make()
                _, info = env.reset(seed=0)
                walk = [info["admissible_actions"][0]]
                _, _, _, _, info = env.step(walk[0])
                walk.append(info["admissible_actions"][-1])
                env.close()
            row = placement(RayEnvPool, name, make, walk, args.restores)
            result["placement"].append(row)
            print(row)
    finally:
        ray.shutdown()
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Soak: many BPO tree expansions with snapshots on each env, watching the process's memory.

Every branch point snapshots the env, restores the snapshot onto envs of the pool for the
siblings and releases it once the last sibling is placed; a leak of snapshot state (or of
anything per tree) shows as RSS growing with the number of expansions. The policy is uniform
over the admissible actions and keeps no state, so only the env side can grow.

    python benchmarks/soak.py                       # TreeMDP and WebShop, 10,000 expansions each
    python benchmarks/soak.py --envs treemdp --expansions 2000 --out soak.json
    python benchmarks/soak.py --envs docker --cycles 1000 --out docs/results/soak/docker.json

``docker``: one SWE-bench env on the docker backend (the official-layout test image) runs
``--cycles`` cycles of step, snapshot, step, restore, step, release, and every ``--every``
cycles counts this run's snapshot images and containers (by their ``bpo-gym.run`` label), the
docker root's used disk and its overlay2 layer folders; the JSON has the samples and each
one's least-squares slope per 1,000 cycles over the second half (flat = no leak).

Writes JSON (per env: expansions, env steps, RSS in MiB at the start after a warm-up batch, at
the end and the max seen, the growth over the run, live snapshot objects at the end).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import bpo_envs
from bpo_algos import BPO, ComputeMeter, EnvPool
from bpo_algos.policy.base import Action, Policy

ENVS: dict[str, tuple[str, dict[str, Any], str]] = {
    # name -> (id, kwargs, fallback action where the env lists none)
    "treemdp": ("BPO-TreeMDP-v0", {"depth": 6, "n_actions": 3, "seed": 0, "n_tasks": 50}, "a0"),
    "webshop": ("BPO-WebShop-v0", {"max_episode_steps": 8}, "click[back to search]"),
    "alfworld": ("BPO-ALFWorld-v0", {"games_per_type": 2, "max_episode_steps": 12}, "look"),
    "swebench": ("BPO-SWEBench-v0", {"max_episode_steps": 6}, "ls"),
}


class UniformPolicy(Policy):
    """Uniform over the admissible actions (or one fallback action); no state, no growth."""

    def __init__(self, fallback: str, seed: int = 0) -> None:
        self.fallback = fallback
        self.meter = ComputeMeter()
        self.rng = np.random.default_rng(seed)

    def _choices(self, context: Any) -> tuple[str, ...]:
        return tuple(context.admissible_actions or ()) or (self.fallback,)

    def decision_entropy(self, contexts: list[Any]) -> list[float]:
        self.meter.policy_calls += 1
        return [math.log(len(self._choices(c))) for c in contexts]

    def sample(self, contexts: list[Any], n: int, rngs: list[np.random.Generator] | None) -> list[list[Action]]:
        self.meter.policy_calls += 1
        out = []
        for i, context in enumerate(contexts):
            choices = self._choices(context)
            picks = (self.rng if rngs is None else rngs[i]).integers(len(choices), size=n)
            lp = -math.log(len(choices))
            self.meter.gen_tokens += n  # the policy meters what it generates; the engine reads it
            out.append([Action(choices[i], (int(i),), (lp,)) for i in picks])
        return out

    def token_logprobs(self, steps: Any) -> Any:  # pragma: no cover - never trained
        raise NotImplementedError


def rss_mib() -> float:
    """Resident set size now (Linux /proc), in MiB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def live_snapshots() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if issubclass(type(o), bpo_envs.Snapshot) and not o.released)


def soak(name: str, expansions: int, pool_size: int, tasks_per_batch: int) -> dict[str, Any]:
    env_id, kwargs, fallback = ENVS[name]
    make = lambda: gym.make(env_id, **kwargs)  # noqa: E731
    try:
        probe = make()
        tasks = list(probe.unwrapped.task_ids())[:200]
        probe.close()
    except Exception as exc:  # noqa: BLE001 - report why the env cannot run here
        return {"env": name, "skipped": f"{type(exc).__name__}: {exc}"[:300]}
    pool = EnvPool([make] * pool_size)
    policy = UniformPolicy(fallback)
    algorithm = BPO(backbones=2, branch_factor=3, entropy_threshold=0.0, max_branch_points=2, seed=0)
    rng = np.random.default_rng(0)

    def batch() -> ComputeMeter:
        picked = [tasks[int(i)] for i in rng.integers(len(tasks), size=tasks_per_batch)]
        return algorithm.collect(policy, pool, picked).compute

    batch()  # warm-up: caches, catalogs, lazily made envs
    gc.collect()
    start_rss, peak, samples = rss_mib(), rss_mib(), []
    total = ComputeMeter()
    t0 = time.perf_counter()
    while total.snapshots < expansions:
        total.add(batch())
        now = rss_mib()
        peak = max(peak, now)
        samples.append((total.snapshots, round(now, 2)))
    seconds = time.perf_counter() - t0
    gc.collect()
    end_rss = rss_mib()
    # growth: a least-squares slope of RSS over expansions in the second half (after the
    # allocator has settled), per 10,000 expansions
    half = samples[len(samples) // 2 :]
    slope = float(np.polyfit([s[0] for s in half], [s[1] for s in half], 1)[0]) * 10_000 if len(half) > 2 else 0.0
    pool.close()
    return {
        "env": name,
        "expansions": total.snapshots,
        "restores": total.restores,
        "env_steps": total.env_steps,
        "leaves": total.leaves,
        "seconds": round(seconds, 2),
        "expansions_per_s": round(total.snapshots / seconds, 1),
        "rss_mib": {"start": round(start_rss, 2), "end": round(end_rss, 2), "max": round(peak, 2), "growth": round(end_rss - start_rss, 2)},
        "rss_slope_mib_per_10k_expansions_2nd_half": round(slope, 3),
        "live_snapshots_at_end": live_snapshots(),
    }


def soak_docker(cycles: int, every: int, out: Path | None = None) -> dict[str, Any]:
    """The docker case (see the module docstring)."""
    import os
    import shutil

    from bpo_envs.swebench import SWEBenchEnv, bundled_instances
    from bpo_envs.swebench.docker_backend import docker_client
    from bpo_envs.swebench.images import build_test_image, verified_row
    from bpo_envs.swebench.owners import LABEL_RUN, SNAPSHOT_REPO, run_id

    source = bundled_instances()[0]
    build_test_image(source)
    client = docker_client()
    root = client.info().get("DockerRootDir", "/var/lib/docker")
    label = lambda: {"label": f"{LABEL_RUN}={run_id()}"}  # noqa: E731 - a new dict per call

    def sample(cycle: int) -> dict[str, Any]:
        gc.collect()
        layers = os.path.join(root, "overlay2")
        return {
            "cycle": cycle,
            # the low-level calls: a container removed meanwhile cannot fail the listing
            "snapshot_images": len(client.api.images(name=SNAPSHOT_REPO, filters=label())),
            "containers": len(client.api.containers(all=True, filters=label())),
            "docker_root_used_mib": round(shutil.disk_usage(root).used / 2**20, 1),
            "overlay2_layers": len(os.listdir(layers)) if os.path.isdir(layers) else None,
            "rss_mib": round(rss_mib(), 1),
        }

    env = SWEBenchEnv(instances=[verified_row(source)], backend="docker", step_timeout=60,
                      max_episode_steps=10**6)
    errors: list[str] = []
    samples = []
    t0 = time.perf_counter()
    try:
        env.reset(seed=0)
        samples.append(sample(0))
        for i in range(1, cycles + 1):
            try:
                env.step(f"echo {i} >> soak.txt && head -c 100 soak.txt > /dev/null")
                snap = env.snapshot()
                env.step("rm -f soak.txt README.md && echo x > scratch.bin")
                env.restore(snap)
                obs = env.step("tail -1 soak.txt")[0]
                if not obs.startswith(f"{i}\n"):
                    raise AssertionError(f"restore {i} gave {obs[:80]!r}")
                snap.release()
            except Exception as exc:  # noqa: BLE001 - counted, the soak goes on
                errors.append(f"cycle {i}: {type(exc).__name__}: {exc}"[:300])
            if i % 100 == 0:
                env.reset(seed=0)  # the writable layer restarts; the cycles go on
            if i % every == 0:
                samples.append(sample(i))
                print(samples[-1], flush=True)
                if out is not None:  # a partial result survives an interrupted soak
                    out.write_text(json.dumps({"partial": True, "errors": errors[:20], "samples": samples}, indent=2))
    finally:
        env.close()
    seconds = time.perf_counter() - t0
    after_close = sample(cycles)
    half = samples[len(samples) // 2:]
    slopes = {}
    for key in ("snapshot_images", "containers", "docker_root_used_mib", "overlay2_layers", "rss_mib"):
        xs = [s["cycle"] for s in half if s[key] is not None]
        ys = [s[key] for s in half if s[key] is not None]
        slopes[key] = round(float(np.polyfit(xs, ys, 1)[0]) * 1000, 3) if len(xs) > 2 else None
    return {
        "env": "docker", "cycles": cycles, "seconds": round(seconds, 1),
        "cycles_per_s": round(cycles / seconds, 2), "errors": errors[:20], "n_errors": len(errors),
        "slope_per_1000_cycles_2nd_half": slopes, "after_close": after_close, "samples": samples,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", nargs="+", default=["treemdp", "webshop"], choices=[*sorted(ENVS), "docker"])
    parser.add_argument("--cycles", type=int, default=1000, help="docker: snapshot/restore/release cycles")
    parser.add_argument("--every", type=int, default=50, help="docker: cycles between samples")
    parser.add_argument("--expansions", type=int, default=10_000)
    parser.add_argument("--pool", type=int, default=4, help="envs in the pool")
    parser.add_argument("--tasks-per-batch", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("soak.json"))
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results = [soak_docker(args.cycles, args.every, args.out) if name == "docker"
               else soak(name, args.expansions, args.pool, args.tasks_per_batch) for name in args.envs]
    args.out.write_text(json.dumps({"python": sys.version.split()[0], "results": results}, indent=2))
    for r in results:
        if r["env"] == "docker":
            print(f"docker    {r['cycles']} cycles in {r['seconds']} s, {r['n_errors']} errors; slope per "
                  f"1,000 cycles (2nd half): {r['slope_per_1000_cycles_2nd_half']}; after close: {r['after_close']}")
            continue
        if "skipped" in r:
            print(f"{r['env']:9s} skipped: {r['skipped']}")
            continue
        m = r["rss_mib"]
        print(
            f"{r['env']:9s} {r['expansions']:6d} expansions {r['env_steps']:7d} steps {r['seconds']:7.1f}s  "
            f"RSS start {m['start']:.1f} end {m['end']:.1f} max {m['max']:.1f} MiB (growth {m['growth']:+.1f}; "
            f"2nd-half slope {r['rss_slope_mib_per_10k_expansions_2nd_half']:+.2f} MiB/10k)  live snapshots {r['live_snapshots_at_end']}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

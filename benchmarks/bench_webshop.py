"""Benchmark BPO-WebShop-v0 on the bundled catalog; writes JSON and prints a summary.

Measures (medians over repeats): catalog generation and load, reset, steps/s on random
admissible walks, uncached and cached search latency, snapshot and restore (native) versus
``ReplaySnapshot`` restore at the same depth, and the memory of an extra env instance.

    python benchmarks/bench_webshop.py [--out bench_webshop.json] [--steps 20000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

import gymnasium as gym

from bpo_envs.timing import median_seconds, random_walk, replay_restore_ms
from bpo_envs.webshop import generate_catalog, write_catalog
from bpo_envs.webshop.data import get_catalog


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench_webshop.json")
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    result: dict[str, object] = {}

    t = time.perf_counter()
    generate_catalog()
    result["generate_catalog_s"] = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_catalog(Path(tmp) / "c")
        t = time.perf_counter()
        get_catalog(str(folder))
        result["load_and_index_catalog_s"] = time.perf_counter() - t

    env = gym.make("BPO-WebShop-v0")
    u = env.unwrapped
    result["n_products"] = len(u.catalog.products)
    result["n_goals"] = len(u.catalog.goals)
    seeds = iter(range(10**6))
    result["reset_us"] = median_seconds(lambda: env.reset(seed=next(seeds)), 2000) * 1e6

    rates = [random_walk(env, args.steps, seed).steps_per_s for seed in range(args.repeats)]
    result["steps_per_s_runs"] = rates
    result["steps_per_s"] = statistics.median(rates)

    queries = [u.catalog.goal(i)["instruction_text"] + f" v{i}" for i in range(2000)]
    it = iter(queries)
    result["search_uncached_us"] = median_seconds(lambda: u.catalog.index.search(next(it)), len(queries)) * 1e6
    result["search_cached_us"] = median_seconds(lambda: u.catalog.index.search(queries[0]), 2000) * 1e6

    # snapshot / restore just before the purchase of an expert episode
    env.reset(options={"task_id": 0})
    actions = u.expert_actions()
    for a in actions[:-1]:
        env.step(a)
    depth = u.elapsed_steps
    snap = u.snapshot()
    result["snapshot_us"] = median_seconds(u.snapshot, 20_000) * 1e6
    result["restore_us"] = median_seconds(lambda: u.restore(snap), 20_000) * 1e6
    result["snapshot_plus_restore_us"] = result["snapshot_us"] + result["restore_us"]
    result["portable_bytes"] = len(snap.portable())
    blob = snap.portable()
    result["restore_portable_us"] = median_seconds(lambda: u.restore(blob), 5000) * 1e6

    replay_ms = replay_restore_ms(lambda: gym.make("BPO-WebShop-v0"), actions[:-1], 2000, options={"task_id": 0})
    result["replay_restore_us"] = replay_ms * 1e3
    result["restore_depth"] = depth
    result["native_vs_replay_speedup"] = result["replay_restore_us"] / result["restore_us"]

    # memory of an extra env instance (the catalog is shared and already loaded)
    extra = [gym.make("BPO-WebShop-v0") for _ in range(3)]
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    envs = [gym.make("BPO-WebShop-v0") for _ in range(100)]
    for e in envs:
        e.reset(seed=1)
        e.step(f"search[{e.unwrapped.goal['query']}]")
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    result["extra_env_bytes"] = grown / len(envs)
    del envs, extra

    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    for key in ("n_products", "n_goals", "generate_catalog_s", "load_and_index_catalog_s", "reset_us",
                "steps_per_s", "search_uncached_us", "search_cached_us", "snapshot_us", "restore_us",
                "snapshot_plus_restore_us", "restore_portable_us", "replay_restore_us", "restore_depth",
                "native_vs_replay_speedup", "extra_env_bytes", "portable_bytes"):  # fmt: skip
        value = result[key]
        print(f"  {key:28s} {value:,.2f}" if isinstance(value, float) else f"  {key:28s} {value}")


if __name__ == "__main__":
    main()

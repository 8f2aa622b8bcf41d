"""Generate ALFWorld games in parallel (planner-checked) and write the game index the package ships.

The offline generator (:mod:`bpo_envs.alfworld.generator`) is pure, but each candidate game is
checked by Fast Downward (about 1.8 s a game on one core here), which dominates. This script
generates the first ``--train`` / ``--valid-seen`` / ``--valid-unseen`` games of each split's
fixed shuffle (the order ``bpo-compare`` draws tasks in) with ``--jobs`` processes, times each
game, and writes the game index (:mod:`bpo_envs.alfworld.game_index`): per game the attempt the
planner accepted, its plan and a digest of its text. With the index a fresh machine rebuilds
the games in milliseconds without the planner (docs/alfworld.md, "Many training games"). Games
the index already lists are rebuilt from it (``BPO_ALFWORLD_INDEX=0`` planner-checks every one).

Resumable: every game is cached on disk as soon as it is made, so a stopped run started again
reads the games it made from the cache; with ``--index`` the index is also rewritten every
``--checkpoint`` games (games the index already lists are done first), so partial progress is
kept in the shipped file too.

    python scripts/alfworld_pack_games.py --train 1200 --valid-seen 1200 --valid-unseen 1200 \
        --jobs 2 --times docs/results/alfworld-games/generation.json \
        --index bpo_envs/alfworld/data/games-v3-seed0.json.gz
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any


def _one(split: str, task_id: str) -> dict[str, Any]:
    from bpo_envs.alfworld.games import GAME_FILE, GeneratedGames

    games = GeneratedGames(split, None, 200, 0)
    cached = (games.root / task_id / GAME_FILE).is_file()
    start, cpu = time.perf_counter(), time.process_time()
    games.game(task_id)
    how = "cache" if cached else next(iter(games.made))
    return {"split": split, "task_id": task_id, "cached": cached, "made": how,
            "seconds": round(time.perf_counter() - start, 3), "cpu_s": round(time.process_time() - cpu, 3)}  # fmt: skip


def order(split: str, count: int) -> list[str]:
    """The first ``count`` games of ``split``'s fixed shuffle (``bpo_experiments.tasks``)."""
    import numpy as np

    from bpo_envs.alfworld.generator import TASK_TYPES

    ids = [f"{t}/{i:04d}" for t in TASK_TYPES for i in range(200)]
    # the main job's shuffles (bpo_experiments.tasks): 12345 for the training env's tasks, 54321 for an evaluation split's
    rng = np.random.default_rng(12345 if split == "train" else 54321)
    return [ids[i] for i in rng.permutation(len(ids))][:count]


def _indexed_first(wanted: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], int]:
    """``wanted`` with the games the shipped index lists first (stable otherwise), and how many
    those are: a checkpoint is written only past them, so it keeps every game the index held."""
    from bpo_envs.alfworld.game_index import load_index

    index = load_index(3, 0)
    if index is None:
        return wanted, 0
    return sorted(wanted, key=lambda w: index.entry(*w) is None), sum(index.entry(*w) is not None for w in wanted)


def _write(path: str, done: list[tuple[str, str]]) -> dict[str, Any]:
    """Write the game index of the (cached) games ``done``."""
    from bpo_envs.alfworld.game_index import write_index
    from bpo_envs.alfworld.games import GeneratedGames

    root = GeneratedGames("train", None, 200, 0).root.parent
    splits = {split: [t for s, t in done if s == split] for split in ("train", "valid_seen", "valid_unseen")}
    return write_index(Path(path), root, splits, version=3, seed=0)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", type=int, default=1200)
    ap.add_argument("--valid-seen", type=int, default=1200)
    ap.add_argument("--valid-unseen", type=int, default=1200)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--times", default=None, help="JSON of the per-game generation times")
    ap.add_argument("--index", default=None, help="write the game index here (.json.gz)")
    ap.add_argument("--checkpoint", type=int, default=250, help="rewrite --index every this many games")
    ap.add_argument("--heldout", type=int, default=0,
                    help="also the training games at positions --heldout-from on (studies/alfworld_curve.py's selection set)")  # fmt: skip
    ap.add_argument("--heldout-from", type=int, default=1000)
    args = ap.parse_args(argv)
    wanted = [("train", t) for t in order("train", args.train)]
    selection = order("train", args.heldout_from + args.heldout)[max(args.heldout_from, args.train) :]
    wanted += [("train", t) for t in selection]
    wanted += [("valid_seen", t) for t in order("valid_seen", args.valid_seen)]
    wanted += [("valid_unseen", t) for t in order("valid_unseen", args.valid_unseen)]
    wanted, held = _indexed_first(wanted)
    load = os.getloadavg()
    start = time.perf_counter()
    rows = []
    with ProcessPoolExecutor(args.jobs) as pool:
        for row in pool.map(_one, *zip(*wanted, strict=True), chunksize=1):
            rows.append(row)
            if len(rows) % 50 == 0:
                print(f"{len(rows)}/{len(wanted)} games, {time.perf_counter() - start:.0f} s", flush=True)
            if args.index and len(rows) % args.checkpoint == 0 and held <= len(rows) < len(wanted):
                print(f"checkpoint: {_write(args.index, wanted[: len(rows)])}", flush=True)
    new = [r for r in rows if r["made"] == "planner"]
    result: dict[str, Any] = {
        "games": len(rows), "generated": len(new), "jobs": args.jobs, "cpus": os.cpu_count(),
        "machine": platform.machine(), "load_average_at_start": load, "load_average_at_end": os.getloadavg(),
        "wall_s": round(time.perf_counter() - start, 1),
        "made": {how: sum(r["made"] == how for r in rows) for how in ("cache", "index", "planner")},
    }  # fmt: skip
    if new:
        secs = [r["seconds"] for r in new]
        cpus = [r["cpu_s"] for r in new]
        result.update(median_s=statistics.median(secs), mean_s=round(statistics.mean(secs), 3), max_s=max(secs),
                      total_s=round(sum(secs), 1), slowest=sorted(new, key=lambda r: -r["seconds"])[:5])  # fmt: skip
        result["note"] = "seconds: wall per game in its worker (includes the planner subprocess); cpu_s: the worker's own CPU, not the planner's"
        result["mean_cpu_s_worker"] = round(statistics.mean(cpus), 3)
    if args.times:
        Path(args.times).parent.mkdir(parents=True, exist_ok=True)
        Path(args.times).write_text(json.dumps({**result, "rows": rows}, indent=1) + "\n")
    if args.index:
        result["index"] = _write(args.index, wanted)
    print(json.dumps({k: v for k, v in result.items() if k != "slowest"}), flush=True)
    return result


if __name__ == "__main__":
    main()

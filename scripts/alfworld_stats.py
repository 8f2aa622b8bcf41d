"""Statistics of ALFWorld games: the offline generator's, or those of a real ALFWorld data folder.

Per split: receptacles and objects per game (from the PDDL problem's declarations), the share
of objects that start inside a closed (openable) receptacle, the share of games whose lamp
stands on each receptacle class, and the length of the planner's plan per task type (the
``walkthrough`` stored with each game; Fast Downward's plan where none is stored). Run it on
the generated games and on ``$ALFWORLD_DATA`` to set them side by side:

    python scripts/alfworld_stats.py --games-per-type 20 --generator-version 2 --out gen.json
    python scripts/alfworld_stats.py --data-dir ~/.cache/alfworld --out alfworld.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

_DECL = re.compile(r"^\s*(\S+) - (object|receptacle)\s*$", re.M)
_IN = re.compile(r"\(inReceptacle (\S+) (\S+)\)")


def _class(pddl_id: str) -> str:
    return pddl_id.split("_bar_", 1)[0]


def game_stats(game: dict[str, Any], plan: list[str] | None) -> dict[str, Any]:
    """Counts of one ``game.tw-pddl``."""
    problem = game["pddl_problem"]
    init = problem.split("(:init", 1)[-1]
    decls = _DECL.findall(problem.split("(:init", 1)[0])
    receptacles = [name for name, kind in decls if kind == "receptacle"]
    objects = [name for name, kind in decls if kind == "object"]
    openable = {m for m in re.findall(r"\(openable (\S+)\)", init)}
    placed = _IN.findall(init)
    lamp_hosts = [_class(r) for o, r in placed if _class(o) in ("DeskLamp", "FloorLamp")]
    return {
        "receptacles": len(receptacles),
        "objects": len(objects),
        "inside_closed": sum(r in openable for _, r in placed) / max(len(placed), 1),
        "lamp_hosts": lamp_hosts,
        "plan_steps": len(plan) if plan is not None else None,
    }


def _summary(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "median": statistics.median(values), "min": min(values),
            "max": max(values), "n": len(values)} if values else {}  # fmt: skip


def collect(env: Any, limit_per_type: int | None) -> dict[str, Any]:
    per_type: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for task_id in env.task_ids():
        task_type = env.task_type(task_id)
        if limit_per_type is not None and len(per_type[task_type]) >= limit_per_type:
            continue
        game = env.games.game(task_id)
        plan = game.get("walkthrough")
        if not plan:
            env.reset(options={"task_id": task_id})
            plan = env.expert_actions()
        per_type[task_type].append(game_stats(game, plan))
    rows = [r for rs in per_type.values() for r in rs]
    hosts = Counter(h for r in rows for h in r["lamp_hosts"])
    return {
        "provenance": env.provenance(),
        "games": len(rows),
        "receptacles_per_game": _summary([r["receptacles"] for r in rows]),
        "objects_per_game": _summary([r["objects"] for r in rows]),
        "objects_inside_closed_receptacles": statistics.fmean(r["inside_closed"] for r in rows) if rows else None,
        "lamp_hosts": dict(hosts.most_common()),
        "plan_steps_per_task_type": {t: _summary([r["plan_steps"] for r in rs]) for t, rs in sorted(per_type.items())},
    }


def markdown(result: dict[str, Any]) -> str:
    lines = ["| split | games | receptacles/game | objects/game | objects in closed receptacles |", "|---|---:|---:|---:|---:|"]
    for split, r in result["splits"].items():
        lines.append(f"| {split} | {r['games']} | {r['receptacles_per_game']['mean']:.1f} (max {r['receptacles_per_game']['max']}) "
                     f"| {r['objects_per_game']['mean']:.1f} | {r['objects_inside_closed_receptacles']:.0%} |")  # fmt: skip
    types = sorted({t for r in result["splits"].values() for t in r["plan_steps_per_task_type"]})
    lines += ["", "| planner plan steps (mean) | " + " | ".join(result["splits"]) + " |",
              "|---|" + "---:|" * len(result["splits"])]  # fmt: skip
    for t in types:
        cells = [f"{r['plan_steps_per_task_type'].get(t, {}).get('mean', float('nan')):.1f}" for r in result["splits"].values()]
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", help="an ALFWorld data folder (default: the generated games)")
    ap.add_argument("--splits", nargs="+", default=["train", "valid_seen", "valid_unseen"])
    ap.add_argument("--games-per-type", type=int, default=10, help="games per task type and split")
    ap.add_argument("--generator-version", type=int, default=1, help="generated games: the generator version")
    ap.add_argument("--out", default="alfworld_stats.json")
    args = ap.parse_args(argv)
    from bpo_envs.alfworld import ALFWorldEnv

    result: dict[str, Any] = {"splits": {}}
    for split in args.splits:
        if args.data_dir:
            env = ALFWorldEnv(data_dir=args.data_dir, split=split)
        else:
            env = ALFWorldEnv(split=split, games_per_type=args.games_per_type, generator_version=args.generator_version)
        try:
            result["splits"][split] = collect(env, args.games_per_type)
        finally:
            env.close()
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    Path(args.out).with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()

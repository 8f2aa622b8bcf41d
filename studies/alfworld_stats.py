"""Statistics of ALFWorld games: the offline generator's, or those of a real ALFWorld data folder.

Per split: games and floor plans, games per task type, receptacles and objects per game (from the PDDL problem's declarations), the share
of objects that start inside a closed (openable) receptacle, the share of games whose lamp
stands on each receptacle class, and the length of the planner's plan per task type (the
``walkthrough`` stored with each game; Fast Downward's plan where none is stored). Run it on
the generated games and on ``$ALFWORLD_DATA`` to set them side by side:

    python studies/alfworld_stats.py --games-per-type 20 --generator-version 3 --out gen.json
    python studies/alfworld_stats.py --data-dir ~/.cache/alfworld --out alfworld.json
    python studies/alfworld_stats.py --compare v1=gen_v1.json v3=gen.json --out table

``--compare`` writes one markdown table with a column per JSON file and a column of the
published ALFRED/ALFWorld numbers (:data:`PUBLISHED`, each with its source; a cell is empty
where no number is published).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

# Published numbers, with their sources. Nothing here is estimated: a statistic the papers and
# the released data's documentation do not state is left out (an empty cell in the table).
PUBLISHED: dict[str, dict[str, Any]] = {
    "games": {
        "value": {"train": 3553, "valid_seen": 140, "valid_unseen": 134},
        "source": "ALFWorld (Shridhar et al., ICLR 2021); alfworld/alfworld data/README.md",
    },
    "scenes": {
        "value": {"train": 108, "valid_seen": 88, "valid_unseen": 4},
        "source": "ALFRED (Shridhar et al., CVPR 2020): floor plans per split of the ALFRED "
        "trajectories ALFWorld's games are drawn from (as tabulated in hitachi-rd-cv/prompter-alfred "
        "results/README.md); ALFWorld's own splits use at most these",
    },
    "games_per_task_type": {
        "value": {"valid_unseen": {"pick_and_place_simple": 24, "pick_clean_then_place_in_recep": 31,
                                   "pick_heat_then_place_in_recep": 23, "pick_cool_then_place_in_recep": 21,
                                   "look_at_obj_in_light": 18, "pick_two_obj_and_place": 17}},  # fmt: skip
        "source": "ReAct's ALFWorld evaluation of the 134 valid_unseen games (counts per task type "
        "given by its author in github.com/ysymyth/ReAct/issues/11)",
    },
}

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


def _scene(env: Any, task_id: str) -> int | None:
    path = Path(env.games.root) / task_id / "traj_data.json"
    try:
        return int(json.loads(path.read_text())["scene"]["scene_num"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


def collect(env: Any, limit_per_type: int | None) -> dict[str, Any]:
    per_type: dict[str, list[dict[str, Any]]] = defaultdict(list)
    scenes = set()
    for task_id in env.task_ids():
        task_type = env.task_type(task_id)
        if limit_per_type is not None and len(per_type[task_type]) >= limit_per_type:
            continue
        game = env.games.game(task_id)
        scenes.add(_scene(env, task_id))
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
        "scenes": len(scenes - {None}),
        "games_per_task_type": {t: len(rs) for t, rs in sorted(per_type.items())},
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


def _cell(value: Any, fmt: str = "{:.1f}") -> str:
    return "" if value is None else fmt.format(value)


def compare(results: dict[str, dict[str, Any]], splits: tuple[str, ...] = ("train", "valid_seen", "valid_unseen")) -> str:
    """One markdown table: a column per result (``alfworld_stats.json`` contents) and the
    published numbers; cells are ``train / valid_seen / valid_unseen``."""
    names = list(results)

    def per_split(get: Any, fmt: str = "{:.1f}") -> list[str]:
        cells = []
        for name in names:
            parts = []
            for split in splits:
                r = results[name]["splits"].get(split)
                parts.append(_cell(get(r) if r else None, fmt))
            cells.append(" / ".join(parts))
        return cells

    def published(key: str, sub: Any = None) -> str:
        value = PUBLISHED.get(key, {}).get("value", {})
        parts = []
        for split in splits:
            v = value.get(split)
            if sub is not None:
                v = (v or {}).get(sub)
            parts.append("" if v is None else str(v))
        return " / ".join(parts) if any(parts) else ""

    header = "| statistic (train / valid_seen / valid_unseen) | " + " | ".join(names) + " | published |"
    lines = [header, "|---|" + "---:|" * (len(names) + 1)]
    lines.append("| games measured (published: split size) | " + " | ".join(per_split(lambda r: r["games"], "{:d}"))
                 + f" | {published('games')} |")  # fmt: skip
    lines.append("| floor plans | " + " | ".join(per_split(lambda r: r.get("scenes"), "{:d}")) + f" | {published('scenes')} |")
    lines.append("| receptacles / game (mean) | " + " | ".join(per_split(lambda r: r["receptacles_per_game"]["mean"])) + " |  |")
    lines.append("| receptacles / game (max) | " + " | ".join(per_split(lambda r: r["receptacles_per_game"]["max"], "{:d}")) + " |  |")
    lines.append("| objects / game (mean) | " + " | ".join(per_split(lambda r: r["objects_per_game"]["mean"])) + " |  |")
    lines.append("| objects starting in a closed receptacle | "
                 + " | ".join(per_split(lambda r: r["objects_inside_closed_receptacles"], "{:.0%}")) + " |  |")  # fmt: skip
    types = sorted({t for res in results.values() for r in res["splits"].values() for t in r["plan_steps_per_task_type"]})
    for t in types:
        lines.append(f"| planner plan steps: {t} (mean) | "
                     + " | ".join(per_split(lambda r, t=t: r["plan_steps_per_task_type"].get(t, {}).get("mean"))) + " |  |")  # fmt: skip
    for t in types:
        lines.append(f"| games: {t} (published: valid_unseen split) | "
                     + " | ".join(per_split(lambda r, t=t: r.get("games_per_task_type", {}).get(t), "{:d}"))
                     + f" | {published('games_per_task_type', t)} |")  # fmt: skip
    lines.append("")
    lines += [f"* published {k.replace('_', ' ')}: {v['source']}" for k, v in PUBLISHED.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", help="an ALFWorld data folder (default: the generated games)")
    ap.add_argument("--splits", nargs="+", default=["train", "valid_seen", "valid_unseen"])
    ap.add_argument("--games-per-type", type=int, default=10, help="games per task type and split")
    ap.add_argument("--generator-version", type=int, default=None, help="generated games: the generator version (default: the env's)")
    ap.add_argument("--compare", nargs="+", metavar="NAME=JSON", help="tabulate earlier results beside the published numbers")
    ap.add_argument("--out", default="alfworld_stats.json")
    args = ap.parse_args(argv)
    if args.compare:
        results = {}
        for item in args.compare:
            name, _, path = item.partition("=")
            if not path:
                ap.error(f"--compare takes NAME=JSON, got {item!r}")
            results[name] = json.loads(Path(path).read_text())
        table = compare(results)
        Path(args.out).with_suffix(".md").write_text(table)
        print(table)
        return {"compare": list(results), "table": table}
    from bpo_envs.alfworld import ALFWorldEnv
    from bpo_envs.alfworld.generator import GENERATOR_VERSION

    version = GENERATOR_VERSION if args.generator_version is None else args.generator_version

    result: dict[str, Any] = {"splits": {}}
    for split in args.splits:
        if args.data_dir:
            env = ALFWorldEnv(data_dir=args.data_dir, split=split)
        else:
            env = ALFWorldEnv(split=split, games_per_type=args.games_per_type, generator_version=version)
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

"""How well alfworld's handcoded expert plays the ALFWorld games, next to the planner.

For each split and each game (the first ``--games`` of the fixed shuffle the main job draws its
tasks from, see ``bpo_experiments.tasks.task_split``): the handcoded expert
(``expert="handcoded"``) plays the game for up to ``--max-steps`` steps; recorded are whether it
won, its steps, why it gave up where it did, and whether any of its actions named an object
(``<name> <number>``) before that object had appeared in an observation of the episode (the
intro included). The planner's plan length from the reset state is recorded beside it. Writes
JSON (per split and task type: success, mean steps of the won games, the planner's mean plan
length, failure reasons, unseen-object actions) and a markdown table:

    python studies/alfworld_expert_stats.py --games 96 --out docs/results/alfworld-expert/expert.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

NAME = re.compile(r"\b([a-z]+ \d+)\b")
SHUFFLE_SEED = {"train": 12345, "valid_seen": 54321, "valid_unseen": 54321}


def shuffled_ids(env: Any, split: str) -> list[str]:
    ids = list(env.task_ids())
    rng = np.random.default_rng(SHUFFLE_SEED[split])
    return [ids[i] for i in rng.permutation(len(ids))]


def play(env: Any, task_id: str, max_steps: int) -> dict[str, Any]:
    """One episode of the handcoded expert on ``task_id``."""
    obs, info = env.reset(options={"task_id": task_id})
    seen = set(NAME.findall(obs))
    actions: list[str] = []
    unseen: list[str] = []
    won, reason = False, None
    for _ in range(max_steps):
        plan = env.expert_actions()
        if not plan:
            reason = env.expert_failure or "no action"
            break
        action = plan[0]
        unseen += [f"{action!r}: {n}" for n in NAME.findall(action) if n not in seen]
        obs, _, terminated, truncated, info = env.step(action)
        actions.append(action)
        seen.update(NAME.findall(obs))
        if terminated or truncated:
            won = bool(info["won"])
            break
    if not won and reason is None:
        reason = f"not won within {max_steps} steps"
    return {"task_id": task_id, "won": won, "steps": len(actions), "failure": reason, "unseen_names": unseen}


def planner_length(env: Any, task_id: str) -> int:
    """The planner's plan length from the reset state: the game's stored ``walkthrough`` (the
    generator stores the plan that verified the game), else Fast Downward's plan."""
    walkthrough = env.games.game(task_id).get("walkthrough")
    if walkthrough:
        return len(walkthrough)
    env.reset(options={"task_id": task_id})
    return len(env.expert_actions())


def _reason_class(reason: str | None) -> str | None:
    if reason is None:
        return None
    return re.sub(r"\(.*\)", "(...)", reason)


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    won = [r for r in rows if r["won"]]
    return {
        "games": len(rows),
        "success": len(won) / len(rows) if rows else None,
        "mean_steps_won": statistics.mean(r["steps"] for r in won) if won else None,
        "mean_planner_steps": statistics.mean(r["planner_steps"] for r in rows) if rows else None,
        "failures": dict(Counter(_reason_class(r["failure"]) for r in rows if not r["won"])),
        "actions_naming_unseen_objects": sum(len(r["unseen_names"]) for r in rows),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--splits", nargs="+", default=["train", "valid_seen", "valid_unseen"])
    ap.add_argument("--games", type=int, default=96, help="games per split (first of the fixed shuffle)")
    ap.add_argument("--max-steps", type=int, default=50)
    ap.add_argument("--out", default="alfworld_expert.json")
    args = ap.parse_args(argv)

    from bpo_envs.alfworld import ALFWorldEnv

    out: dict[str, Any] = {"max_steps": args.max_steps, "games_per_split": args.games, "splits": {}}
    for split in args.splits:
        start = time.perf_counter()
        hand = ALFWorldEnv(split=split, expert="handcoded", max_episode_steps=args.max_steps)
        planner = ALFWorldEnv(split=split, expert="planner", max_episode_steps=args.max_steps)
        rows = []
        try:
            for task_id in shuffled_ids(hand, split)[: args.games]:
                row = play(hand, task_id, args.max_steps)
                row["planner_steps"] = planner_length(planner, task_id)
                row["task_type"] = hand.task_type(task_id)
                rows.append(row)
                print(split, task_id, row["won"], row["steps"], row["planner_steps"], row["failure"] or "", flush=True)
        finally:
            hand.close()
            planner.close()
        by_type: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            by_type[row["task_type"]].append(row)
        out["splits"][split] = {
            "data": hand.provenance(),
            "all": summarise(rows),
            "per_task_type": {t: summarise(r) for t, r in sorted(by_type.items())},
            "seconds": round(time.perf_counter() - start, 1),
            "games": rows,
        }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    path.with_suffix(".md").write_text(table(out))
    print(table(out))
    return out


SHORT = {
    "pick_and_place_simple": "Pick", "look_at_obj_in_light": "Look", "pick_clean_then_place_in_recep": "Clean",
    "pick_heat_then_place_in_recep": "Heat", "pick_cool_then_place_in_recep": "Cool", "pick_two_obj_and_place": "Pick2",
}


def table(out: dict[str, Any]) -> str:
    lines = [
        f"Handcoded expert vs planner, generated v3 games, {out['max_steps']}-step limit: success (games) / "
        "mean steps of the won games / the planner's mean plan length",
        "",
        "| split | " + " | ".join(SHORT.values()) + " | all |",
        "|---|" + "---|" * (len(SHORT) + 1),
    ]
    for split, data in out["splits"].items():
        cells = []
        for t in [*SHORT, "all"]:
            s = data["all"] if t == "all" else data["per_task_type"].get(t)
            if not s or not s["games"]:
                cells.append("")
                continue
            steps = f"{s['mean_steps_won']:.1f}" if s["mean_steps_won"] is not None else "-"
            cells.append(f"{100 * s['success']:.0f}% ({s['games']}) / {steps} / {s['mean_planner_steps']:.1f}")
        lines.append(f"| {split} | " + " | ".join(cells) + " |")
    lines.append("")
    for split, data in out["splits"].items():
        lines.append(f"{split}: failures {data['all']['failures']}; actions naming an object not yet observed: "
                     f"{data['all']['actions_naming_unseen_objects']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

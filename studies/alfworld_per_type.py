"""ALFWorld success per task type, beside verl-agent's published Qwen2.5-1.5B numbers.

Evaluates policies of a preset's ALFWorld setting on its evaluation games of ``valid_seen`` and
``valid_unseen`` (the tasks ``bpo-compare`` draws, common random numbers as there), per task
type: the warm start (the preset's behaviour-cloned policy, rebuilt here exactly as the main
job builds it) and, with ``--runs DIR`` (a ``bpo-compare --out`` folder), each algorithm's final
policy from its run checkpoints. Writes JSON and a markdown table with the published column:

    python studies/alfworld_per_type.py --preset cpu --seeds 0 --out docs/results/alfworld-per-type/cpu.json
    python studies/alfworld_per_type.py --preset cpu --runs runs-alfworld --out per_type.json
    python studies/alfworld_per_type.py --from-curve docs/results/alfworld-curve/curve.json --out per_type.json

``--from-curve`` tabulates the warm starts that ``studies/alfworld_curve.py`` evaluated (its rows
keep every episode's outcome), without playing again.

The published numbers (verl-agent, Feng et al. 2025, "Group-in-Group Policy Optimization for LLM
Agent Training", Table 1, Qwen2.5-1.5B-Instruct) come from a 1.5B-parameter LLM trained on
ALFWorld's real training games with far more rollouts and updates, and evaluated on ALFWorld's
own evaluation games (as verl-agent sets them up); the policy here is a ~1M-parameter text scorer trained on 60
generated games for a few minutes of CPU. They are a reference point, not a like-for-like row.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

SHORT = {
    "pick_and_place_simple": "Pick", "look_at_obj_in_light": "Look", "pick_clean_then_place_in_recep": "Clean",
    "pick_heat_then_place_in_recep": "Heat", "pick_cool_then_place_in_recep": "Cool", "pick_two_obj_and_place": "Pick2",
}
PUBLISHED = {
    "source": "verl-agent (GiGPO paper, Feng et al. 2025, Table 1): Qwen2.5-1.5B-Instruct, ALFWorld's real games",
    "GRPO": {"all": 72.8},
    "GiGPO": {"Pick": 96.0, "Look": 76.5, "Clean": 91.8, "Heat": 91.3, "Cool": 71.7, "Pick2": 79.5, "all": 86.1},
}


def per_type(task_ids: list[str], wins: list[float], episodes: int, task_type: Any) -> dict[str, float]:
    by: dict[str, list[float]] = defaultdict(list)
    for i, task in enumerate(task_ids):
        by[SHORT[task_type(task)]] += wins[i * episodes : (i + 1) * episodes]
    out = {t: float(np.mean(by[t])) for t in SHORT.values() if by[t]}
    out["all"] = float(np.mean(wins))
    out["episodes"] = len(wins)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--seeds", nargs="+", type=int, help="default: the preset's ALFWorld seeds")
    ap.add_argument("--runs", help="a bpo-compare --out folder: tabulate its recorded episodes (warm start, every split's "
                    "final episodes it keeps) and replay each algorithm's final checkpoint on the primary split")
    ap.add_argument("--splits", nargs="+", default=["valid_seen", "valid_unseen"])
    ap.add_argument("--episodes", type=int, help="episodes per game (default: the preset's)")
    ap.add_argument("--from-curve", help="a studies/alfworld_curve.py JSON: tabulate its rows instead of playing")
    ap.add_argument("--out", default="alfworld_per_type.json")
    args = ap.parse_args(argv)
    if args.from_curve:
        return write(from_curve(json.loads(Path(args.from_curve).read_text())), Path(args.out))

    import bpo_envs  # noqa: F401
    from bpo_algos.rollout import EnvPool
    from bpo_envs.alfworld import ALFWorldEnv
    from bpo_experiments.build import make_policy
    from bpo_experiments.evaluation import evaluate_episodes
    from bpo_experiments.presets import PRESETS
    from bpo_experiments.run_config import env_config
    from bpo_experiments.tasks import env_factory, task_split

    preset = PRESETS[args.preset]
    if preset.torch_threads:
        torch.set_num_threads(preset.torch_threads)
    setup = preset.envs["alfworld"]
    alfworld = env_config(preset, "alfworld")
    seeds = args.seeds or list(alfworld.seeds)
    episodes = args.episodes or alfworld.evaluation.episodes
    train, _ = task_split(setup)
    types = ALFWorldEnv(split="train", games_per_type=1).games
    out: dict[str, Any] = {"preset": args.preset, "episodes_per_game": episodes, "published": PUBLISHED, "policies": {}}
    if args.runs:
        return write(from_runs(Path(args.runs), preset, setup, seeds, train, types.task_type, out), Path(args.out))
    for seed in seeds:
        policies = {"warm start": make_policy(alfworld.policy, setup, seed, train)}
        for split in args.splits:
            eval_setup = replace(setup, eval_split=split)
            _, tasks = task_split(eval_setup)
            pool = EnvPool([lambda split=split: env_factory(replace(setup, kwargs={**setup.kwargs, "split": split}))()] * 2)
            try:
                for name, policy in policies.items():
                    wins = evaluate_episodes(policy, pool, tasks, episodes, seed)
                    row = per_type(tasks, wins, episodes, types.task_type)
                    out["policies"].setdefault(name, {}).setdefault(split, {})[f"seed{seed}"] = row
                    print(name, split, seed, json.dumps(row), flush=True)
            finally:
                pool.close()
    return write(out, Path(args.out))


def from_runs(runs: Path, preset: Any, setup: Any, seeds: list[int], train: list[Any], task_type: Any, out: dict[str, Any]) -> dict[str, Any]:
    """The per-type rows of a ``bpo-compare`` folder's own evaluation episodes: the warm start's
    (``initial.json`` keeps every split's), each run's final episodes of the further splits
    (``extra_eval.json``), and its final episodes of the primary split, which the folder keeps as a
    mean only: replayed from the run's last checkpoint on the same evaluation streams (so they are
    the main job's episodes; the replay's mean is checked against the recorded final success)."""
    import bpo_envs  # noqa: F401
    from bpo_algos.rollout import EnvPool
    from bpo_experiments.build import make_policy
    from bpo_experiments.evaluation import evaluate_episodes
    from bpo_experiments.run_config import env_config
    from bpo_experiments.tasks import eval_env_factory, extra_eval_tasks, task_split

    alfworld = env_config(preset, "alfworld")
    env_runs = runs / "runs" / "alfworld"
    _, primary = task_split(setup)
    tasks = {setup.eval_split: primary, **extra_eval_tasks(setup)}
    episodes = alfworld.evaluation.episodes
    out.update(source=f"bpo-compare folder {runs}: its own evaluation episodes", episodes_per_game=episodes)
    pool = EnvPool([eval_env_factory(setup)] * 2)
    try:
        for seed in seeds:
            warm = json.loads((env_runs / "_initial" / f"seed{seed}" / "initial.json").read_text())
            recorded = {"warm start": {setup.eval_split: warm["wins"], **{k: v["wins"] for k, v in warm.get("extra", {}).items()}}}
            for algorithm in preset.algorithms:
                folder = env_runs / algorithm / f"seed{seed}"
                run = json.loads((folder / "run.json").read_text())
                extra = json.loads((folder / "extra_eval.json").read_text()) if (folder / "extra_eval.json").exists() else {}
                policy = make_policy(replace(alfworld.policy, sft_epochs=0), replace(setup, sft_epochs=0), seed, train)
                policy.load_state_dict(torch.load(folder / "checkpoint.pt", weights_only=True)["policy"])
                wins = evaluate_episodes(policy, pool, primary, episodes, seed)
                final = run["evals"][-1]["success"]
                if abs(float(np.mean(wins)) - final) > 1e-9:
                    raise SystemExit(f"{folder}: the replayed final success {np.mean(wins):.4f} is not the recorded {final:.4f}")
                recorded[algorithm] = {setup.eval_split: wins, **{k: v["wins"] for k, v in extra.items()}}
            for name, splits in recorded.items():
                for split, wins in splits.items():
                    row = per_type(tasks[split], wins, episodes, task_type)
                    out["policies"].setdefault(name, {}).setdefault(split, {})[f"seed{seed}"] = row
                    print(name, split, seed, json.dumps(row), flush=True)
    finally:
        pool.close()
    return out


def from_curve(curve: dict[str, Any]) -> dict[str, Any]:
    """The per-type rows of every warm start of a learning-curve JSON (one seed, 1 episode a game)."""
    out: dict[str, Any] = {"source": "studies/alfworld_curve.py", "episodes_per_game": curve["eval_episodes"], "published": PUBLISHED, "policies": {}}
    for row in curve["rows"]:
        name = f"warm start: {row['policy']}, {row['games']} games"
        for split in ("valid_seen", "valid_unseen"):
            if split in row:
                result = per_type(row[split]["tasks"], row[split]["wins"], curve["eval_episodes"], lambda t: t.split("/", 1)[0])
                out["policies"].setdefault(name, {}).setdefault(split, {})[f"seed{curve['seed']}"] = result
    return out


def write(out: dict[str, Any], path: Path) -> dict[str, Any]:
    for splits in out["policies"].values():
        for rows in splits.values():
            keys = [k for k in next(iter(rows.values())) if k != "episodes"]
            rows["mean"] = {k: float(np.mean([r[k] for s, r in rows.items() if s.startswith("seed") and k in r])) for k in keys}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    path.with_suffix(".md").write_text(table(out))
    print(table(out))
    return out


def table(out: dict[str, Any]) -> str:
    cols = [*SHORT.values(), "all"]
    lines = [
        "| policy | split | " + " | ".join(cols) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    for name, splits in out["policies"].items():
        for split, rows in splits.items():
            m = rows["mean"]
            lines.append(f"| {name} | {split} | " + " | ".join(f"{100 * m[c]:.0f}" if c in m else "" for c in cols) + " |")
    for name in ("GRPO", "GiGPO"):
        pub = out["published"][name]
        lines.append(f"| verl-agent {name}, Qwen2.5-1.5B (published) | ALFWorld's real games | " + " | ".join(f"{pub[c]:.1f}" if c in pub else "" for c in cols) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

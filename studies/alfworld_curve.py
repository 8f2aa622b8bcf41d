"""The ALFWorld warm start's learning curve: held-out success against training games and capacity.

For each number of distinct training games (the first N of the main job's fixed shuffle) and
each scorer size (``build.SCORER_POLICIES``), the warm start is built exactly as ``bpo-compare``
builds it (behaviour cloning on the handcoded expert's demos of those games, the preset's epochs
and learning rate, the seed's warm-start stream) and evaluated, one episode a game, on the
first ``--valid-seen`` games of ``valid_seen`` and ``--valid-unseen`` of ``valid_unseen`` (the
main job's evaluation streams: the same episodes for every row). Also the fit: the share of the
training decisions where the expert's action is the policy's argmax. With ``--heldout N``, also
``train_heldout``: the ``N`` training games at positions ``--heldout-from`` on of the training
shuffle, which no row trains on (the selection set: a choice made from this curve is made on
it, never on the evaluation splits). Writes JSON after every row and, with ``--plot``, a PNG:

    python studies/alfworld_curve.py --games 60 250 1000 --policies scorer-memory scorer-memory-wide \
        --out docs/results/alfworld-curve/curve.json --plot docs/results/alfworld-curve/curve.png
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch


def wilson(wins: int, n: int) -> list[float]:
    """The 95% Wilson interval of ``wins`` out of ``n``."""
    if n == 0:
        return [float("nan"), float("nan")]
    z, p = 1.96, wins / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [centre - half, centre + half]


def _epochs(row: dict[str, Any], result: dict[str, Any]) -> int:
    return int(row.get("sft_epochs", result["sft_epochs"]))


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = [s for s in ("train_heldout", "valid_seen", "valid_unseen") if s in result["eval_games"]]
    fig, axes = plt.subplots(1, len(splits), figsize=(5 * len(splits), 4), sharey=True)
    for ax, split in zip(axes, splits, strict=True):
        for policy in result["policies"]:
            for epochs in sorted({_epochs(r, result) for r in result["rows"]}, reverse=True):
                rows = sorted((r for r in result["rows"] if r["policy"] == policy and split in r and _epochs(r, result) == epochs), key=lambda r: r["games"])
                if not rows:
                    continue
                x = [r["games"] for r in rows]
                y = [r[split]["success"] for r in rows]
                lo = [r[split]["success"] - r[split]["ci95"][0] for r in rows]
                hi = [r[split]["ci95"][1] - r[split]["success"] for r in rows]
                label = f"{policy} ({rows[0]['parameters'] / 1e6:.1f}M), {epochs} epochs"
                ax.errorbar(x, y, yerr=[lo, hi], marker="o" if epochs == result["sft_epochs"] else "s", capsize=3, label=label)
                ax.plot(x, [r["train_agree"] for r in rows], ls=":", color=ax.lines[-1].get_color(), alpha=0.6)
        name = "held-out training games (selection set)" if split == "train_heldout" else split
        ax.set(xscale="log", xlabel="distinct training games (behaviour cloning)", title=f"{name} ({result['eval_games'][split]} games x 1)")
        ax.set_xticks(result["games"], [str(g) for g in result["games"]])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("success (95% Wilson interval)\ndotted: expert's action = argmax, training decisions")
    axes[-1].legend(fontsize=8)
    fig.suptitle("ALFWorld warm start: behaviour cloning on the handcoded expert, generated v3 games", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--games", type=int, nargs="+", default=[60, 250, 1000])
    ap.add_argument("--policies", nargs="+", default=["scorer-memory", "scorer-memory-wide"])
    ap.add_argument("--valid-seen", type=int, default=140)
    ap.add_argument("--valid-unseen", type=int, default=134)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="alfworld_curve.json")
    ap.add_argument("--plot", default=None)
    ap.add_argument("--policies-dir", default=None, help="keep each cloned policy here (state dict) and reuse it")
    ap.add_argument("--bc-only", action="store_true", help="clone (into --policies-dir) and stop before evaluating")
    ap.add_argument("--eval-only", action="store_true", help="only the rows whose policy --policies-dir holds already")
    ap.add_argument("--splits", nargs="+", default=["train_heldout", "valid_seen", "valid_unseen"], help="the splits to evaluate")
    ap.add_argument("--sft-epochs", type=int, default=None, help="cloning epochs (default: the preset's)")
    ap.add_argument("--heldout", type=int, default=0, help="evaluate this many held-out training games too (train_heldout)")
    ap.add_argument("--heldout-from", type=int, default=1000, help="train_heldout's first position in the training shuffle")
    args = ap.parse_args(argv)

    from bpo_algos.policy.sft import demo_steps
    from bpo_algos.rollout import EnvPool
    from bpo_experiments import build, evaluation, streams
    from bpo_experiments.presets import PRESETS
    from bpo_experiments.run_config import policy_settings
    from bpo_experiments.tasks import extra_eval_tasks, task_order, task_split

    preset = PRESETS[args.preset]
    if preset.torch_threads:
        torch.set_num_threads(preset.torch_threads)
    base = preset.envs["alfworld"]
    setup = replace(base, train_tasks=max(args.games), eval_tasks=args.valid_seen, eval_split="valid_seen",
                    extra_eval={"valid_unseen": args.valid_unseen})  # fmt: skip
    order = task_order(setup)
    evals = {"valid_seen": task_split(setup)[1], **extra_eval_tasks(setup)}
    if args.heldout:
        if max(args.games) > args.heldout_from:
            raise SystemExit(f"--heldout-from {args.heldout_from} must not be below the most training games, {max(args.games)}")
        held = replace(setup, train_tasks=args.heldout_from + args.heldout)
        evals["train_heldout"] = task_order(held)[args.heldout_from : args.heldout_from + args.heldout]
    path = Path(args.out)
    result: dict[str, Any] = {
        "preset": args.preset, "seed": args.seed, "games": sorted(args.games), "policies": args.policies,
        "eval_games": {k: len(v) for k, v in evals.items()}, "eval_episodes": 1,
        "sft_epochs": base.sft_epochs, "sft_lr": base.sft_lr if base.sft_lr is not None else preset.sft_lr,
        "cpus": os.cpu_count(), "load_average_at_start": os.getloadavg(), "rows": [],
    }  # fmt: skip
    if path.is_file():  # resume: rows already measured are kept
        old = json.loads(path.read_text())
        result["rows"] = old.get("rows", [])
        result["games"] = sorted({*old.get("games", []), *args.games})
        result["policies"] = list(dict.fromkeys([*old.get("policies", []), *args.policies]))
        result["eval_games"] = {**old.get("eval_games", {}), **result["eval_games"]}
    epochs = base.sft_epochs if args.sft_epochs is None else args.sft_epochs
    done = {(r["games"], r["policy"], _epochs(r, result)): r for r in result["rows"]}
    for games in sorted(args.games):
        for name in args.policies:
            # a row measured already is kept; one that lacks a split asked for now gets it (the
            # cloning is seeded, so the policy is the row's policy again)
            old_row = done.get((games, name, epochs))
            if old_row is not None and all(s in old_row for s in args.splits if s in evals):
                continue
            start, cpu = time.time(), time.process_time()
            tasks = order[:games]
            saved = Path(args.policies_dir, f"{games}-{name}-seed{args.seed}" + ("" if epochs == base.sft_epochs else f"-{epochs}ep") + ".pt") if args.policies_dir else None
            cloned = saved is None or not saved.is_file()
            if args.eval_only and cloned:
                continue
            made = replace(setup, policy=name, train_tasks=games, sft_epochs=epochs if cloned else 0)
            policy = build.make_policy(policy_settings(preset, made), made, args.seed, tasks)
            if saved is not None and cloned:
                saved.parent.mkdir(parents=True, exist_ok=True)
                torch.save({"policy": policy.state_dict(), "bc_seconds": time.time() - start, "bc_cpu_s": time.process_time() - cpu}, saved)
            kept = torch.load(saved, weights_only=True) if saved is not None else {"bc_seconds": time.time() - start, "bc_cpu_s": time.process_time() - cpu}
            if not cloned:
                policy.load_state_dict(kept["policy"])
            if args.bc_only:
                print(f"cloned {name} on {games} games: {kept['bc_seconds']:.0f} s", flush=True)
                continue
            demos = build._expert_demos(replace(setup, train_tasks=games), tasks, streams.stream_seed(args.seed, streams.WARM_START))
            row: dict[str, Any] = {"games": games, "policy": name, "sft_epochs": epochs, "parameters": sum(p.numel() for p in policy.parameters()),
                                   "decisions": len(demos), "bc_seconds": round(kept["bc_seconds"], 1), "bc_cpu_s": round(kept["bc_cpu_s"], 1)}  # fmt: skip
            steps = demo_steps(policy, demos)
            with torch.no_grad():
                best = [max(d, key=d.get) for d in map(policy.action_distribution, (s.context for s in steps))]
            row["train_agree"] = sum(b == s.action.text for b, s in zip(best, steps, strict=True)) / len(steps)
            if old_row is not None:
                # re-cloned by another code version, the policy may differ from the row's: said in the row
                same = abs(old_row["train_agree"] - row["train_agree"]) < 1e-9
                result["rows"].remove(old_row)
                row = dict(old_row) if not cloned else {**old_row, "reclone": {"bc_seconds": row["bc_seconds"], "bc_cpu_s": row["bc_cpu_s"], "train_agree": row["train_agree"],
                                              "same_fit_as_the_row": same, "splits": [s for s in args.splits if s not in old_row]}}  # fmt: skip
            for split in args.splits:  # in the order asked; each split keeps its own streams (k)
                if split not in evals or split in row:
                    continue
                k, ids = list(evals).index(split), evals[split]
                t0, c0 = time.time(), time.process_time()
                kwargs = {**setup.kwargs, "split": "train" if split == "train_heldout" else split}
                pool = EnvPool([lambda kwargs=kwargs: gym.make(setup.env_id, **kwargs)] * preset.pool_size, workers=setup.workers)
                try:
                    wins = evaluation.evaluate_episodes(policy, pool, ids, 1, args.seed, split=k)
                finally:
                    pool.close()
                row[split] = {"success": sum(wins) / len(wins), "ci95": wilson(int(sum(wins)), len(wins)), "episodes": len(wins),
                              "wins": [int(w) for w in wins], "tasks": list(ids), "seconds": round(time.time() - t0, 1),
                              "cpu_s": round(time.process_time() - c0, 1)}  # fmt: skip
                path.parent.mkdir(parents=True, exist_ok=True)  # every split as soon as it is measured
                path.write_text(json.dumps({**result, "rows": [*result["rows"], row]}, indent=1) + "\n")
            row["load_average"] = os.getloadavg()
            result["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in evals}
                             | {s: row[s]["success"] for s in evals if s in row}), flush=True)  # fmt: skip
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result, indent=1) + "\n")
    result["load_average_at_end"] = os.getloadavg()
    path.write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        plot(result, Path(args.plot))
    return result


if __name__ == "__main__":
    main()

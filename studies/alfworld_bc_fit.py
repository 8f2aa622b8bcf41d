"""How well the CPU default's ALFWorld scorer fits the handcoded expert it is cloned from.

For each number of behaviour-cloning epochs (the preset's policy and learning rate, rebuilt as
the main job builds its warm start): the per-decision agreement (argmax = the expert's action)
and mean NLL on the training games' demos, and sampled success (2 episodes a game) on 48 of those
training games and on the preset's 48 `valid_seen` evaluation games. It separates fitting the
expert from generalising to new rooms:

    python studies/alfworld_bc_fit.py --epochs 10 30 --out docs/results/alfworld-rl-pilots/bc_fit.json
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--epochs", nargs="+", type=int, default=[10, 30])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bc_fit.json")
    args = ap.parse_args(argv)

    from bpo_algos.policy.sft import demo_steps
    from bpo_algos.rollout import EnvPool
    from bpo_experiments import build, evaluation
    from bpo_experiments.presets import PRESETS
    from bpo_experiments.run_config import policy_settings
    from bpo_experiments.tasks import env_factory, eval_env_factory, task_split

    preset = PRESETS[args.preset]
    if preset.torch_threads:
        torch.set_num_threads(preset.torch_threads)
    setup = preset.envs["alfworld"]
    train, valid = task_split(setup)
    demos = build._expert_demos(setup, train, args.seed)  # the per-process cache make_policy fills
    out: dict[str, Any] = {"preset": args.preset, "seed": args.seed, "demos": len(demos)}
    for epochs in args.epochs:
        start = time.time()
        cloned = replace(setup, sft_epochs=epochs)
        policy = build.make_policy(policy_settings(preset, cloned), cloned, args.seed, train)
        row: dict[str, Any] = {"epochs": epochs, "bc_seconds": time.time() - start}
        steps = demo_steps(policy, demos)
        with torch.no_grad():
            row["nll"] = -float(policy.token_logprobs(steps).sum()) / len(steps)
            best = [max(d, key=d.get) for d in map(policy.action_distribution, (s.context for s in steps))]
        row["agree"] = sum(b == s.action.text for b, s in zip(best, steps, strict=True)) / len(steps)
        for split, tasks, make in (("train", train[:48], env_factory(setup)), ("valid_seen", valid, eval_env_factory(setup))):
            pool = EnvPool([make] * preset.pool_size, workers=setup.workers)
            try:
                wins = evaluation.evaluate_episodes(policy, pool, tasks, 2, args.seed)
            finally:
                pool.close()
            row[split] = sum(wins) / len(wins)
        out[str(epochs)] = row
        print(json.dumps(row), flush=True)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()

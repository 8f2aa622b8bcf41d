"""Behaviour-clone an LLM policy on an env's expert once, check it, save it for ``bpo-diagnose``.

``bpo-diagnose --sft-epochs E`` clones inside every run; on a CPU the cloning is most of a
small diagnosis (docs/regime.md, "LLM policies"). This script does the same warm start once
(the tool's policy build with the given env settings and training tasks, then
:func:`bpo_algos.policy.sft.behaviour_cloning` on the expert's demos of those tasks, with the
warm-start seed stream), measures what the warm start does on a few training tasks (mean
return, success, share of invalid actions over ``--check-batches`` RLOO-``--check-group``
batches, as ``bpo-diagnose`` reports them) and saves the model folder, so that each diagnosis
(reasoning off and on) starts from it: ``bpo-diagnose ENV --policy FOLDER --sft-epochs 0``.
Unlike the tool's warm start, ``--sft-batch-size`` is free (the tool clones in batches of 16:
on a few tasks' decisions that is one optimizer step an epoch)::

    OMP_NUM_THREADS=1 python scripts/llm_warm_start.py BPO-ALFWorld-v0 --policy smollm2 \\
        --env-kwargs '{"max_episode_steps": 15, "invalid_penalty": 0.1}' --tasks 2 \\
        --sft-epochs 2 --sft-lr 2e-4 --sft-batch-size 2 --max-new-tokens 24 --no-reasoning \\
        --check-batches 0 --save /tmp/alfworld-smollm2-bc --json warm_start.json
    OMP_NUM_THREADS=1 bpo-diagnose BPO-ALFWorld-v0 --policy /tmp/alfworld-smollm2-bc --sft-epochs 0 \\
        --env-kwargs '{"max_episode_steps": 15, "invalid_penalty": 0.1}' --tasks 2 ...

The diagnosis must use the same env settings and ``--tasks`` (it draws from the tasks cloned,
as the tool's own warm start does).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bpo_algos import Budget
from bpo_algos.policy.sft import behaviour_cloning, demo_steps
from bpo_algos.rollout import EnvPool
from bpo_envs.seeding import key_seed
from bpo_experiments.build import _expert_demos
from bpo_experiments.diagnose import (
    LLM_FLAGS,
    apply_llm_flags,
    behaviour,
    build_policy,
    collect,
    find_setup,
)
from bpo_experiments.streams import WARM_START, stream_seed
from bpo_experiments.tasks import env_factory, task_split


def write(report: dict[str, Any], path: str | None) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(report, indent=1, default=str))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("env_id")
    parser.add_argument("--policy", default="smollm2")
    parser.add_argument("--preset")
    parser.add_argument("--env-kwargs")
    parser.add_argument("--tasks", type=int, required=True, help="training tasks cloned (bpo-diagnose --tasks)")
    parser.add_argument("--sft-epochs", type=int, default=2)
    parser.add_argument("--sft-lr", type=float, default=1e-4)
    parser.add_argument("--sft-batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--reasoning", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--check-tasks", type=int, default=2, help="tasks per check batch")
    parser.add_argument("--check-batches", type=int, default=1, help="0: no check (the diagnosis reports the same)")
    parser.add_argument("--check-group", type=int, default=4, choices=(2, 4, 8))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", help="folder for the warm-started model")
    parser.add_argument("--json", help="file for the report")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    preset, env_name, setup = find_setup(args.env_id, args.preset)
    if args.env_kwargs:
        setup.kwargs = {**setup.kwargs, **json.loads(args.env_kwargs)}
    setup.train_tasks = args.tasks
    flags = {name: None for name in LLM_FLAGS}
    flags.update(sft_epochs=0, max_new_tokens=args.max_new_tokens, reasoning=args.reasoning)
    apply_llm_flags(preset, setup, flags)
    preset.envs = {**preset.envs, env_name: setup}
    tasks, _ = task_split(replace(setup, eval_split="train"))
    torch.manual_seed(args.seed)
    policy = build_policy(args.policy, preset, setup, args.seed, tasks)  # not cloned (sft_epochs 0)
    loaded = (time.perf_counter() - wall0, time.process_time() - cpu0)
    print(f"model: {loaded[0]:.0f} s wall, {loaded[1]:.0f} s CPU", flush=True)

    seed = stream_seed(args.seed, WARM_START)  # the tool's warm-start stream (build.make_policy)
    demos = _expert_demos(setup, tasks, seed)
    steps = demo_steps(policy, demos)
    wall1, cpu1 = time.perf_counter(), time.process_time()
    losses = behaviour_cloning(policy, demos, epochs=args.sft_epochs, lr=args.sft_lr, batch_size=args.sft_batch_size, seed=seed)
    cloning = (time.perf_counter() - wall1, time.process_time() - cpu1)
    print(f"cloning: {len(steps)} decisions x {args.sft_epochs} epochs, {len(losses)} optimizer steps, "
          f"loss {losses[0]:.3f} -> {losses[-1]:.3f}; {cloning[0]:.0f} s wall, {cloning[1]:.0f} s CPU", flush=True)
    if args.save:
        policy.save_pretrained(args.save)

    report: dict[str, Any] = {
        "command": "python scripts/llm_warm_start.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "env_id": args.env_id,
        "env_kwargs": setup.kwargs,
        "tasks": [str(t) for t in tasks],
        "expert_decisions": len(steps),
        "sft": {"epochs": args.sft_epochs, "lr": args.sft_lr, "batch_size": args.sft_batch_size,
                "optimizer_steps": len(losses), "loss_first": losses[0], "loss_last": losses[-1],
                "loss_per_epoch": [float(np.mean(c)) for c in np.array_split(np.asarray(losses), args.sft_epochs)]},
        "check": None,
        "seconds": {"model": loaded, "cloning": cloning, "_fields": ["wall", "cpu"]},
        "load_average": list(os.getloadavg()),
        "saved": args.save,
    }
    write(report, args.json)
    if args.check_batches > 0:
        wall2, cpu2 = time.perf_counter(), time.process_time()
        pool = EnvPool([env_factory(setup)])
        try:
            batches, _, _ = collect(f"rloo-{args.check_group}", policy, pool, tasks, min(args.check_tasks, len(tasks)),
                                    Budget("env_steps", 1.0), args.check_batches, 0, key_seed(args.seed, 7), False)
        finally:
            pool.close()
        report["check"] = {"config": f"rloo-{args.check_group}", "batches": args.check_batches,
                           "tasks_per_batch": args.check_tasks,
                           "env_steps": sum(b.compute.env_steps for b in batches), **behaviour(batches)}
        report["seconds"]["check"] = (time.perf_counter() - wall2, time.process_time() - cpu2)
        print(json.dumps(report["check"]), flush=True)
    report["seconds"]["total"] = (time.perf_counter() - wall0, time.process_time() - cpu0)
    report["load_average"] = list(os.getloadavg())
    write(report, args.json)
    return report


if __name__ == "__main__":
    main()

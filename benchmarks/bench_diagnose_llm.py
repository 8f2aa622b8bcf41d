"""What one step of ``bpo-diagnose`` costs with SmolLM2-135M-Instruct on this CPU (JSON + summary).

The LLM diagnosis (docs/regime.md, "LLM policies") spends its time on three things: the warm
start's behaviour cloning (a forward and backward pass per expert decision), and per env step
of a batch a decision entropy and a reply. This times each on real decision points, the first
``--contexts`` expert decisions of WebShop (the ``cpu-llm`` setup) and ALFWorld (the ``cpu``
setup), for reasoning off (exact entropy over the admissible answers, a short reply) and on
(probe entropy from ``--probe-samples`` completions, then the reply), so a diagnosis can be
sized before it is run::

    nice -n 10 python benchmarks/bench_diagnose_llm.py --out docs/results/diagnose/smollm2-timing.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from bpo_algos.policy import HFPolicy, PromptConfig
from bpo_algos.policy.sft import demo_steps
from bpo_algos.policy.tiny import smollm2_path
from bpo_experiments.build import _expert_demos
from bpo_experiments.diagnose import find_setup
from bpo_experiments.tasks import task_split

ENVS = {"webshop": ("BPO-WebShop-v0", "cpu-llm", {}), "alfworld": ("BPO-ALFWorld-v0", None, {"max_episode_steps": 8})}


def time_policy(policy: HFPolicy, demos: list[Any], clone: bool) -> dict[str, Any]:
    """Seconds of the decision entropy and of one reply at each demo's context, and (``clone``)
    of behaviour cloning's forward and backward pass per demo: wall-clock, and the process's CPU
    seconds (``*_cpu_s``: what the step costs on one idle core, whatever the load)."""
    row: dict[str, Any] = {"prompt_tokens": [len(policy.prompt_ids(d.context)) for d in demos],
                           "entropy_s": [], "entropy_cpu_s": [], "reply_s": [], "reply_cpu_s": [], "reply_tokens": [],
                           "max_new_tokens": policy.max_new_tokens}
    for d in demos:
        start, cpu = time.perf_counter(), time.process_time()
        policy.decision_entropy([d.context])
        row["entropy_s"].append(time.perf_counter() - start)
        row["entropy_cpu_s"].append(time.process_time() - cpu)
        before, start, cpu = policy.meter.gen_tokens, time.perf_counter(), time.process_time()
        policy.sample([d.context], 1, [np.random.default_rng(0)])
        row["reply_s"].append(time.perf_counter() - start)
        row["reply_cpu_s"].append(time.process_time() - cpu)
        row["reply_tokens"].append(policy.meter.gen_tokens - before)
    row["step_s_mean"] = float(np.mean(row["entropy_s"]) + np.mean(row["reply_s"]))
    row["step_cpu_s_mean"] = float(np.mean(row["entropy_cpu_s"]) + np.mean(row["reply_cpu_s"]))
    if clone:
        steps = demo_steps(policy, demos)
        optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-6)
        start, cpu = time.perf_counter(), time.process_time()
        loss = -policy.token_logprobs(steps).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        row["bc_s_per_demo"] = (time.perf_counter() - start) / len(steps)
        row["bc_cpu_s_per_demo"] = (time.process_time() - cpu) / len(steps)
    return row


def bench_env(name: str, contexts: int, probe_samples: int, rows: dict[str, Any], save: Any) -> None:
    """Fill ``rows`` with ``name``'s timings, calling ``save()`` after each part."""
    env_id, preset_name, kwargs = ENVS[name]
    _, _, setup = find_setup(env_id, preset_name)
    setup = replace(setup, kwargs={**setup.kwargs, **kwargs}, train_tasks=1)
    tasks, _ = task_split(replace(setup, eval_split="train"))
    demos = _expert_demos(setup, tasks, 0)[:contexts]
    rows["contexts"] = len(demos)
    for reasoning, mode, max_new in ((False, "exact", 24), (True, "probe", 48)):
        policy = HFPolicy(str(smollm2_path()), seed=0, max_new_tokens=max_new, prompt=PromptConfig(reasoning=reasoning),
                          decision_entropy=mode, probe_samples=probe_samples)
        # behaviour cloning is the same pass either way: timed once, with reasoning off
        row = time_policy(policy, demos, clone=not reasoning)
        rows["reasoning" if reasoning else "no_reasoning"] = row
        print(name, "reasoning" if reasoning else "no reasoning", json.dumps(row), flush=True)
        save()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    parser.add_argument("--contexts", type=int, default=3, help="expert decisions timed per env")
    parser.add_argument("--probe-samples", type=int, default=2)
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch's CPU threads (2 threads on a busy 2-core machine spin-wait for each other: 4.6x the wall-clock here)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)
    result: dict[str, Any] = {
        "command": f"python benchmarks/bench_diagnose_llm.py --envs {' '.join(args.envs)} --contexts {args.contexts} "
                   f"--probe-samples {args.probe_samples} --torch-threads {args.torch_threads} --out {args.out}",
        "torch_threads": torch.get_num_threads(), "uptime_start": uptime(), "envs": {}}

    def save() -> None:  # after each part: a run stopped early keeps what it measured
        result["uptime_end"], result["load_average"] = uptime(), list(os.getloadavg())
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    for name in args.envs:
        bench_env(name, args.contexts, args.probe_samples, result["envs"].setdefault(name, {}), save)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    main()

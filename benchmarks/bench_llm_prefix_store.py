"""CPU seconds per decision of SmolLM2-135M-Instruct on WebShop with and without the prompt KV
store across decisions (docs/training.md, "Prompt KV cache"), before and after in one run.

A decision is what a BPO step asks of the policy at one path: the exact decision entropy over
the admissible answers, then one reply (``max_new_tokens`` 24, reasoning off, as
benchmarks/bench_diagnose_llm.py). The contexts are the first ``--contexts`` expert decisions of one
WebShop episode (the ``cpu-llm`` setup), taken in order, so each prompt extends the episode's
earlier ones as on a path of a tree. Each variant runs in a child process of its own, the
variants alternated ``--repeats`` times, with one torch thread; the time is the child's CPU
seconds (``time.process_time``: what a decision costs on one idle core, whatever the load).
After the path, a fork: ``--siblings`` contexts, the last decision's first admissible actions
taken, each sibling's first decision (entropy and reply) in one call, as the engine asks for the
live paths of one step:

* ``before``: the code at ``--before`` (PYTHONPATH), which prefills every decision's prompt whole;
* ``after``: this tree, the store across decisions (``prefix_store_tokens=16384``, opted in);
* ``after_off``: this tree with ``prefix_store_tokens=0`` (the same per-decision behaviour as
  ``before``: checks that the new code costs nothing when off);
* ``turns``: this tree, the store on, and the prompt laid out as turns
  (``PromptConfig(layout="turns")``: each step's prompt extends the one before, so a path's
  next decision prefills only its new turn);
* ``turns_off``: the turns layout with the store off (what its longer prompts cost without
  reuse; ``turns``' entropies and replies are compared with it, since the layout changes the
  prompts and so the numbers).

    nice -n 10 python benchmarks/bench_llm_prefix_store.py --before /work/main \\
        --out docs/results/llm-prefix-store/smollm2-webshop.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent


def child(contexts: int, siblings: int, store_tokens: int | None, layout: str | None = None) -> dict[str, Any]:
    """Time ``contexts`` consecutive decisions in this process (the code on ``sys.path``)."""
    import numpy as np
    import torch

    from bpo_algos.policy import HFPolicy, PromptConfig
    from bpo_algos.policy.tiny import smollm2_path
    from bpo_experiments.build import _expert_demos
    from bpo_experiments.diagnose import find_setup
    from bpo_experiments.tasks import task_split

    torch.set_num_threads(1)
    _, _, setup = find_setup("BPO-WebShop-v0", "cpu-llm")
    setup = replace(setup, train_tasks=1)
    tasks, _ = task_split(replace(setup, eval_split="train"))
    demos = _expert_demos(setup, tasks, 0)[:contexts]
    kwargs = {} if store_tokens is None else {"prefix_store_tokens": store_tokens}
    # no layout argument unless asked: the code before (--before) has no such field
    prompt = PromptConfig(reasoning=False) if layout is None else PromptConfig(reasoning=False, layout=layout)
    policy = HFPolicy(str(smollm2_path()), seed=0, max_new_tokens=24, prompt=prompt, **kwargs)
    row: dict[str, Any] = {"prompt_tokens": [], "entropy_cpu_s": [], "reply_cpu_s": [], "step_cpu_s": [],
                           "score_tokens": [], "prefill_tokens": [], "gen_tokens": [], "entropy": [], "reply": []}
    for t, d in enumerate(demos):
        before = policy.meter.copy()
        cpu = time.process_time()
        (h,) = policy.decision_entropy([d.context])
        mid = time.process_time()
        ((action,),) = policy.sample([d.context], 1, [np.random.default_rng([0, t])])
        end = time.process_time()
        row["prompt_tokens"].append(len(policy.prompt_ids(d.context)))
        row["entropy_cpu_s"].append(mid - cpu)
        row["reply_cpu_s"].append(end - mid)
        row["step_cpu_s"].append(end - cpu)
        for field in ("score_tokens", "prefill_tokens", "gen_tokens"):
            row[field].append(getattr(policy.meter, field) - getattr(before, field))
        row["entropy"].append(h)
        row["reply"].append([action.text, list(action.logprobs)])
    row["step_cpu_s_mean"] = sum(row["step_cpu_s"]) / len(row["step_cpu_s"])
    if siblings:
        contexts = fork(setup, tasks, demos, siblings)
        before = policy.meter.copy()
        cpu = time.process_time()
        hs = policy.decision_entropy(contexts)
        samples = policy.sample(contexts, 1, [np.random.default_rng([1, i]) for i in range(len(contexts))])
        row["fork"] = {
            "siblings": len(contexts), "prompt_tokens": [len(policy.prompt_ids(c)) for c in contexts],
            "cpu_s_per_decision": (time.process_time() - cpu) / len(contexts),
            **{f: getattr(policy.meter, f) - getattr(before, f) for f in ("score_tokens", "prefill_tokens", "gen_tokens")},
            "entropy": hs, "reply": [[a.text, list(a.logprobs)] for (a,) in samples],
        }
    row["policy_module"] = sys.modules[HFPolicy.__module__].__file__
    return row


def fork(setup: Any, tasks: Any, demos: Any, siblings: int) -> list[Any]:
    """The contexts after the last timed decision's first ``siblings`` admissible actions: a
    fork's siblings, each at its first decision of its own (the expert's path replayed, then a
    snapshot restored per sibling)."""
    import bpo_envs
    from bpo_algos.policy.base import admissible_of
    from bpo_envs.seeding import key_seed
    from bpo_experiments.tasks import env_factory

    env = env_factory(setup)()
    try:
        env.reset(seed=key_seed(0, 0), options={"task_id": tasks[0]})
        for d in demos[:-1]:
            env.step(d.action)
        parent = demos[-1].context
        snap = bpo_envs.snapshot(env)
        out = []
        for action in list(parent.admissible_actions or ())[:siblings]:
            bpo_envs.restore(env, snap)
            obs, _, _, _, info = env.step(action)
            out.append(parent.child(action, obs, admissible_of(info)))
        return out
    finally:
        env.close()


VARIANTS: dict[str, tuple[int | None, str | None]] = {
    "before": (None, None), "after": (16384, None), "after_off": (0, None), "turns": (16384, "turns"), "turns_off": (0, "turns")}
"""Each variant's ``prefix_store_tokens`` (None: the code's default) and prompt layout (None: the default)."""
REFERENCE: dict[str, str | None] = {"turns": "turns_off", "turns_off": None}
"""The variant whose numbers a variant must equal (default ``before``; None: none, its prompts
are its own)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="/work/main", help="the tree whose code is 'before'")
    parser.add_argument("--contexts", type=int, default=4)
    parser.add_argument("--siblings", type=int, default=3, help="a fork after the last decision: its siblings' first decisions, in one call")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", required=True)
    parser.add_argument("--child", choices=list(VARIANTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.contexts, args.siblings, *VARIANTS[args.child])))
        return
    result: dict[str, Any] = {
        "command": f"python benchmarks/bench_llm_prefix_store.py --before {args.before} --contexts {args.contexts} "
                   f"--siblings {args.siblings} --repeats {args.repeats} --variants {' '.join(args.variants)} --out {args.out}",
        "torch_threads": 1, "uptime_start": uptime(), "runs": []}
    for repeat in range(args.repeats):
        for variant in args.variants:
            root = args.before if variant == "before" else str(HERE)
            env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"}
            out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", variant, "--contexts", str(args.contexts),
                                  "--siblings", str(args.siblings), "--out", "-"], env=env, cwd=root, capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            result["runs"].append({"variant": variant, "repeat": repeat, **row})
            print(variant, repeat, f"{row['step_cpu_s_mean']:.2f} CPU s/decision", flush=True)
            summarise(result)
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)


def summarise(result: dict[str, Any]) -> None:
    """Means per variant over repeats, and the largest difference of entropies/log-probs from
    its reference (:data:`REFERENCE`, default ``before``: the same samples within float
    tolerance; the keys keep the name ``*_vs_before``)."""
    runs = result["runs"]
    summary: dict[str, Any] = {}
    for variant in dict.fromkeys(r["variant"] for r in runs):
        rows = [r for r in runs if r["variant"] == variant]
        n = len(rows[0]["step_cpu_s"])
        summary[variant] = {
            "step_cpu_s_mean": sum(r["step_cpu_s_mean"] for r in rows) / len(rows),
            "entropy_cpu_s_mean": sum(sum(r["entropy_cpu_s"]) for r in rows) / (len(rows) * n),
            "reply_cpu_s_mean": sum(sum(r["reply_cpu_s"]) for r in rows) / (len(rows) * n),
            "prompt_tokens_run_per_decision": [s + p for s, p in zip(rows[0]["score_tokens"], rows[0]["prefill_tokens"], strict=True)],
        }
        if "fork" in rows[0]:
            summary[variant]["fork_cpu_s_per_decision_mean"] = sum(r["fork"]["cpu_s_per_decision"] for r in rows) / len(rows)
            summary[variant]["fork_prompt_tokens_run"] = rows[0]["fork"]["score_tokens"] + rows[0]["fork"]["prefill_tokens"]
        reference = REFERENCE.get(variant, "before")
        base = None if reference == variant else next((r for r in runs if r["variant"] == reference), None)
        if base is not None:
            summary[variant]["reference"] = reference
            r = rows[0]
            summary[variant]["max_entropy_diff_vs_before"] = max(abs(a - b) for a, b in zip(r["entropy"], base["entropy"], strict=True))
            summary[variant]["same_replies_as_before"] = [a[0] for a in r["reply"]] == [b[0] for b in base["reply"]]
            summary[variant]["max_logprob_diff_vs_before"] = max(
                (abs(x - y) for a, b in zip(r["reply"], base["reply"], strict=True) for x, y in zip(a[1], b[1], strict=False)), default=0.0)
            if "fork" in r:
                summary[variant]["fork_max_entropy_diff_vs_before"] = max(
                    abs(a - b) for a, b in zip(r["fork"]["entropy"], base["fork"]["entropy"], strict=True))
                summary[variant]["fork_same_replies_as_before"] = [a[0] for a in r["fork"]["reply"]] == [b[0] for b in base["fork"]["reply"]]
    result["summary"] = summary
    result["uptime_end"], result["load_average"] = uptime(), list(os.getloadavg())


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    main()

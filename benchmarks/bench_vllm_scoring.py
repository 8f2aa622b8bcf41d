"""What a decision entropy costs in ``VLLMPolicy``, against one generation at the same context.

On WebShop contexts with admissible actions (a results page: a dozen ``click[...]`` answers),
per backbone step (one context), from a cold prefix cache each time:

* ``generate``: one reply sampled with vLLM (what a backbone step costs without scoring);
* ``score_vllm``: the exact entropy from vLLM's prompt log-probs on the cached prompt;
* ``score_hf``: the exact entropy from the separate HF forward (prompt + every candidate);
* ``probe``: ``--probe`` completions from vLLM, parsed (``decision_entropy="probe"``).

Each is metered (``score_tokens`` / ``gen_tokens + prefill_tokens``) and timed; the JSON gives
medians over ``--repeats``, tokens per second and each cost relative to ``generate``. Needs vLLM
(``BPO_INSTALL_VLLM=1 bash bpo_envs/system/vllm.sh`` on a CPU machine).

    .venv-vllm/bin/python benchmarks/bench_vllm_scoring.py --out docs/results/vllm-scoring.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

import bpo_envs  # noqa: F401
from bpo_algos.policy import Context, VLLMPolicy
from bpo_algos.policy.tiny import smollm2_path, tiny_model_path


def webshop_contexts(n: int) -> list[Context]:
    """``n`` WebShop results pages (after the instruction's search), with their admissible clicks."""
    env = gym.make("BPO-WebShop-v0", max_episode_steps=15)
    out = []
    for seed in range(n):
        obs, info = env.reset(seed=seed)
        root = Context(info["task_id"], obs, tuple(info["admissible_actions"]), initial_observation=obs)
        search = next(a for a in info["admissible_actions"] if a.startswith("search"))
        obs2, _, _, _, info2 = env.step(search)
        out.append(root.child(search, obs2, info2["admissible_actions"]))
    env.close()
    return out


def measure(policy: VLLMPolicy, context: Context, what: str) -> dict[str, float]:
    policy.llm.reset_prefix_cache()
    policy.clear_cache()
    before = policy.meter.to_dict()
    start = time.perf_counter()
    if what == "generate":
        policy.sample([context], 1, None)
    else:
        policy.decision_entropy([context])
    seconds = time.perf_counter() - start
    after = policy.meter.to_dict()
    tokens = sum(after[k] - before[k] for k in ("gen_tokens", "prefill_tokens", "score_tokens"))
    return {"seconds": seconds, "tokens": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny (the offline Qwen2), smollm2, or a folder")
    parser.add_argument("--contexts", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--probe", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    model = {"tiny": lambda: tiny_model_path(), "smollm2": lambda: smollm2_path()}.get(args.model, lambda: Path(args.model))()
    torch.manual_seed(0)
    policy = VLLMPolicy(str(model), max_new_tokens=args.max_new_tokens, seed=0, max_model_len=4096, dtype=torch.float32)
    contexts = webshop_contexts(args.contexts)
    modes = {"generate": None, "score_vllm": ("exact", "vllm"), "score_hf": ("exact", "hf"), "probe": ("probe", "vllm")}
    raw: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for _ in range(args.repeats):
        for context in contexts:
            for mode, setting in modes.items():
                if setting:
                    policy.decision_entropy_mode, policy.scoring = setting
                    policy.probe_samples = args.probe
                raw[mode].append(measure(policy, context, "generate" if setting is None else "score"))
    policy.close()
    summary: dict[str, Any] = {}
    for mode, rows in raw.items():
        seconds = statistics.median(r["seconds"] for r in rows)
        tokens = statistics.median(r["tokens"] for r in rows)
        summary[mode] = {"median_seconds": seconds, "median_tokens": tokens, "tokens_per_s": statistics.median(r["tokens"] / r["seconds"] for r in rows)}
    for mode in modes:
        summary[mode]["seconds_vs_generate"] = summary[mode]["median_seconds"] / summary["generate"]["median_seconds"]
        summary[mode]["tokens_vs_generate"] = summary[mode]["median_tokens"] / summary["generate"]["median_tokens"]
    out = {
        "model": args.model,
        "device": "cpu" if not torch.cuda.is_available() else torch.cuda.get_device_name(),
        "contexts": args.contexts,
        "repeats": args.repeats,
        "admissible_per_context": statistics.median(len(c.admissible_actions or ()) for c in contexts),
        "prompt_tokens": statistics.median(len(policy.prompt_ids(c)) for c in contexts),
        "probe_samples": args.probe,
        "max_new_tokens": args.max_new_tokens,
        "per_backbone_step": summary,
    }
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

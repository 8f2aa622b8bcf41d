"""One BPO and one RLOO update on WebShop with an HF model: the GPU path end to end.

bf16 compute with fp32 master weights, gradient checkpointing, micro-batched backward, on
``--device`` (``cuda`` by default). Prints one JSON object: per algorithm the generated and
trained tokens per second, the collection and update seconds, peak GPU memory, and the weight
change of the update (L2 norm, and the share of weights with a gradient that moved). Nothing is
downloaded: the model is ``--model`` (a folder) or the tiny offline Qwen2 built here.
Run through ``scripts/device_check.sh``.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import gymnasium as gym
import torch

import bpo_envs  # noqa: F401
from baselines import RLOO
from bpo_algos import BPO, Trainer, TrainerConfig
from bpo_algos.advantages import as_batch
from bpo_algos.policy import HFPolicy
from bpo_algos.policy.tiny import tiny_model_path


def force_advantages(algorithm: Any) -> None:
    """Advantages +-1 by step parity after the real estimator ran: an untrained model's rewards
    are all equal (zero advantages), and the check must see an update that moves weights."""
    estimate = algorithm.compute_advantages

    def signed(trees: Any) -> None:
        estimate(trees)
        for tree in as_batch(trees):
            for i, edge in enumerate(tree.edges()):
                edge.advantage = 1.0 if i % 2 else -1.0

    algorithm.compute_advantages = signed


def one_update(name: str, algorithm: Any, args: argparse.Namespace, model: str) -> dict[str, Any]:
    device = args.device
    if not args.real_advantages:
        force_advantages(algorithm)
    policy = HFPolicy(model, max_new_tokens=args.max_new_tokens, device=device, dtype=torch.float32, seed=0, decode_batch_size=64)

    def make() -> gym.Env:
        return gym.make("BPO-WebShop-v0", max_episode_steps=args.max_steps)

    tasks = list(make().unwrapped.task_ids())[:8]
    config = TrainerConfig(
        updates=1, tasks_per_update=args.trees, learning_rate=1e-5, optimizer="adamw", seed=0, device=device,
        precision="bf16", gradient_checkpointing=True, micro_batch_tokens=args.micro_batch_tokens,
    )
    trainer = Trainer(algorithm, policy, [make] * 2, tasks, config)
    seen: dict[str, Any] = {}
    collect = algorithm.collect

    def recording_collect(*a: Any, **k: Any) -> Any:
        seen["batch"] = collect(*a, **k)
        return seen["batch"]

    algorithm.collect = recording_collect  # type: ignore[method-assign]
    before = [p.detach().clone() for p in trainer._trainable()]
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
    start = time.perf_counter()
    row = trainer.step()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    total = time.perf_counter() - start
    batch = seen["batch"]
    collect_s = float(batch.compute.seconds)
    update_s = max(total - collect_s, 1e-9)
    trained = sum(len(s.action.prompt_token_ids) + len(s.action.token_ids) for s in batch.steps)
    delta_sq, moved, live = 0.0, 0, 0
    for p, b in zip(trainer._trainable(), before, strict=True):
        d = (p.detach() - b).float()
        delta_sq += float((d * d).sum())
        if p.grad is not None:
            g = p.grad.abs() > 0
            live += int(g.sum())
            moved += int(((d != 0) & g).sum())
    return {
        "algorithm": name,
        "trees": row["n_trees"],
        "steps": row["n_steps"],
        "gen_tokens": int(batch.compute.gen_tokens),
        "generated_tokens_per_s": batch.compute.gen_tokens / max(collect_s, 1e-9),
        "trained_tokens": trained,
        "trained_tokens_per_s": trained / update_s,
        "collect_seconds": collect_s,
        "update_seconds": update_s,
        "peak_gpu_memory_gb": torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None,
        "weight_change_l2": delta_sq**0.5,
        "weights_moved_share": moved / live if live else None,
        "grad_norm": row["grad_norm"],
        "loss": row["loss"],
        "gradient_checkpointing": policy.gradient_checkpointing,
        "master_dtype": str(next(iter(trainer._trainable())).dtype),
        "advantages": "estimated" if args.real_advantages else "forced +-1 (an untrained model's rewards are equal)",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default=None, help="a model folder (default: the tiny offline Qwen2)")
    parser.add_argument("--trees", type=int, default=None, help="trees per update (default 8 on CUDA, 2 on CPU)")
    parser.add_argument("--max-steps", type=int, default=None, help="WebShop step limit (default 6 on CUDA, 2 on CPU)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 64 (WebShop's EnvSetup) on CUDA, 16 on CPU")
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--real-advantages", action="store_true", help="keep the estimator's advantages (all zero for an untrained model)")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda but CUDA is not available; pass --device cpu")
    cuda = args.device.startswith("cuda")
    args.trees = args.trees or (8 if cuda else 2)
    args.max_steps = args.max_steps or (6 if cuda else 2)
    args.max_new_tokens = args.max_new_tokens or (64 if cuda else 16)
    model = args.model or str(tiny_model_path())
    start = time.perf_counter()
    results = [
        one_update("bpo", BPO(backbones=2, branch_factor=2, entropy_threshold=0.0, max_branch_points=1), args, model),
        one_update("rloo", RLOO(group_size=4), args, model),
    ]
    out = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "model": model,
        "torch": torch.__version__,
        "seconds": time.perf_counter() - start,
        "updates": results,
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

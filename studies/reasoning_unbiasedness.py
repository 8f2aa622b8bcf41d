"""Branching for a policy that reasons, on the exact-gradient TreeMDP: is each rule unbiased?

A synthetic text policy (:func:`bpo_algos.policy.reasoning.tree_reasoning_policy`) writes
``<think>...</think><action>...</action>``; BPO branches where its decision entropy is high,
with the entropy computed by each rule: ``exact`` (immediate answers at ``h``, the proxy),
``probe`` (M completions at ``h``, parsed, discarded) and ``sampled-reasoning`` (the backbone's
own reasoning decides: not offered, it breaks rule 1). For each rule: the z-scores of the mean
of ``--batches`` gradient estimates minus the exact gradient, along the exact gradient, 3 seeded
random directions and the reasoning direction (``rho[unsure] - rho[sure]``). Writes JSON.

    python studies/reasoning_unbiasedness.py --batches 3000 --out docs/results/reasoning-unbiasedness.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import bpo_envs  # noqa: F401
from bpo_algos import BPO, EnvPool
from bpo_algos.diagnostics import flat_gradient, gradient_samples, projection_z_scores
from bpo_algos.policy.reasoning import tree_reasoning_policy
from bpo_envs.seeding import key_seed

TREE = {"depth": 2, "n_actions": 3, "seed": 7}
THRESHOLDS = {"exact": 0.8, "probe": 0.6, "sampled-reasoning": 0.8}
"""Entropy thresholds (nats) that split each rule's values: immediate answers' random entropies,
the probe's plug-in values over 4 replies (0, 0.56, 0.69, 1.04), sure (0.09) vs unsure (1.10)."""
DIRECTIONS = ("exact gradient", "random 1", "random 2", "random 3", "reasoning")


def z_scores(rule: str, batches: int, seed: int = 0) -> dict[str, Any]:
    """One rule's z-scores (module docstring) and its branching rate."""
    make = lambda: gym.make("BPO-TreeMDP-v0", **TREE)  # noqa: E731
    env = make()
    policy, direction = tree_reasoning_policy(env, rule, seed=seed)
    policy.zero_grad()
    env.unwrapped.expected_return(policy.log_probs).backward()
    truth = flat_gradient(list(policy.parameters())).clone()
    policy.zero_grad()
    algorithm = BPO(backbones=2, branch_factor=4, entropy_threshold=THRESHOLDS[rule], aggregation="step-sum", seed=key_seed(seed, 2))
    start = time.perf_counter()
    # stepped in this thread: a TreeMDP step is microseconds, the default per-step deadline's
    # handoff to a worker thread is not (the same samples)
    pool = EnvPool([make, make], step_timeout_s=None)
    try:
        samples = gradient_samples(algorithm, policy, pool, [0], batches)
    finally:
        pool.close()
    grads = samples.grads.double()
    zs = projection_z_scores(grads, truth)
    d = direction.double() / direction.norm()
    x = (grads @ d).numpy()
    zs.append(float((x.mean() - float(truth.double() @ d)) / (x.std(ddof=1) / np.sqrt(len(x)))))
    branch_points = [algorithm.collect(policy, [make], [0]).shape_stats()["branch_points_per_tree"] for _ in range(200)]
    return {
        "rule": rule,
        "entropy_threshold": THRESHOLDS[rule],
        "batches": batches,
        "z": dict(zip(DIRECTIONS, zs, strict=True)),
        "max_abs_z": max(abs(z) for z in zs),
        "branch_points_per_tree": float(np.mean(branch_points)),
        "seconds": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny tensors: threads only add synchronisation
    rows = [z_scores(rule, args.batches) for rule in THRESHOLDS]
    out = {"tree": TREE, "algorithm": "BPO(backbones=2, branch_factor=4, step-sum)", "z_threshold": 4.0, "rules": rows}
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

"""What the rollout engine and the evaluation produce on fixed seeds, as plain data.

``tests/test_engine_batching.py`` compares today's engine with ``tests/data/engine_reference.json``,
which this module wrote when run on the engine before one policy pass per engine step, inline
stepping and batched evaluation (commit 98bf6ee: ``PYTHONPATH=<that checkout> python
tests/engine_reference.py OUT.json``): the same trees (actions, rewards, structure), the same log-probs and entropies up
to float rounding, and the same meters.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import gymnasium as gym

import bpo_envs  # noqa: F401 - registers the ids
from baselines import RLOO
from bpo_algos import BPO, Budget, EnvPool
from bpo_algos.policy.scorer import TextScorerPolicy
from bpo_algos.tree import RolloutTree
from bpo_experiments.evaluation import evaluate_episodes

METER_FIELDS = ("env_steps", "snapshots", "restores", "leaves", "gen_tokens", "prefill_tokens", "score_tokens",
                "policy_calls", "train_tokens")


def webshop() -> gym.Env:
    return gym.make("BPO-WebShop-v0", max_episode_steps=8)


def tasks(n: int) -> list[Any]:
    env = webshop()
    try:
        return list(env.unwrapped.task_ids())[:n]
    finally:
        env.close()


def tree_record(tree: RolloutTree) -> dict[str, Any]:
    """Depth-first: every edge's action, log-prob, reward and depth, every decision entropy."""
    edges, entropies = [], []
    stack = [tree.root]
    while stack:
        node = stack.pop()
        if node.entropy is not None:
            entropies.append(node.entropy)
        for edge in reversed(node.children):
            edges.append([edge.child.depth, edge.action.command, edge.action.logprob, edge.reward])
            stack.append(edge.child)
    return {"index": tree.index, "task": tree.task_id, "seed": tree.seed, "edges": edges, "entropies": entropies,
            "compute": {f: float(getattr(tree.compute, f)) for f in METER_FIELDS}}


def collections(only: str | None = None) -> dict[str, Any]:
    """A BPO batch (forks at an entropy threshold: backbones and siblings of several trees
    in flight), the same under an env-step budget, and an RLOO batch (``only``: just that one)."""
    out: dict[str, Any] = {}
    runs = {
        "bpo": (BPO(backbones=2, branch_factor=3, entropy_threshold=0.5, max_branch_points=2, seed=5), None),
        "bpo_budget": (BPO(backbones=2, branch_factor=3, entropy_threshold=0.5, seed=6), Budget("env_steps", 90)),
        "rloo": (RLOO(group_size=3, seed=7), None),
    }
    for name, (algorithm, budget) in runs.items():
        if only is not None and name != only:
            continue
        pool = EnvPool([webshop] * 4)
        try:
            batch = algorithm.collect(TextScorerPolicy(seed=11), pool, tasks(5), budget)
        finally:
            pool.close()
        out[name] = {"trees": [tree_record(t) for t in batch.trees],
                     "compute": {f: float(getattr(batch.compute, f)) for f in METER_FIELDS}}
    return out


def tree_mdp() -> gym.Env:
    return gym.make("BPO-TreeMDP-v0", depth=4, n_actions=3, n_tasks=8, seed=1)


def evaluation() -> dict[str, list[float]]:
    """Evaluation wins, seed 3: WebShop 6 tasks x 3 episodes over 4 envs; TreeMDP (where
    about half the episodes win) 8 tasks x 4 episodes over 3 envs."""
    out = {}
    for name, make, task_list, episodes, envs in (("webshop", webshop, tasks(6), 3, 4),
                                                   ("tree_mdp", tree_mdp, list(range(8)), 4, 3)):
        pool = EnvPool([make] * envs)
        try:
            out[name] = evaluate_episodes(TextScorerPolicy(seed=2), pool, task_list, episodes, seed=3)
        finally:
            pool.close()
    return out


def reference() -> dict[str, Any]:
    return {"collections": collections(), "evaluation": evaluation()}


if __name__ == "__main__":
    with open(sys.argv[1], "w") as fh:
        json.dump(reference(), fh, indent=1)

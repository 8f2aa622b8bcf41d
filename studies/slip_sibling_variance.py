"""The variance among BPO's siblings on a TreeMDP with slip: the rollout engine's, a hand fork's
through the env's own ``snapshot``/``restore``, and the exact one (docs/mechanism.md, "How η is
estimated": siblings forked from one snapshot share the slip nonce).

The cell: ``BPO-TreeMDP-v0`` depth 5, 3 actions, seed 0, decisive levels (0, 2), slip 0.3 (and
0, the control), the uniform tabular policy; BPO with 2 backbones, 4 siblings and entropy
threshold 0 branches every backbone at depth 1. A *group* is a depth-1 branch node's 4 flat
siblings, its reading their sample variance (``ddof=1``: unbiased for ``Var(R | s_1)``).

Per reading (``--groups`` groups each) one JSON line: the engine's mean group variance, the hand
fork's, each with its standard error (the engine's clustered by tree: a tree's two backbones share
the reset nonce), the exact sibling variance ``variance_by_depth(siblings=True)[1]``, the marginal
``variance_by_depth()[1]``, and two rule-2 checks on the engine's siblings (docs/unbiasedness.md):
how often two siblings of a group chose the same first action, and the same second action where
they chose the same first one (``sum_a pi_a^2 = 1/3`` for independent uniform draws over 3; 1 if
they shared a sampling stream). A last line pools the readings::

    PYTHONPATH=$PWD python studies/slip_sibling_variance.py --readings 10 --groups 600 > slip.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

import bpo_envs
from bpo_algos import BPO, TabularPolicy
from bpo_algos.rollout import EnvPool
from bpo_algos.tree import Edge, RolloutTree
from bpo_envs import TreeMDPEnv
from bpo_envs.seeding import key_seed

CELL: dict[str, Any] = {"depth": 5, "n_actions": 3, "seed": 0, "decisive_levels": (0, 2)}
SIBLINGS = 4


def _line(edge: Edge) -> tuple[float, list[Edge]]:
    """The return from ``edge`` on down its single path, and the path's edges."""
    total, edges = edge.reward, [edge]
    while edge.child.children:
        if len(edge.child.children) != 1:
            raise ValueError("a sibling branched again: the cell expects flat siblings")
        edge = edge.child.children[0]
        total += edge.reward
        edges.append(edge)
    return total, edges


def depth1_groups(tree: RolloutTree) -> list[list[tuple[float, list[Edge]]]]:
    """Every depth-1 branch node's siblings: ``(return from the node, path edges)`` each."""
    return [[_line(e) for e in node.children] for node in tree.nodes() if node.depth == 1 and len(node.children) > 1]


def _pair_agreement(groups: Sequence[Sequence[tuple[float, list[Edge]]]]) -> tuple[float, float]:
    """Share of sibling pairs with the same first action; of those, share with the same second."""
    first = second = same_first = 0
    for group in groups:
        for (_, a), (_, b) in itertools.combinations(group, 2):
            first += 1
            if a[0].action.command == b[0].action.command:
                same_first += 1
                second += a[1].action.command == b[1].action.command
    return same_first / max(first, 1), second / max(same_first, 1)


def engine_reading(kwargs: dict[str, Any], policy: TabularPolicy, n_groups: int, seed: int, reading: int,
                   trees_per_collect: int = 8) -> dict[str, float]:
    """``n_groups`` depth-1 sibling groups from the rollout engine (BPO 2 x 4, threshold 0), in
    collections of ``trees_per_collect`` trees on a pool of two envs."""
    pool = EnvPool([lambda: TreeMDPEnv(**kwargs)] * 2)
    bpo = BPO(backbones=2, branch_factor=SIBLINGS, entropy_threshold=0.0, seed=key_seed(seed, 1, reading))
    per_tree: list[list[float]] = []
    groups: list[list[tuple[float, list[Edge]]]] = []
    try:
        for batch_index in itertools.count():
            batch = bpo.collect(policy, pool, [0] * trees_per_collect, seed=key_seed(seed, 2, reading, batch_index))
            for tree in batch.trees:
                tree_groups = depth1_groups(tree)
                groups.extend(tree_groups)
                per_tree.append([float(np.var([r for r, _ in g], ddof=1)) for g in tree_groups])
            if len(groups) >= n_groups:
                break
    finally:
        pool.close()
    values = np.array([v for t in per_tree for v in t])
    # clustered by tree: the ratio estimator's standard error over trees
    sums = np.array([sum(t) for t in per_tree])
    counts = np.array([len(t) for t in per_tree], float)
    mean = sums.sum() / counts.sum()
    n = len(per_tree)
    clustered = float(np.sqrt(n / (n - 1) * np.sum((sums - mean * counts) ** 2)) / counts.sum())
    same_first, same_second = _pair_agreement(groups)
    return {"engine": float(values.mean()), "engine_se": clustered, "engine_se_naive": float(values.std(ddof=1) / np.sqrt(len(values))),
            "groups": len(values), "same_first_action": same_first, "same_second_action_given_first": same_second}


def hand_reading(kwargs: dict[str, Any], policy: TabularPolicy, n_groups: int, seed: int, reading: int) -> dict[str, float]:
    """``n_groups`` groups forked by hand: reset, one on-policy step, snapshot, ``SIBLINGS``
    restores each rolled to the end with its own draws."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 3, reading]))
    env = TreeMDPEnv(**kwargs)

    def act(obs: str, info: dict[str, Any]) -> str:
        actions = info["admissible_actions"]
        with torch.no_grad():
            p = policy.log_probs(obs, actions).double().exp().numpy()
        return actions[int(rng.choice(len(actions), p=p / p.sum()))]

    values = []
    for _ in range(n_groups):
        obs, info = env.reset(seed=int(rng.integers(2**31 - 1)), options={"task_id": 0})
        obs, _, _, _, info = env.step(act(obs, info))
        snap = bpo_envs.snapshot(env)
        returns = []
        for _ in range(SIBLINGS):
            bpo_envs.restore(env, snap)
            o, i, total, done = obs, info, 0.0, False
            while not done:
                o, r, terminated, truncated, i = env.step(act(o, i))
                total, done = total + r, terminated or truncated
            returns.append(total)
        snap.release()
        values.append(np.var(returns, ddof=1))
    x = np.array(values)
    return {"hand": float(x.mean()), "hand_se": float(x.std(ddof=1) / np.sqrt(len(x)))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readings", type=int, default=4, help="readings per slip value")
    parser.add_argument("--groups", type=int, default=600, help="sibling groups per reading")
    parser.add_argument("--slips", type=float, nargs="+", default=[0.3, 0.0])
    parser.add_argument("--no-hand", action="store_true", help="skip the hand fork")
    parser.add_argument("--trees-per-collect", type=int, default=8, help="trees per engine collection")
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args(argv)
    for slip in args.slips:
        kwargs = {**CELL, "slip": slip}
        env = TreeMDPEnv(**kwargs)
        policy = TabularPolicy()
        with torch.no_grad():
            exact = env.variance_by_depth(policy.log_probs, siblings=True)[1]
            marginal = env.variance_by_depth(policy.log_probs)[1]
        rows = []
        for reading in range(args.readings):
            row = {"slip": slip, "reading": reading, "exact": exact, "marginal": marginal,
                   **engine_reading(kwargs, policy, args.groups, args.seed, reading, args.trees_per_collect)}
            if not args.no_hand:
                row.update(hand_reading(kwargs, policy, args.groups, args.seed, reading))
            rows.append(row)
            print(json.dumps(row), flush=True)
        engine = np.array([r["engine"] for r in rows])
        pooled = {"slip": slip, "readings": len(rows), "exact": exact, "marginal": marginal,
                  "engine": float(engine.mean()),
                  "engine_se": float(np.sqrt(np.sum(np.square([r["engine_se"] for r in rows]))) / len(rows)),
                  "engine_reading_sd": float(engine.std(ddof=1)) if len(rows) > 1 else None,
                  "engine_se_per_reading": float(np.mean([r["engine_se"] for r in rows])),
                  "engine_se_naive_per_reading": float(np.mean([r["engine_se_naive"] for r in rows])),
                  "engine_min": float(engine.min()), "engine_max": float(engine.max()),
                  "same_first_action": float(np.mean([r["same_first_action"] for r in rows])),
                  "same_second_action_given_first": float(np.mean([r["same_second_action_given_first"] for r in rows]))}
        if not args.no_hand:
            hand = np.array([r["hand"] for r in rows])
            pooled.update(hand=float(hand.mean()),
                          hand_se=float(np.sqrt(np.sum(np.square([r["hand_se"] for r in rows]))) / len(rows)))
        print(json.dumps({"pooled": pooled}), flush=True)


if __name__ == "__main__":
    main()

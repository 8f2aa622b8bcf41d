"""BPO in one file: Branching Policy Optimization on a TreeMDP with a tabular policy.

    python examples/bpo_minimal.py --updates 30

Read it top to bottom, the way CleanRL's ``ppo.py`` reads: the env (``BPO-TreeMDP-v0``, whose
expected return is exact), a softmax table, the rollout tree (backbones, entropy branching,
snapshots), the weights, the advantages, the loss and the update, all in one loop. The formulas
are those of docs/unbiasedness.md (cited by rule). The library builds the same trees for the
same seeds (``bpo_algos.BPO`` through the shared rollout engine: docs/algorithms.md), and
``tests/test_bpo_minimal.py`` checks that this file's advantages and gradient equal the engine's.
What the library adds: budgets and the compute meter, any policy and env, adaptive thresholds,
nested branching, anchored baselines, recovery from env failures, and many trees in flight.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch

import bpo_envs  # registers BPO-TreeMDP-v0; snapshot() / restore() see through wrappers
from bpo_envs.seeding import key_seed


@dataclass
class Args:
    depth: int = 4
    """steps per episode (every TreeMDP episode lasts exactly ``depth`` steps)"""
    n_actions: int = 3
    """admissible actions at every node (``a0 .. a{A-1}``)"""
    env_seed: int = 1
    """fixes the TreeMDP's rewards"""
    n_tasks: int = 4
    """tasks of the TreeMDP; one tree per task per update"""
    backbones: int = 2
    """K0 >= 2 i.i.d. backbones from the root (rule 4: so backbone steps have siblings too)"""
    branch_factor: int = 2
    """K: i.i.d. actions at an inner branch point, the backbone's own among them"""
    entropy_threshold: float = 0.5
    """branch where the decision entropy exceeds this (nats)"""
    max_branch_points: int = 1
    """M: inner branch points per backbone (forked siblings never branch again)"""
    learning_rate: float = 20.0
    """plain gradient ascent on the logits (the advantages of a [0, 1] reward are small)"""
    updates: int = 30
    seed: int = 0


# ---- the policy: pi(a | h) = softmax(theta[h])[a], one row of logits per observation ----------
def log_probs(table: dict[str, torch.Tensor], obs: str, n_actions: int) -> torch.Tensor:
    """Differentiable ``log pi(. | h)``; a row of zero logits appears when ``h`` is first seen."""
    if obs not in table:
        table[obs] = torch.zeros(n_actions, requires_grad=True)
    return torch.log_softmax(table[obs], dim=-1)


def entropy(logp: torch.Tensor) -> float:
    """Decision entropy ``H(h) = -sum_a pi(a|h) log pi(a|h)``, exact over the admissible actions."""
    lp = logp.detach().double()
    return float(-(lp.exp() * lp).sum())


def sample(logp: torch.Tensor, n: int, rng: np.random.Generator) -> list[int]:
    """``n`` i.i.d. actions (rule 2: never deduplicated, never forced to differ)."""
    p = np.exp(logp.detach().double().numpy())
    return [int(a) for a in rng.choice(len(p), size=n, p=p / p.sum())]


def stream(seed: int, tree: int, key: tuple[int, ...]) -> np.random.Generator:
    """Every path's randomness is its own stream, keyed by (seed, tree, path key): the root
    path is (0,), the j-th sibling forked at depth d by path k is k + (d + 1, j); () is the
    tree's reset seed. (The engine's rule, so both build the same trees.)"""
    return np.random.default_rng(np.random.SeedSequence([seed, tree, len(key), *key]))


# ---- the rollout tree --------------------------------------------------------------------------
@dataclass(eq=False)
class Node:
    obs: str
    actions: list[str]
    depth: int
    children: list[Edge] = field(default_factory=list)


@dataclass(eq=False)
class Edge:
    obs: str
    action: int
    reward: float
    child: Node
    weight: float = 0.0
    q: float = 0.0
    advantage: float = 0.0


def collect_tree(env: gym.Env, table: dict[str, torch.Tensor], args: Args, task: int, seed: int, index: int) -> Node:
    """One BPO tree on ``task``: ``K0`` backbones from the root; along each backbone, at the
    first ``M`` decisions whose entropy exceeds the threshold, snapshot the env and fork ``K - 1``
    siblings, each rolled to the end without branching again."""
    obs, info = env.reset(seed=int(stream(seed, index, ()).integers(2**31 - 1)), options={"task_id": task})
    root = Node(obs, list(info["admissible_actions"]), 0)
    # a path: (where it starts, its first action (None: decide there), its key, may it branch)
    todo: list[tuple[Node, object, int | None, tuple[int, ...], bool]] = [(root, None, None, (0,), True)]
    while todo:
        node, snap, action, key, backbone = todo.pop()
        if snap is not None:
            bpo_envs.restore(env, snap)
        rng, branch_points = stream(seed, index, key), 0
        while True:
            logp = log_probs(table, node.obs, len(node.actions))
            if action is None:
                n = 1
                if node is root:
                    n = args.backbones
                elif backbone and branch_points < args.max_branch_points and entropy(logp) > args.entropy_threshold:
                    # rule 1: the decision reads h only (its entropy), before any action is sampled
                    n = args.branch_factor
                    branch_points += 1
                picks = sample(logp, n, rng)
                action = picks[0]  # the path goes on with the first; the others are its siblings
                if n > 1:
                    fork = bpo_envs.snapshot(env)
                    for j in range(1, n):
                        todo.append((node, fork, picks[j], (*key, node.depth + 1, j), node is root))
            obs, reward, terminated, truncated, info = env.step(node.actions[action])
            child = Node(obs, list(info.get("admissible_actions") or ()), node.depth + 1)
            node.children.append(Edge(node.obs, action, float(reward), child))
            node, action = child, None
            if terminated or truncated:
                break
    return root


# ---- weights, values and advantages --------------------------------------------------------------
def finalize(node: Node, weight: float = 1.0) -> float:
    """Rule 3: an edge's weight is the product of 1/K_b over the branch nodes above it (the root
    with K0); Q(e) = r_e + the mean Q of the edges below it (the weighted mean of the returns of
    its leaves). Returns the mean Q of ``node``'s edges."""
    if not node.children:
        return 0.0
    share = weight / len(node.children)
    for e in node.children:
        e.weight = share
        e.q = e.reward + finalize(e.child, share)
    return sum(e.q for e in node.children) / len(node.children)


def advantages(node: Node, baseline: float = 0.0, collected: float = 0.0) -> None:
    """Rule 4: for a step t on a path that left its nearest branch node b through child k,
    A_t = G_k(t) - mean_{j != k} G_j, where G_j = Q(b's j-th edge) and G_k(t) is the reward
    collected from b before t plus Q(t). The siblings are independent of path k's actions, so
    the leave-one-out mean is a baseline that adds no bias; every step gets a term."""
    if len(node.children) > 1:  # a branch node: leave-one-out over its children
        qs = np.array([e.q for e in node.children])
        loo = (qs.sum() - qs) / (len(qs) - 1)
        for e, b in zip(node.children, loo, strict=True):
            e.advantage = float(e.q - b)
            advantages(e.child, float(b), e.reward)
    for e in node.children if len(node.children) == 1 else ():
        e.advantage = float(collected + e.q - baseline)
        advantages(e.child, baseline, collected + e.reward)


def edges(node: Node) -> list[Edge]:
    out = []
    for e in node.children:
        out += [e, *edges(e.child)]
    return out


def loss(trees: list[Node], table: dict[str, torch.Tensor]) -> torch.Tensor:
    """``-(1/T) sum_trees sum_steps w_t A_t log pi(a_t | h_t)``: its gradient is minus the BPO
    policy-gradient estimate (the library's clipped surrogate with ``aggregation="step-sum"`` at
    ratio 1, no KL; all steps are on-policy here)."""
    total = torch.zeros(())
    for root in trees:
        for e in edges(root):
            total = total + e.weight * e.advantage * log_probs(table, e.obs, len(table[e.obs]))[e.action]
    return -total / len(trees)


# ---- the training loop ----------------------------------------------------------------------------
def main(args: Args) -> list[float]:
    env = gym.make("BPO-TreeMDP-v0", depth=args.depth, n_actions=args.n_actions, seed=args.env_seed, n_tasks=args.n_tasks)
    table: dict[str, torch.Tensor] = {}
    tasks = list(range(args.n_tasks))
    curve = []
    for update in range(args.updates):
        # the exact expected return of the current policy, averaged over the tasks
        with torch.no_grad():
            j = np.mean([float(env.unwrapped.expected_return(lambda o, a: log_probs(table, o, len(a)), task=t)) for t in tasks])
        curve.append(float(j))
        seed = key_seed(args.seed, update)  # a new batch seed per update: its own stream
        trees = [collect_tree(env, table, args, task, seed, i) for i, task in enumerate(tasks)]
        for root in trees:
            finalize(root)
            advantages(root)
        for row in table.values():
            row.grad = None
        loss(trees, table).backward()
        with torch.no_grad():  # plain gradient ascent on J: theta <- theta + lr * g_hat
            for row in table.values():
                if row.grad is not None:
                    row -= args.learning_rate * row.grad
        steps = sum(len(edges(r)) for r in trees)
        print(f"update {update:3d}  J = {j:.4f}  steps = {steps}")
    return curve


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in vars(Args()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    main(Args(**vars(parser.parse_args())))

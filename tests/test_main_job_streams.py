"""The main job's random streams: independent across seeds, common across algorithms of a seed."""

from __future__ import annotations

import ast
from pathlib import Path

import gymnasium as gym

import bpo_envs  # noqa: F401
from bpo_algos import EnvPool, TabularPolicy
from bpo_experiments.evaluation import evaluate_episodes
from bpo_experiments.presets import PRESETS
from bpo_experiments.run_config import algorithm_spec, env_config
from bpo_experiments.streams import ROLES, stream_seed

ROOT = Path(__file__).resolve().parents[1]


def test_two_seeds_share_no_stream():
    keys = [(role, task, episode) for role in ROLES.values() for task in range(40) for episode in range(4)]
    by_seed = {seed: {stream_seed(seed, *key) for key in keys} for seed in range(6)}
    assert all(len(streams) == len(keys) for streams in by_seed.values())  # no two streams of a seed coincide
    for a in by_seed:
        for b in by_seed:
            if a < b:
                assert not by_seed[a] & by_seed[b], (a, b)
    # the collision of the additive offsets it replaces: seed s's episode j+1 was seed s+1's episode j
    assert stream_seed(0, ROLES["evaluation"], 3, 1) != stream_seed(1, ROLES["evaluation"], 3, 0)
    # broken case the test must catch: additive offsets do collide
    assert (0 + 2000 + 1000 * 3 + 1) == (1 + 2000 + 1000 * 3 + 0)


def test_algorithms_of_one_seed_share_their_streams():
    preset = PRESETS["smoke"]
    # the same training stream (tasks, trees) and evaluation episodes for every algorithm of a seed
    treemdp = env_config(preset, "treemdp")
    seeds = {treemdp.run_trainer(3, 4).seed for _ in preset.algorithms}
    assert len(seeds) == 1 and seeds != {treemdp.run_trainer(4, 4).seed}
    assert algorithm_spec("bpo", preset, 7, "treemdp").build().seed == algorithm_spec("rloo", preset, 7, "treemdp").build().seed == 7

    def make():
        return gym.make("BPO-TreeMDP-v0", depth=3, n_actions=2, n_tasks=6, seed=0)

    pool = EnvPool([make] * 2)
    try:
        policy = TabularPolicy(seed=11)
        first = evaluate_episodes(policy, pool, list(range(6)), 3, seed=5)
        again = evaluate_episodes(TabularPolicy(seed=99), pool, list(range(6)), 3, seed=5)
        other = evaluate_episodes(policy, pool, list(range(6)), 3, seed=6)
    finally:
        pool.close()
    assert first == again  # common random numbers: the same policy plays the same episodes
    assert first != other  # another seed's episodes are its own (the uniform policy's 18 episodes)


SOURCES = ("bpo_envs", "bpo_algos", "baselines", "bpo_experiments", "scripts", "benchmarks", "studies", "examples", "deploy")


def _is_seed(node: ast.AST) -> bool:
    """A name or attribute that holds a seed: ``seed``, ``args.seed``, ``base_seed``,
    ``TUNING_SEED_OFFSET`` (a word ``seed`` in its ``_``-separated name; ``seeds`` is a list)."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name is not None and "seed" in name.lower().split("_")


def seed_arithmetic(source: str, filename: str = "<source>") -> list[int]:
    """Lines where a seed is added to or multiplied with something (``seed + i``,
    ``seed * 1000 + u``, ``1000 + seed``, ``TUNING_SEED_OFFSET + s``): a stream keyed by
    arithmetic, which two different keys can share."""
    return sorted({
        node.lineno for node in ast.walk(ast.parse(source, filename))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult)
        and (_is_seed(node.left) or _is_seed(node.right))
    })


def test_seed_arithmetic_is_caught():
    # the broken cases the check must catch (each once in the project before)
    broken = [
        "rng = np.random.default_rng(seed + i)",
        "batch = algorithm.collect(policy, pool, tasks, budget, seed=seed * 1000 + update)",
        "env.reset(seed=args.seed * 100_000 + episode)",
        "runs = [train(cell, TUNING_SEED_OFFSET + s) for s in range(3)]",
        "x = 7 + self.seed",
    ]
    assert all(seed_arithmetic(line) == [1] for line in broken)
    fine = [
        "rng = np.random.default_rng(np.random.SeedSequence([seed, role, i]))",
        "key = stream_seed(seed, TRAINING, 0, update)",
        "total = len(seeds) * 2 + n_seeds",
    ]
    assert not any(seed_arithmetic(line) for line in fine)


def test_no_seed_arithmetic_is_left():
    files = [p for package in SOURCES for p in sorted((ROOT / package).rglob("*.py"))]
    assert len(files) > 100
    found = [f"{p.relative_to(ROOT)}:{line}" for p in files for line in seed_arithmetic(p.read_text(), str(p))]
    assert not found, found

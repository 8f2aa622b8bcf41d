"""Timing helpers shared by the env benchmarks (``benchmarks/bench_*.py``).

Medians of repeated calls, random admissible walks (steps/s), and the cost of ``snapshot``,
``restore`` and a :class:`~bpo_envs.ReplaySnapshot` restore (reset + replay) at the same depth.
Benchmarks only: nothing here is used by the envs or the algorithms.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from bpo_envs.capabilities import declared
from bpo_envs.core import restore, snapshot
from bpo_envs.replay import ReplaySnapshot
from bpo_envs.seeding import key_seed


def time_calls(fn: Callable[[], Any], n: int, *, ms: bool = False) -> list[float]:
    """Seconds (milliseconds with ``ms=True``) of each of ``n`` calls of ``fn()``."""
    scale = 1000.0 if ms else 1.0
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * scale)
    return out


def median_seconds(fn: Callable[[], Any], n: int) -> float:
    """Median seconds of ``fn()`` over ``n`` calls."""
    return statistics.median(time_calls(fn, n))


def ms_summary(seconds: Sequence[float]) -> dict[str, float]:
    """``{"median_ms", "min_ms", "n"}`` of durations given in seconds."""
    return {
        "median_ms": round(1000 * statistics.median(seconds), 2),
        "min_ms": round(1000 * min(seconds), 2),
        "n": len(seconds),
    }


def random_action(env: gym.Env, info: dict[str, Any], rng: np.random.Generator) -> str:
    """A uniformly random admissible action, else the env's own ``sample_action(rng)``."""
    admissible = info.get("admissible_actions")
    if admissible:
        return str(admissible[int(rng.integers(len(admissible)))])
    owner = declared(env)
    sampled = owner.sample_action(rng) if owner is not None else None
    if sampled is None:
        raise ValueError(
            f"{env.unwrapped!r} lists no admissible actions and has no sample_action()"
        )
    return sampled


@dataclass
class Walk:
    """What :func:`random_walk` measured."""

    steps: int
    seconds: float
    """Wall time of the whole walk, resets included."""
    step_seconds: list[float] = field(default_factory=list)
    episodes: int = 0

    @property
    def steps_per_s(self) -> float:
        """Steps per wall-clock second, resets included (random-episode throughput)."""
        return self.steps / self.seconds

    @property
    def step_ms(self) -> float:
        """Median milliseconds of one ``step`` call."""
        return 1000 * statistics.median(self.step_seconds)


def random_walk(env: gym.Env, steps: int, seed: int, options: dict[str, Any] | None = None) -> Walk:
    """``steps`` random admissible steps; a finished episode is followed by a new reset.

    Resets use ``options`` when given (a fixed task), else seeds ``seed``, then ``key_seed(seed, k)`` for episode ``k`` (:mod:`bpo_envs.seeding`).
    """
    rng = np.random.default_rng(seed)
    step_seconds = []
    episode = 0
    start = time.perf_counter()
    _, info = env.reset(seed=seed, options=options)
    for _ in range(steps):
        action = random_action(env, info, rng)
        t = time.perf_counter()
        _, _, terminated, truncated, info = env.step(action)
        step_seconds.append(time.perf_counter() - t)
        if terminated or truncated:
            episode += 1
            _, info = env.reset(seed=key_seed(seed, episode), options=options)
    return Walk(steps, time.perf_counter() - start, step_seconds, episode)


def walk_prefix(
    env: gym.Env, depth: int, seed: int, options: dict[str, Any] | None = None
) -> tuple[list[str], dict[str, Any]]:
    """Reset and take up to ``depth`` random admissible steps that do not end the episode (the
    longest of a few tries); returns the actions and the last ``info``, the env left there."""
    best: list[str] = []
    for attempt in range(8):
        rng = np.random.default_rng(key_seed(seed, attempt))
        _, info = env.reset(seed=seed, options=options)
        actions: list[str] = []
        while len(actions) < depth:
            action = random_action(env, info, rng)
            *_, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
            actions.append(action)
        best = max(best, actions, key=len)
        if len(best) >= depth:
            break
    _, info = env.reset(seed=seed, options=options)
    for action in best:
        *_, info = env.step(action)
    return best, info


def reset_ms(
    env: gym.Env, repeats: int, seed: int = 0, options: dict[str, Any] | None = None
) -> float:
    """Median ms of ``reset(seed, options)``, each after one random step (so that the reset has
    something to undo: an env may skip the work when nothing changed)."""
    rng = np.random.default_rng(seed)
    _, info = env.reset(seed=seed, options=options)
    seconds = []
    for _ in range(repeats):
        env.step(random_action(env, info, rng))
        start = time.perf_counter()
        _, info = env.reset(seed=seed, options=options)
        seconds.append(time.perf_counter() - start)
    return 1000 * statistics.median(seconds)


def snapshot_restore_ms(
    env: gym.Env, info: dict[str, Any], repeats: int, seed: int = 0
) -> dict[str, float]:
    """Median ms of ``snapshot`` and ``restore`` around ``env``'s current state (``info``: its
    last info). Each repeat takes a random step away from that state and restores it (timed: a
    change to undo), then takes another and snapshots there (timed: a state the env has not
    captured yet) and restores again."""
    rng = np.random.default_rng(seed)
    base = snapshot(env)
    snap_seconds, restore_seconds = [], []
    for _ in range(repeats):
        env.step(random_action(env, info, rng))
        start = time.perf_counter()
        restore(env, base)
        restore_seconds.append(time.perf_counter() - start)
        env.step(random_action(env, info, rng))
        start = time.perf_counter()
        snap = snapshot(env)
        snap_seconds.append(time.perf_counter() - start)
        snap.release()
        restore(env, base)
    base.release()
    return {
        "snapshot_ms": 1000 * statistics.median(snap_seconds),
        "restore_ms": 1000 * statistics.median(restore_seconds),
    }


def replay_restore_ms(
    make_env: Callable[[], gym.Env],
    actions: Sequence[str],
    repeats: int,
    seed: int = 0,
    options: dict[str, Any] | None = None,
) -> float:
    """Median ms of a :class:`ReplaySnapshot` restore after ``reset(seed, options)`` + ``actions``
    (a reset and ``len(actions)`` steps, checked by hashing)."""
    replay = ReplaySnapshot(make_env())
    try:
        replay.reset(seed=seed, options=options)
        for action in actions:
            replay.step(action)
        snap = replay.snapshot()
        return statistics.median(time_calls(lambda: replay.restore(snap), repeats, ms=True))
    finally:
        replay.close()

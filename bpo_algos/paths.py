"""The trees and paths the rollout engine (:mod:`bpo_algos.rollout`) is building.

A :class:`TreeBuild` is one tree under construction; a :class:`PathState` one path of it being
rolled out (a backbone, or a sibling forked at a branch node), with the env it holds, the
snapshot it starts from (:class:`SharedSnapshot`, released by the last sibling that used it)
and its own random stream (:func:`path_stream`).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

import bpo_envs
from bpo_algos.policy.base import Action, Context
from bpo_algos.tree import Node, RolloutTree


def path_stream(batch_seed: int, tree_index: int, key: tuple[int, ...]) -> np.random.Generator:
    """The random stream of path ``key`` of tree ``tree_index`` of the batch seeded ``batch_seed``.

    Keys: the root path ``(0,)``; the ``j``-th sibling a path ``k`` forks at depth ``d``:
    ``k + (d + 1, j)``; the ``i``-th expansion of round ``r``: ``(1, r, i)``; ``()`` is the tree's
    own (its reset seed). A path draws from its stream only for itself (a tie at the entropy
    threshold, its sampled actions), so what a tree contains is a function of its key and the
    policy, not of which other trees or paths were in flight, or where."""
    return np.random.default_rng(np.random.SeedSequence([int(batch_seed), int(tree_index), len(key), *key]))


@dataclass(eq=False)
class SharedSnapshot:
    """A snapshot taken at ``node`` on env ``origin``, held until ``pending`` siblings used it."""

    snapshot: bpo_envs.Snapshot
    origin: gym.Env
    pending: int
    node: Node


@dataclass(eq=False)
class TreeBuild:
    """One tree under construction: its open paths, held snapshots and state."""

    tree: RolloutTree
    open_paths: int = 0
    started: float = 0.0
    finished: bool = False
    task: Any = None
    seed: int = 0
    dropped: bool = False
    expansion_round: int = 0
    snapshots: dict[int, SharedSnapshot] = field(default_factory=dict)
    """Snapshots still held, by ``id`` of their node (rebuild sources after a failure)."""
    batch_seed: int = 0
    index: int = 0
    """With ``batch_seed``, the key of the tree's random stream (:func:`path_stream`): the
    engine's seed and the tree's index in the batch, or a tree's own seed and 0 (the engine's
    ``run(seeds=...)``)."""
    child_keys: dict[int, list[tuple[int, ...]]] = field(default_factory=dict)
    """Per node (by ``id``), the keys of the paths that made its child edges, in order."""

    def stream(self, key: tuple[int, ...]) -> np.random.Generator:
        return path_stream(self.batch_seed, self.index, key)

    def add_child(self, node: Node, edge: Any, key: tuple[int, ...]) -> None:
        """Insert ``edge`` among ``node``'s children by the key of the path that made it (the
        order of sampling, whichever path stepped first)."""
        keys = self.child_keys.setdefault(id(node), [])
        at = bisect.bisect_right(keys, key)
        keys.insert(at, key)
        node.children.insert(at, edge)

    def remove_child(self, node: Node, edge: Any) -> None:
        """Remove ``edge`` (and its key) from ``node``'s children."""
        at = next(i for i, e in enumerate(node.children) if e is edge)
        del node.children[at]
        keys = self.child_keys.get(id(node))
        if keys is not None and len(keys) > at:
            del keys[at]


@dataclass(eq=False)
class PathState:
    """One path being rolled out (a backbone, or a sibling forked at a branch node)."""

    build: TreeBuild
    node: Node
    level: int = 0
    """Inner branch levels above this path's line (fresh siblings are one deeper)."""
    branch_points: int = 0
    """Branch nodes created along this path's own line."""
    env: gym.Env | None = None
    snapshot: SharedSnapshot | None = None
    pending: Action | None = None
    is_root: bool = False
    attempts: int = 0
    """Failures this path has had (it is dropped after ``pool.retries`` retries)."""
    rebuild: bool = False
    """Its env must be rebuilt (restore the nearest held snapshot, replay) before it goes on."""
    key: tuple[int, ...] = (0,)
    """Which path of its tree this is (:func:`path_stream`)."""
    rng: np.random.Generator | None = None
    """The path's random stream (made from ``key`` on first use)."""

    @property
    def random(self) -> np.random.Generator:
        """This path's own random stream: ties at an entropy threshold, sampled actions."""
        if self.rng is None:
            self.rng = self.build.stream(self.key)
        return self.rng

    @property
    def context(self) -> Context:
        return self.node.context

    def consume_snapshot(self) -> None:
        """This path no longer needs its snapshot; the last sibling to let go releases it."""
        shared, self.snapshot = self.snapshot, None
        if shared is None:
            return
        shared.pending -= 1
        if shared.pending == 0:
            self.build.snapshots.pop(id(shared.node), None)
            shared.snapshot.release()

    def close(self) -> bool:
        """The path ended (or was dropped); True when it was its tree's last open path."""
        self.build.open_paths -= 1
        return self.build.open_paths == 0

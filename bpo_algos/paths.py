"""The trees and paths the rollout engine (:mod:`bpo_algos.rollout`) is building.

A :class:`TreeBuild` is one tree under construction; a :class:`PathState` one path of it being
rolled out (a backbone, or a sibling forked at a branch node), with the env it holds and the
snapshot it starts from (:class:`SharedSnapshot`, released by the last sibling that used it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

import bpo_envs
from bpo_algos.policy.base import Action, Context
from bpo_algos.tree import Node, RolloutTree


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

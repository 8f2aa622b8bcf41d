"""Env failures during collection: retry, rebuild, drop.

A crashed sandbox or a dead Ray actor (an exception from ``step``, ``restore``, ``snapshot`` or
``reset``) costs only the path it hit. The env is handed back with ``pool.release(env,
failed=True)`` (the pool replaces it) and the path is **retried**: another env is **rebuilt** to
the path's current node by restoring the nearest snapshot above it that is still held (else by
``reset`` with the tree's seed) and replaying the recorded actions below it, checking that every
observation and reward comes back identical; then the path goes on with the action it had
already sampled. A retried path is the same sample it would have been, so retries cost compute
(counted in the meter: the replayed steps in ``env_steps`` and ``replay_steps``) and nothing
else. After ``pool.retries`` failed attempts, or when a replay diverges (a non-deterministic
env), the path is **dropped**:

* the *line* it was on is removed: the edges from its nearest branch node ``b`` down to where
  it failed (a line holds no other branch node, so no other path is lost), and ``b``'s branch
  factor drops from ``K`` to ``K - 1``; the weights (docs/unbiasedness.md, rule 3) and the
  leave-one-out baselines (rule 4) are computed over the ``K - 1`` survivors. A branch node
  left with one line is an ordinary node; one left with none is itself a dead line and is
  removed the same way;
* a tree whose root keeps fewer than two lines (one, when the topology has a single root
  branch) is dropped whole: a group baseline needs two samples;
* the compute already spent stays in the meters; ``failures`` counts the errors and
  ``dropped_steps`` the env steps thrown away; ``EngineResult.failures`` says what happened.

Bias: the survivors at ``b`` are still i.i.d. draws from ``pi(.|h_b)`` *if whether a line
fails is independent of the actions sampled on it and of what follows*, so every estimate stays
unbiased (with fewer samples). Where that does not hold the drop is biased: an action that
itself crashes the sandbox is never penalised (an env must turn bad model output into an
invalid-action observation instead of raising), and with a fixed crash rate per step a long
line fails more often than a short one, which tilts the survivors towards short episodes.
Retries remove both effects; only lines that fail ``retries + 1`` times are dropped.
``pool.max_failures`` failures in one batch raise :class:`EnvFailureError` (a systematic bug
is not a flaky worker).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from bpo_algos.compute import ComputeMeter
from bpo_algos.paths import PathState, TreeBuild
from bpo_algos.tree import Edge

logger = logging.getLogger(__name__)


class EnvFailureError(RuntimeError):
    """Too many env failures in one batch, or no env left in the pool."""


class ReplayMismatchError(RuntimeError):
    """Rebuilding a path by replay did not reproduce the recorded transitions."""


@dataclass
class FailureRecord:
    """One env failure the engine handled."""

    task_id: Any
    depth: int
    stage: str  # "reset" | "step" | "restore" | "snapshot" | "rebuild"
    error: str
    outcome: str  # "retried" | "dropped" | "tree dropped" | "task skipped"


def line_edges(edge: Edge) -> int:
    """Edges in ``edge``'s subtree, itself included."""
    count, stack = 0, [edge]
    while stack:
        e = stack.pop()
        count += 1
        stack.extend(e.child.children)
    return count


Charge = Callable[..., None]
"""``charge(build, **amounts)``: add amounts to the batch meter and to the build's tree meter."""
Restore = Callable[["TreeBuild", gym.Env, Any], None]
"""``restore(build, env, snapshot)``: restore and meter it (restores, replayed steps, time)."""


class FailureHandler:
    """Retries, rebuilds and drops paths whose env failed (see the module docstring).

    Args:
        pool: the env pool (failed envs go back with ``release(env, failed=True)``).
        meter: the batch meter (``failures`` is checked against ``max_failures``).
        charge / restore: the engine's metering (:data:`Charge`, :data:`Restore`).
        done: where a build goes when its last open path closes.
        min_root_lines: root lines a tree must keep (2, or 1 for a single root branch).
    """

    def __init__(
        self,
        pool: Any,
        meter: ComputeMeter,
        *,
        charge: Charge,
        restore: Restore,
        done: list[TreeBuild],
        min_root_lines: int,
    ) -> None:
        self.pool = pool
        self.meter = meter
        self.retries = pool.retries
        self.max_failures = pool.max_failures
        self.records: list[FailureRecord] = []
        self._charge = charge
        self._restore = restore
        self._done = done
        self.min_root_lines = min_root_lines

    def record(self, tree: Any, task: Any, depth: int, stage: str, exc: BaseException, outcome: str) -> None:
        """Count one failure (raise :class:`EnvFailureError` past ``max_failures``)."""
        self.meter.failures += 1
        if tree is not None:
            tree.compute.failures += 1
        self.records.append(FailureRecord(task, depth, stage, f"{type(exc).__name__}: {exc}"[:500], outcome))
        logger.warning("env failure at %s (task %r, depth %d): %r -> %s", stage, task, depth, exc, outcome)
        if self.meter.failures > self.max_failures:
            raise EnvFailureError(
                f"{self.meter.failures} env failures in one batch (pool.max_failures={self.max_failures}); "
                f"the last, at {stage}: {type(exc).__name__}: {exc}"
            ) from exc

    def fail(self, path: PathState, stage: str, exc: BaseException, waiting: deque[PathState]) -> None:
        """``path``'s env raised: queue the path for a retry on another env, or drop its line."""
        if path.env is not None:
            self.pool.release(path.env, failed=True)
            path.env = None
        path.consume_snapshot()
        path.attempts += 1
        retry = path.attempts <= self.retries and not isinstance(exc, ReplayMismatchError)
        tree = path.build.tree
        self.record(tree, tree.task_id, path.node.depth, stage, exc, "retried" if retry else "dropped")
        if retry:
            path.rebuild = True
            waiting.append(path)
        else:
            self.drop(path)

    def drop(self, path: PathState) -> None:
        """Remove ``path``'s line (see the module docstring) and close the path."""
        build = path.build
        node, edge = path.node, None
        lost = 0
        while True:
            while node.branch_factor <= 1 and node.parent is not None:
                edge = node.parent
                node = edge.parent
            if edge is not None:
                build.remove_child(node, edge)
                lost += line_edges(edge)
            node.branch_factor -= 1
            if node.branch_factor > 0:
                break
            if node.parent is None:  # the root lost every line
                build.dropped = True
                break
            edge = None
        if node.parent is None and node.branch_factor < self.min_root_lines:
            build.dropped = True
        self._charge(build, dropped_steps=lost)
        if path.close():
            self._done.append(build)

    def tree_lost(self, build: TreeBuild) -> bool:
        """Whether a finished build keeps too few root lines; if so, empty it and record why."""
        tree = build.tree
        lines = len(tree.root.children)
        if not build.dropped and lines >= self.min_root_lines:
            return False
        lost = sum(line_edges(e) for e in tree.root.children)
        tree.root.children.clear()
        self._charge(build, dropped_steps=lost)
        self.records.append(FailureRecord(tree.task_id, 0, "tree", f"{lines} root line(s) left", "tree dropped"))
        logger.warning("dropped the tree of task %r: %d root line(s) left after failures", tree.task_id, lines)
        return True

    def rebuild(self, path: PathState, env: gym.Env) -> None:
        """Bring ``env`` to ``path.node``: restore the nearest held snapshot above it (else reset
        with the tree's seed) and replay the recorded steps below it, checking each."""
        build = path.build
        below: list[Edge] = []
        node = path.node
        while True:
            shared = build.snapshots.get(id(node))
            if shared is not None:
                try:
                    self._restore(build, env, shared.snapshot)
                except Exception:  # noqa: BLE001 - e.g. its actor died; try further up
                    logger.debug("rebuild: a held snapshot failed to restore", exc_info=True)
                else:
                    break
            if node.parent is None:
                obs, _ = env.reset(seed=build.seed, options={"task_id": build.task})
                self._charge(build, resets=1)
                if obs != node.context.observation:
                    raise ReplayMismatchError("reset with the tree's seed gave another observation")
                break
            below.append(node.parent)
            node = node.parent.parent
        for edge in reversed(below):
            obs, reward, terminated, truncated, _ = env.step(edge.action.command)
            self._charge(build, env_steps=1, replay_steps=1)
            if (obs, float(reward), bool(terminated), bool(truncated)) != (
                edge.child.context.observation, edge.reward, edge.terminated, edge.truncated
            ):
                raise ReplayMismatchError(f"replaying {edge.action.command!r} gave another transition")

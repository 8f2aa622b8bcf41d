"""One rollout engine for every algorithm: builds a :class:`RolloutTree` per task.

The algorithm supplies the *topology* (:class:`Topology`): how many i.i.d. actions the root
gets (``N`` or ``K0``) and, for every other decision point, whether to ask the policy for its
decision entropy and how many actions to sample there given that entropy. The engine:

1. resets an env of the pool on the task, then repeatedly, for every path that holds an env:
2. asks ``policy.decision_entropy`` for the paths the topology wants it for (before any
   sampling: docs/unbiasedness.md, rule 1), lets the topology choose ``n`` per path;
3. samples ``n`` i.i.d. actions per path (one batched ``policy.sample`` call per distinct
   ``n``; rule 2: never deduplicated);
4. where ``n > 1``, snapshots the env (a branch node) and queues ``n - 1`` sibling paths, each
   carrying its already-sampled action and the snapshot; the path itself continues with the
   first sample, so the backbone's own action is one of the siblings;
5. steps the envs (``pool.step_many``); a finished path frees its env, onto which a queued
   sibling is restored (preferring the env that took its snapshot);
6. when a tree's last path ends, a topology with an ``expansions`` hook (Tree-GRPO) may name
   nodes of the finished tree to grow again: each gets a fresh path from that node (one new
   i.i.d. action, rolled to the end), its env brought there by restoring the node's snapshot
   (a topology with ``snapshot_nodes = True`` has one taken at every decision node) or else by
   the rebuild below; the tree is finalized when the hook names no more nodes.

Trees in flight at once are bounded by ``max_parallel_trees``; a new tree starts only while the
budget is not spent, and a tree in progress is always finished (cutting it would bias the
estimate). The schedule (which paths step together, in which order the policy sees them)
depends only on the pool's free-slot bookkeeping, so two pools with the same number of envs and
the same ``acquire``/``release`` semantics (:class:`EnvPool` and
:class:`bpo_envs.distributed.RayEnvPool`) give the same batch for the same seeds.

Failures (a crashed sandbox, a dead Ray actor): an exception from ``step``, ``restore``,
``snapshot`` or ``reset`` costs only the path it hit. The env is handed back with
``pool.release(env, failed=True)`` (the pool replaces it) and the path is **retried**: another
env is brought to the path's current node by restoring the nearest snapshot above it that is
still held (else by ``reset`` with the tree's seed) and replaying the recorded actions below
it, checking that every observation and reward comes back identical; then the path goes on
with the action it had already sampled. A retried path is the same sample it would have been,
so retries cost compute (counted in the meter) and nothing else. After ``pool.retries`` failed
attempts, or when a replay diverges (a non-deterministic env), the path is **dropped**:

* the *line* it was on is removed: the edges from its nearest branch node ``b`` down to where
  it failed (a line holds no other branch node, so no other path is lost), and ``b``'s branch
  factor drops from ``K`` to ``K - 1``; the weights (rule 3) and the leave-one-out baselines
  (rule 4) are computed over the ``K - 1`` survivors. A branch node left with one line is an
  ordinary node; one left with none is itself a dead line and is removed the same way;
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

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

import bpo_envs
from bpo_algos.checks import check_count
from bpo_algos.compute import Budget, ComputeMeter
from bpo_algos.policy.base import Action, Context, Policy, admissible_of
from bpo_algos.tree import Edge, Node, RolloutTree

EnvFn = Callable[[], gym.Env]
StepResult = tuple[Any, float, bool, bool, dict[str, Any]]

logger = logging.getLogger(__name__)


class EnvFailureError(RuntimeError):
    """Too many env failures in one batch, or no env left in the pool."""


class ReplayMismatchError(RuntimeError):
    """Rebuilding a path by replay did not reproduce the recorded transitions."""


class EnvPool:
    """Envs made lazily from ``env_fns``, lent to paths one at a time.

    ``workers > 1`` steps the lent envs in a thread pool (worth it when a step waits on a
    subprocess or a container, as SWE-bench commands do); the default steps them in turn.
    ``retries`` and ``max_failures`` set how the engine handles failing envs (see the module
    docstring). A distributed pool implements the same methods and attributes.
    """

    def __init__(
        self,
        env_fns: Sequence[EnvFn],
        *,
        workers: int = 1,
        retries: int = 2,
        max_failures: int = 64,
    ) -> None:
        if not env_fns:
            raise ValueError("env_fns must hold at least one env factory")
        self.workers = check_count("workers", workers, 1)
        self.retries = check_count("retries", retries, 0)
        self.max_failures = check_count("max_failures", max_failures, 1)
        self._executor: ThreadPoolExecutor | None = None
        self._fns = list(env_fns)
        self._envs: list[gym.Env | None] = [None] * len(self._fns)
        self._free: list[int] = list(range(len(self._fns)))
        self._index: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._fns)

    @property
    def n_free(self) -> int:
        return len(self._free)

    def acquire(self, prefer: gym.Env | None = None) -> gym.Env | None:
        """A free env (``prefer`` when it is free), or None when all are lent."""
        if not self._free:
            return None
        slot = self._free[0]
        if prefer is not None and id(prefer) in self._index and self._index[id(prefer)] in self._free:
            slot = self._index[id(prefer)]
        self._free.remove(slot)
        env = self._envs[slot]
        if env is None:
            env = self._fns[slot]()
            self._envs[slot] = env
            self._index[id(env)] = slot
        return env

    def is_free(self, env: gym.Env) -> bool:
        return self._index.get(id(env)) in self._free

    def is_lent(self, env: gym.Env) -> bool:
        """``env`` is in the pool and lent to a path (not free, not replaced after a failure)."""
        slot = self._index.get(id(env))
        return slot is not None and slot not in self._free

    def release(self, env: gym.Env, *, failed: bool = False) -> None:
        """Hand ``env`` back; ``failed=True``: it raised, so close it and make a new one."""
        slot = self._index[id(env)]
        if slot in self._free:
            raise RuntimeError("env released twice")
        if failed:
            del self._index[id(env)]
            self._envs[slot] = None
            try:
                env.close()
            except Exception:  # noqa: BLE001 - a broken env may not even close
                logger.debug("closing a failed env raised", exc_info=True)
        self._free.append(slot)

    def step_many(self, envs: Sequence[gym.Env], actions: Sequence[str]) -> list[StepResult | Exception]:
        """``env.step(action)`` for each pair, in order of the inputs.

        An env whose step raises gives its exception in its place: one failing env never
        costs the others' results.
        """
        if self.workers == 1 or len(envs) < 2:
            return [_step_or_error(env, action) for env, action in zip(envs, actions, strict=True)]
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="bpo-env")
        return list(self._executor.map(lambda pair: _step_or_error(*pair), zip(envs, actions, strict=True)))

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        for env in self._envs:
            if env is not None:
                env.close()
        self._envs = [None] * len(self._fns)
        self._index.clear()
        self._free = list(range(len(self._fns)))


def _step_or_error(env: gym.Env, action: str) -> StepResult | Exception:
    try:
        return env.step(action)
    except Exception as exc:  # noqa: BLE001 - handed to the engine as this env's failure
        return exc


class Topology(Protocol):
    """Where a tree branches: the algorithm's side of the engine."""

    root_branches: int

    def wants_entropy(self, path: PathState) -> bool:
        """Whether the branch decision at this path's current node needs the entropy."""
        ...

    def fork_count(self, path: PathState, entropy: float | None) -> int:
        """How many i.i.d. actions to sample here (1 = no branch). Must not look at actions."""
        ...

    # Optional (read with getattr): ``snapshot_nodes: bool`` (snapshot every decision node
    # while its tree is open) and ``expansions(tree, round) -> Sequence[Node]`` (nodes of the
    # finished tree to grow by one more path each; called with round 0, 1, ... until empty).


@dataclass(eq=False)
class _SharedSnapshot:
    snapshot: bpo_envs.Snapshot
    origin: gym.Env
    pending: int
    node: Node


@dataclass(eq=False)
class TreeBuild:
    tree: RolloutTree
    open_paths: int = 0
    started: float = 0.0
    finished: bool = False
    task: Any = None
    seed: int = 0
    dropped: bool = False
    expansion_round: int = 0
    snapshots: dict[int, _SharedSnapshot] = field(default_factory=dict)
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
    snapshot: _SharedSnapshot | None = None
    pending: Action | None = None
    is_root: bool = False
    attempts: int = 0
    """Failures this path has had (it is dropped after ``pool.retries`` retries)."""
    rebuild: bool = False
    """Its env must be rebuilt (restore the nearest held snapshot, replay) before it goes on."""

    @property
    def context(self) -> Context:
        return self.node.context


@dataclass
class FailureRecord:
    """One env failure the engine handled."""

    task_id: Any
    depth: int
    stage: str  # "reset" | "step" | "restore" | "snapshot" | "rebuild"
    error: str
    outcome: str  # "retried" | "dropped" | "tree dropped" | "task skipped"


@dataclass
class EngineResult:
    trees: list[RolloutTree]
    compute: ComputeMeter
    entropies: list[float] = field(default_factory=list)
    failures: list[FailureRecord] = field(default_factory=list)


def _policy_usage(policy: Policy) -> ComputeMeter:
    meter = getattr(policy, "meter", None)
    return meter.copy() if isinstance(meter, ComputeMeter) else ComputeMeter()


def _line_edges(edge: Edge) -> int:
    """Edges in ``edge``'s subtree, itself included."""
    count, stack = 0, [edge]
    while stack:
        e = stack.pop()
        count += 1
        stack.extend(e.child.children)
    return count


class RolloutEngine:
    """Builds rollout trees through an :class:`EnvPool` (see the module docstring)."""

    def __init__(self, pool: EnvPool, *, max_parallel_trees: int | None = None, seed: int = 0) -> None:
        self.pool = pool
        self.max_parallel_trees = max_parallel_trees or len(pool)
        if self.max_parallel_trees < 1:
            raise ValueError(f"max_parallel_trees must be >= 1, got {max_parallel_trees}")
        self._rng = np.random.default_rng(seed)
        self.retries = int(getattr(pool, "retries", 2))
        self.max_failures = int(getattr(pool, "max_failures", 64))

    # ---- policy calls, charged to the trees whose contexts they served ------------------
    def _call(self, meter: ComputeMeter, paths: Sequence[PathState], fn: Callable[[], Any]) -> Any:
        before = _policy_usage(self._policy)
        out = fn()
        delta = _policy_usage(self._policy) - before
        meter.policy_calls += delta.policy_calls
        meter.prefill_tokens += delta.prefill_tokens
        share, rest = divmod(delta.prefill_tokens, max(len(paths), 1))
        seen: set[int] = set()
        for i, path in enumerate(paths):
            tc = path.build.tree.compute
            tc.prefill_tokens += share + (rest if i == 0 else 0)
            if id(path.build) not in seen:
                tc.policy_calls += 1
                seen.add(id(path.build))
        return out

    def run(
        self,
        policy: Policy,
        topology: Topology,
        tasks: Sequence[Any],
        budget: Budget | None = None,
    ) -> EngineResult:
        """Build trees for ``tasks`` (cycled while a budget remains, else one tree each)."""
        if not tasks:
            raise ValueError("tasks must not be empty")
        if topology.root_branches < 1:
            raise ValueError("the root needs at least one branch")
        self._policy = policy
        self._topology = topology
        self._min_root_lines = min(2, topology.root_branches)
        self._meter = meter = ComputeMeter()
        self._failures: list[FailureRecord] = []
        self._done: list[TreeBuild] = []
        start = time.perf_counter()
        task_iter: Iterable[Any] = itertools.cycle(tasks) if budget is not None else iter(tasks)
        trees: list[RolloutTree] = []
        entropies: list[float] = []
        ready: list[PathState] = []  # paths that hold an env
        waiting: deque[PathState] = deque()  # forked siblings (and failed paths) waiting for an env
        in_flight = 0
        tasks_left = True
        builds: list[TreeBuild] = []

        while True:
            self._attach_waiting(waiting, ready)
            in_flight -= self._finish_done(trees, waiting)
            while (
                tasks_left
                and in_flight < self.max_parallel_trees
                and self.pool.n_free > 0
                and all(self._pinned(p) for p in waiting)
                and self._budget_allows(budget, meter, start, builds)
            ):
                task = next(task_iter, _DONE)
                if task is _DONE:
                    tasks_left = False
                    break
                path = self._start_tree(task, trees, builds)
                if path is not None:
                    ready.append(path)
                    in_flight += 1
            if not ready:
                if waiting:
                    raise EnvFailureError(
                        f"{len(waiting)} path(s) wait for an env but the pool has none left "
                        f"({len(self.pool)} slot(s), all lent or lost to failures)"
                    )
                break
            self._advance(ready, topology, waiting, entropies)
            in_flight -= self._finish_done(trees, waiting)
            ready = [p for p in ready if p.env is not None]

        meter.seconds = time.perf_counter() - start
        return EngineResult(trees, meter, entropies, self._failures)

    def _finish_done(self, trees: list[RolloutTree], waiting: deque[PathState]) -> int:
        """Finalize the trees whose last path ended (unless the topology grows them again);
        returns how many."""
        done, self._done = self._done, []
        finished = 0
        for build in done:
            if not build.dropped and self._expand(build, waiting):
                continue
            finished += 1
            tree = build.tree
            build.tree.compute.seconds = time.perf_counter() - build.started
            build.finished = True
            for shared in list(build.snapshots.values()):
                shared.snapshot.release()
            build.snapshots.clear()
            lines = len(tree.root.children)
            if build.dropped or lines < self._min_root_lines:
                lost = sum(_line_edges(e) for e in tree.root.children)
                tree.root.children.clear()
                self._count_drop(build, lost)
                trees.remove(tree)
                self._failures.append(FailureRecord(tree.task_id, 0, "tree", f"{lines} root line(s) left", "tree dropped"))
                logger.warning("dropped the tree of task %r: %d root line(s) left after failures", tree.task_id, lines)
                continue
            tree.finalize()
        return finished

    def _expand(self, build: TreeBuild, waiting: deque[PathState]) -> bool:
        """Queue the topology's expansions of ``build``'s finished tree; True if any."""
        hook = getattr(self._topology, "expansions", None)
        if hook is None:
            return False
        nodes = list(hook(build.tree, build.expansion_round))
        build.expansion_round += 1
        for node in nodes:
            if node.is_leaf:
                raise ValueError("an expansion node must be a decision point, not a leaf")
            node.branch_factor = max(node.branch_factor, len(node.children)) + 1
            waiting.append(PathState(build, node, rebuild=True))
        build.open_paths += len(nodes)
        return bool(nodes)

    @staticmethod
    def _budget_allows(budget: Budget | None, meter: ComputeMeter, start: float, builds: list[TreeBuild]) -> bool:
        """Start another tree when the batch is expected to end closer to the budget with it.

        Spent so far plus the expected remainder of the trees in flight (the mean cost of the
        trees finished in this batch) plus half a tree must fit in the budget; before any tree
        has finished, only what is already spent counts.
        """
        if budget is None or not builds:
            return True
        now = time.perf_counter()
        spent = now - start if budget.unit == "seconds" else meter.get(budget.unit)

        def cost(build: TreeBuild) -> float:
            if budget.unit == "seconds":
                return build.tree.compute.seconds if build.finished else now - build.started
            return build.tree.compute.get(budget.unit)

        done = [cost(b) for b in builds if b.finished]
        if not done:
            return spent < budget.amount
        expected = sum(done) / len(done)
        remaining = sum(max(expected - cost(b), 0.0) for b in builds if not b.finished)
        return spent + remaining + expected / 2 <= budget.amount

    def _start_tree(self, task: Any, trees: list[RolloutTree], builds: list[TreeBuild]) -> PathState | None:
        meter = self._meter
        seed = int(self._rng.integers(2**31 - 1))
        for attempt in range(self.retries + 1):
            env = self.pool.acquire()
            if env is None:
                break
            try:
                obs, info = env.reset(seed=seed, options={"task_id": task})
            except Exception as exc:  # noqa: BLE001 - an env failure, handled below
                meter.resets += 1
                outcome = "retried" if attempt < self.retries else "task skipped"
                self._record_failure(meter, None, task, 0, "reset", exc, outcome)
                self.pool.release(env, failed=True)
                continue
            meter.resets += 1
            context = Context(
                task_id=info.get("task_id", task),
                observation=obs,
                admissible_actions=admissible_of(info),
                initial_observation=obs,
            )
            tree = RolloutTree(task_id=context.task_id, root=Node(context=context, info=info))
            tree.compute.resets += 1
            trees.append(tree)
            build = TreeBuild(tree, open_paths=1, started=time.perf_counter(), task=task, seed=seed)
            builds.append(build)
            return PathState(build, tree.root, env=env, is_root=True)
        return None

    # ---- failures ------------------------------------------------------------------------
    def _record_failure(
        self, meter: ComputeMeter, tree: RolloutTree | None, task: Any, depth: int, stage: str, exc: BaseException, outcome: str
    ) -> None:
        meter.failures += 1
        if tree is not None:
            tree.compute.failures += 1
        self._failures.append(FailureRecord(task, depth, stage, f"{type(exc).__name__}: {exc}"[:500], outcome))
        logger.warning("env failure at %s (task %r, depth %d): %r -> %s", stage, task, depth, exc, outcome)
        if meter.failures > self.max_failures:
            raise EnvFailureError(
                f"{meter.failures} env failures in one batch (pool.max_failures={self.max_failures}); "
                f"the last, at {stage}: {type(exc).__name__}: {exc}"
            ) from exc

    def _fail(self, path: PathState, stage: str, exc: BaseException, waiting: deque[PathState]) -> None:
        """``path``'s env raised: retry the path on another env, or drop its line."""
        if path.env is not None:
            self.pool.release(path.env, failed=True)
            path.env = None
        self._consume_snapshot(path)
        path.attempts += 1
        retry = path.attempts <= self.retries and not isinstance(exc, ReplayMismatchError)
        tree = path.build.tree
        self._record_failure(self._meter, tree, tree.task_id, path.node.depth, stage, exc, "retried" if retry else "dropped")
        if retry:
            path.rebuild = True
            waiting.append(path)
        else:
            self._drop(path)

    def _drop(self, path: PathState) -> None:
        """Remove ``path``'s line (see the module docstring) and close the path."""
        build = path.build
        node, edge = path.node, None
        lost = 0
        while True:
            while node.branch_factor <= 1 and node.parent is not None:
                edge = node.parent
                node = edge.parent
            if edge is not None:
                node.children.remove(edge)
                lost += _line_edges(edge)
            node.branch_factor -= 1
            if node.branch_factor > 0:
                break
            if node.parent is None:  # the root lost every line
                build.dropped = True
                break
            edge = None
        if node.parent is None and node.branch_factor < self._min_root_lines:
            build.dropped = True
        self._count_drop(build, lost)
        self._close_path(path)

    def _count_drop(self, build: TreeBuild, steps: int) -> None:
        self._meter.dropped_steps += steps
        build.tree.compute.dropped_steps += steps

    def _close_path(self, path: PathState) -> None:
        path.build.open_paths -= 1
        if path.build.open_paths == 0:
            self._done.append(path.build)

    def _consume_snapshot(self, path: PathState) -> None:
        shared, path.snapshot = path.snapshot, None
        if shared is None:
            return
        shared.pending -= 1
        if shared.pending == 0:
            path.build.snapshots.pop(id(shared.node), None)
            shared.snapshot.release()

    def _rebuild(self, path: PathState, env: gym.Env) -> None:
        """Bring ``env`` to ``path.node``: restore the nearest held snapshot above it (else reset
        with the tree's seed) and replay the recorded steps below it, checking each."""
        build, meter = path.build, self._meter
        tc = build.tree.compute
        below: list[Edge] = []
        node = path.node
        while True:
            shared = build.snapshots.get(id(node))
            if shared is not None:
                try:
                    bpo_envs.restore(env, shared.snapshot)
                except Exception:  # noqa: BLE001 - e.g. its actor died; try further up
                    logger.debug("rebuild: a held snapshot failed to restore", exc_info=True)
                else:
                    meter.restores += 1
                    tc.restores += 1
                    break
            if node.parent is None:
                obs, _ = env.reset(seed=build.seed, options={"task_id": build.task})
                meter.resets += 1
                tc.resets += 1
                if obs != node.context.observation:
                    raise ReplayMismatchError("reset with the tree's seed gave another observation")
                break
            below.append(node.parent)
            node = node.parent.parent
        for edge in reversed(below):
            obs, reward, terminated, truncated, _ = env.step(edge.action.command)
            meter.env_steps += 1
            tc.env_steps += 1
            if (obs, float(reward), bool(terminated), bool(truncated)) != (
                edge.child.context.observation, edge.reward, edge.terminated, edge.truncated
            ):
                raise ReplayMismatchError(f"replaying {edge.action.command!r} gave another transition")

    def _pinned(self, path: PathState) -> bool:
        """Whether ``path`` should wait for the (busy) env that holds its snapshot.

        Envs whose class sets ``restore_prefers_origin = True`` restore their own snapshots
        natively and others' by a slow rebuild (ALFWorld: 0.01 ms vs 0.1-0.4 s), so a sibling
        waits for the origin env to come free rather than moving. Root snapshots (the reset state)
        are cheap to rebuild anywhere and are never pinned, so groups still spread over the pool.
        """
        shared = path.snapshot
        if shared is None or path.rebuild or shared.node.parent is None or not self.pool.is_lent(shared.origin):
            return False
        owner = getattr(shared.origin, "unwrapped", shared.origin)
        return bool(getattr(owner, "restore_prefers_origin", False))

    def _attach_waiting(self, waiting: deque[PathState], ready: list[PathState]) -> None:
        meter = self._meter
        while waiting and self.pool.n_free > 0:
            # prefer a sibling whose snapshot was taken on a free env (no state moves); leave
            # pinned ones (their env restores its own snapshots far faster) for their origin
            pick = next(
                (i for i, p in enumerate(waiting) if p.snapshot and self.pool.is_free(p.snapshot.origin)),
                None,
            )
            if pick is None:
                pick = next((i for i, p in enumerate(waiting) if not self._pinned(p)), None)
            if pick is None:
                break
            path = waiting[pick]
            del waiting[pick]
            shared = path.snapshot
            env = self.pool.acquire(prefer=shared.origin if shared is not None else None)
            assert env is not None
            path.env = env
            if shared is not None and not path.rebuild:
                try:
                    bpo_envs.restore(env, shared.snapshot)
                except Exception as exc:  # noqa: BLE001 - an env failure
                    self._fail(path, "restore", exc, waiting)
                    continue
                meter.restores += 1
                path.build.tree.compute.restores += 1
                self._consume_snapshot(path)
            else:
                try:
                    self._rebuild(path, env)
                except Exception as exc:  # noqa: BLE001 - an env failure
                    self._fail(path, "rebuild", exc, waiting)
                    continue
                path.rebuild = False
            ready.append(path)

    def _advance(
        self,
        ready: list[PathState],
        topology: Topology,
        waiting: deque[PathState],
        entropies: list[float],
    ) -> None:
        """One step for every ready path (finished trees go to ``self._done``)."""
        meter = self._meter
        deciding = [p for p in ready if p.pending is None]
        # rule 1: entropy (and so the branch decision) before any action is sampled here
        need_h = [p for p in deciding if not p.is_root and topology.wants_entropy(p)]
        if need_h:
            values = self._call(meter, need_h, lambda: self._policy.decision_entropy([p.context for p in need_h]))
            for path, h in zip(need_h, values, strict=True):
                path.node.entropy = float(h)
                entropies.append(float(h))
        groups: dict[int, list[PathState]] = {}
        for path in deciding:
            n = topology.root_branches if path.is_root else topology.fork_count(path, path.node.entropy)
            if n < 1:
                raise ValueError(f"branch factor must be >= 1, got {n}")
            groups.setdefault(n, []).append(path)
        for n, paths in groups.items():
            samples = self._call(meter, paths, lambda paths=paths, n=n: self._policy.sample([p.context for p in paths], n))
            for path, actions in zip(paths, samples, strict=True):
                if len(actions) != n:
                    raise RuntimeError(f"policy returned {len(actions)} samples, asked for {n}")
                tc = path.build.tree.compute
                tokens = sum(len(a.token_ids) for a in actions)
                meter.gen_tokens += tokens
                tc.gen_tokens += tokens
                path.pending = actions[0]
                if n > 1:
                    self._fork(path, actions, waiting)

        stepping = [p for p in ready if p.env is not None]
        actions = [p.pending for p in stepping]
        results = self.pool.step_many([p.env for p in stepping], [a.command for a in actions])
        for path, action, result in zip(stepping, actions, results, strict=True):
            if isinstance(result, BaseException):
                self._fail(path, "step", result, waiting)  # path.pending stays: retried as is
                continue
            path.pending = None
            if self._record(path, action, result, meter):
                self.pool.release(path.env)
                path.env = None
                self._close_path(path)

    def _fork(self, path: PathState, actions: list[Action], waiting: deque[PathState]) -> None:
        meter = self._meter
        node = path.node
        node.branch_factor = len(actions)
        try:
            snap = bpo_envs.snapshot(path.env)
        except Exception as exc:  # noqa: BLE001 - siblings are then rebuilt by replay
            snap, error = None, exc
        else:
            meter.snapshots += 1
            path.build.tree.compute.snapshots += 1
        shared = None
        if snap is not None:
            shared = _SharedSnapshot(snap, path.env, pending=len(actions) - 1, node=node)
            path.build.snapshots[id(node)] = shared
        sibling_level = path.level if path.is_root else path.level + 1
        for action in actions[1:]:
            waiting.append(
                PathState(path.build, node, level=sibling_level, snapshot=shared, pending=action, rebuild=shared is None)
            )
        path.build.open_paths += len(actions) - 1
        if not path.is_root:
            path.branch_points += 1
        if snap is None:
            self._fail(path, "snapshot", error, waiting)

    def _record(self, path: PathState, action: Action, result: StepResult, meter: ComputeMeter) -> bool:
        """Add the step's edge to the tree; True when the path's episode ended."""
        obs, reward, terminated, truncated, info = result
        meter.env_steps += 1
        tc = path.build.tree.compute
        tc.env_steps += 1
        node = path.node
        child = Node(
            context=node.context.child(action.command, obs, admissible_of(info)),
            info=info,
            depth=node.depth + 1,
        )
        edge = Edge(node, child, action, float(reward), bool(terminated), bool(truncated), info)
        child.parent = edge
        node.children.append(edge)
        path.node = child
        path.is_root = False
        if terminated or truncated:
            meter.leaves += 1
            tc.leaves += 1
            return True
        if getattr(self._topology, "snapshot_nodes", False):
            try:
                snap = bpo_envs.snapshot(path.env)
            except Exception:  # noqa: BLE001 - an expansion from here then rebuilds by replay
                logger.warning("snapshot of a node for later expansion failed", exc_info=True)
            else:
                meter.snapshots += 1
                tc.snapshots += 1
                path.build.snapshots[id(child)] = _SharedSnapshot(snap, path.env, pending=0, node=child)
        return False


_DONE = object()



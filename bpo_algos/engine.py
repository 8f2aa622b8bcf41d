"""One rollout engine for every algorithm: builds a :class:`RolloutTree` per task.

The algorithm supplies the *topology* (:class:`Topology`): how many i.i.d. actions the root
gets (``N`` or ``K0``) and, for every other decision point, whether to ask the policy for its
decision entropy and how many actions to sample there given that entropy. The engine:

1. resets an env of the pool on the task, then repeatedly, for every path that holds an env:
2. asks ``policy.decision_entropy`` for the paths the topology wants it for (before any
   sampling: DESIGN.md rule 1), lets the topology choose ``n`` per path;
3. samples ``n`` i.i.d. actions per path (one batched ``policy.sample`` call per distinct
   ``n``; rule 2: never deduplicated);
4. where ``n > 1``, snapshots the env (a branch node) and queues ``n - 1`` sibling paths, each
   carrying its already-sampled action and the snapshot; the path itself continues with the
   first sample, so the backbone's own action is one of the siblings;
5. steps the envs; a finished path frees its env, onto which a queued sibling is restored
   (preferring the env that took its snapshot).

Trees in flight at once are bounded by ``max_parallel_trees``; a new tree starts only while the
budget is not spent, and a tree in progress is always finished (cutting it would bias the
estimate).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

import bpo_envs
from bpo_algos.compute import Budget, ComputeMeter
from bpo_algos.policy.base import Action, Context, Policy
from bpo_algos.tree import Edge, Node, RolloutTree

EnvFn = Callable[[], gym.Env]
StepResult = tuple[Any, float, bool, bool, dict[str, Any]]


class EnvPool:
    """Envs made lazily from ``env_fns``, lent to paths one at a time.

    ``workers > 1`` steps the lent envs in a thread pool (worth it when a step waits on a
    subprocess or a container, as SWE-bench commands do); the default steps them in turn.
    A distributed pool implements the same methods.
    """

    def __init__(self, env_fns: Sequence[EnvFn], *, workers: int = 1) -> None:
        if not env_fns:
            raise ValueError("env_fns must hold at least one env factory")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        self.workers = workers
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

    def release(self, env: gym.Env) -> None:
        slot = self._index[id(env)]
        if slot in self._free:
            raise RuntimeError("env released twice")
        self._free.append(slot)

    def step_many(self, envs: Sequence[gym.Env], actions: Sequence[str]) -> list[StepResult]:
        """``env.step(action)`` for each pair, in order of the inputs."""
        if self.workers == 1 or len(envs) < 2:
            return [env.step(action) for env, action in zip(envs, actions, strict=True)]
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="bpo-env")
        return list(self._executor.map(lambda pair: pair[0].step(pair[1]), zip(envs, actions, strict=True)))

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


class Topology(Protocol):
    """Where a tree branches: the algorithm's side of the engine."""

    root_branches: int

    def wants_entropy(self, path: PathState) -> bool:
        """Whether the branch decision at this path's current node needs the entropy."""
        ...

    def fork_count(self, path: PathState, entropy: float | None) -> int:
        """How many i.i.d. actions to sample here (1 = no branch). Must not look at actions."""
        ...


@dataclass(eq=False)
class _SharedSnapshot:
    snapshot: bpo_envs.Snapshot
    origin: gym.Env
    pending: int


@dataclass(eq=False)
class TreeBuild:
    tree: RolloutTree
    open_paths: int = 0
    started: float = 0.0
    finished: bool = False


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

    @property
    def context(self) -> Context:
        return self.node.context


@dataclass
class EngineResult:
    trees: list[RolloutTree]
    compute: ComputeMeter
    entropies: list[float] = field(default_factory=list)


def _policy_usage(policy: Policy) -> ComputeMeter:
    meter = getattr(policy, "meter", None)
    return meter.copy() if isinstance(meter, ComputeMeter) else ComputeMeter()


class RolloutEngine:
    """Builds rollout trees through an :class:`EnvPool` (see the module docstring)."""

    def __init__(self, pool: EnvPool, *, max_parallel_trees: int | None = None, seed: int = 0) -> None:
        self.pool = pool
        self.max_parallel_trees = max_parallel_trees or len(pool)
        if self.max_parallel_trees < 1:
            raise ValueError(f"max_parallel_trees must be >= 1, got {max_parallel_trees}")
        self._rng = np.random.default_rng(seed)

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
        meter = ComputeMeter()
        start = time.perf_counter()
        task_iter: Iterable[Any] = itertools.cycle(tasks) if budget is not None else iter(tasks)
        trees: list[RolloutTree] = []
        entropies: list[float] = []
        ready: list[PathState] = []  # paths that hold an env
        waiting: deque[PathState] = deque()  # forked siblings waiting for an env
        in_flight = 0
        tasks_left = True
        builds: list[TreeBuild] = []

        while True:
            self._attach_waiting(waiting, ready, meter)
            while (
                tasks_left
                and in_flight < self.max_parallel_trees
                and self.pool.n_free > 0
                and not waiting
                and self._budget_allows(budget, meter, start, builds)
            ):
                task = next(task_iter, _DONE)
                if task is _DONE:
                    tasks_left = False
                    break
                ready.append(self._start_tree(task, meter, trees, builds))
                in_flight += 1
            if not ready:
                if waiting:
                    raise RuntimeError("paths wait for an env but none is free")  # pragma: no cover
                break
            finished = self._advance(ready, topology, waiting, meter, entropies)
            for build in finished:
                build.tree.finalize()
                build.tree.compute.seconds = time.perf_counter() - build.started
                build.finished = True
                in_flight -= 1
            ready = [p for p in ready if p.env is not None]

        meter.seconds = time.perf_counter() - start
        return EngineResult(trees, meter, entropies)

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

    def _start_tree(
        self, task: Any, meter: ComputeMeter, trees: list[RolloutTree], builds: list[TreeBuild]
    ) -> PathState:
        env = self.pool.acquire()
        assert env is not None
        seed = int(self._rng.integers(2**31 - 1))
        obs, info = env.reset(seed=seed, options={"task_id": task})
        meter.resets += 1
        context = Context(
            task_id=info.get("task_id", task),
            observation=obs,
            admissible_actions=_admissible(info),
            initial_observation=obs,
        )
        tree = RolloutTree(task_id=context.task_id, root=Node(context=context, info=info))
        tree.compute.resets += 1
        trees.append(tree)
        build = TreeBuild(tree, open_paths=1, started=time.perf_counter())
        builds.append(build)
        return PathState(build, tree.root, env=env, is_root=True)

    def _attach_waiting(self, waiting: deque[PathState], ready: list[PathState], meter: ComputeMeter) -> None:
        while waiting and self.pool.n_free > 0:
            # prefer a sibling whose snapshot was taken on a free env (no state moves)
            pick = next(
                (i for i, p in enumerate(waiting) if p.snapshot and self.pool.is_free(p.snapshot.origin)),
                0,
            )
            path = waiting[pick]
            del waiting[pick]
            shared = path.snapshot
            assert shared is not None
            env = self.pool.acquire(prefer=shared.origin)
            assert env is not None
            bpo_envs.restore(env, shared.snapshot)
            meter.restores += 1
            path.build.tree.compute.restores += 1
            shared.pending -= 1
            if shared.pending == 0:
                shared.snapshot.release()
            path.env, path.snapshot = env, None
            ready.append(path)

    def _advance(
        self,
        ready: list[PathState],
        topology: Topology,
        waiting: deque[PathState],
        meter: ComputeMeter,
        entropies: list[float],
    ) -> list[TreeBuild]:
        """One step for every ready path. Returns the trees that finished."""
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
        chosen: dict[int, Action] = {}
        for n, paths in groups.items():
            samples = self._call(meter, paths, lambda paths=paths, n=n: self._policy.sample([p.context for p in paths], n))
            for path, actions in zip(paths, samples, strict=True):
                if len(actions) != n:
                    raise RuntimeError(f"policy returned {len(actions)} samples, asked for {n}")
                tc = path.build.tree.compute
                tokens = sum(len(a.token_ids) for a in actions)
                meter.gen_tokens += tokens
                tc.gen_tokens += tokens
                if n > 1:
                    self._fork(path, actions, waiting, meter)
                chosen[id(path)] = actions[0]
        for path in ready:
            if path.pending is not None:
                chosen[id(path)] = path.pending
                path.pending = None

        finished: list[TreeBuild] = []
        actions = [chosen[id(path)] for path in ready]
        results = self.pool.step_many([p.env for p in ready], [a.command for a in actions])
        for path, action, result in zip(ready, actions, results, strict=True):
            if self._record(path, action, result, meter):
                self.pool.release(path.env)
                path.env = None
                path.build.open_paths -= 1
                if path.build.open_paths == 0:
                    finished.append(path.build)
        return finished

    def _fork(self, path: PathState, actions: list[Action], waiting: deque[PathState], meter: ComputeMeter) -> None:
        node = path.node
        node.branch_factor = len(actions)
        snap = bpo_envs.snapshot(path.env)
        meter.snapshots += 1
        path.build.tree.compute.snapshots += 1
        shared = _SharedSnapshot(snap, path.env, pending=len(actions) - 1)
        sibling_level = path.level if path.is_root else path.level + 1
        for action in actions[1:]:
            waiting.append(
                PathState(path.build, node, level=sibling_level, snapshot=shared, pending=action)
            )
        path.build.open_paths += len(actions) - 1
        if not path.is_root:
            path.branch_points += 1

    def _record(self, path: PathState, action: Action, result: StepResult, meter: ComputeMeter) -> bool:
        """Add the step's edge to the tree; True when the path's episode ended."""
        obs, reward, terminated, truncated, info = result
        meter.env_steps += 1
        tc = path.build.tree.compute
        tc.env_steps += 1
        node = path.node
        child = Node(
            context=node.context.child(action.command, obs, _admissible(info)),
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
        return False


_DONE = object()


def _admissible(info: dict[str, Any]) -> tuple[str, ...] | None:
    actions = info.get("admissible_actions")
    return tuple(actions) if actions is not None else None

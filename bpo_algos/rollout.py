"""One rollout engine for every algorithm: builds a :class:`RolloutTree` per task.

The algorithm supplies the *topology* (:class:`Topology`): how many i.i.d. actions the root
gets (``N`` or ``K0``) and, for every other decision point, whether to ask the policy for its
decision entropy and how many actions to sample there given that entropy. The engine:

1. resets an env of the pool on the task, then repeatedly, for every path that holds an env:
2. opens one policy pass over every path that decides at this step, of every tree in flight
   (``policy.shared_pass``: the calls below read it; docs/algorithms.md), asks
   ``policy.decision_entropy`` for the paths the topology wants it for (before any
   sampling: docs/unbiasedness.md, rule 1), lets the topology choose ``n`` per path;
3. samples ``n`` i.i.d. actions per path (one batched ``policy.sample`` call per distinct
   ``n``; rule 2: never deduplicated), or, where the topology ``draws_distinct`` there, up to
   ``n`` different ones (``policy.sample_distinct``; rule 7);
4. where ``n > 1``, snapshots the env (a branch node) and queues ``n - 1`` sibling paths, each
   carrying its already-sampled action and the snapshot; the path itself continues with the
   first sample, so the backbone's own action is one of the siblings;
5. steps the envs (``pool.step_many``: in this thread for envs that declare
   ``step_may_block = False``, on the pool's threads under its deadline for the others); a
   finished path frees its env, onto which a queued sibling is restored (preferring the env
   that took its snapshot);
6. when a tree's last path ends, the topology's ``expansions`` hook (Tree-GRPO) may name
   nodes of the finished tree to grow again: each gets a fresh path from that node (one new
   i.i.d. action, rolled to the end), its env brought there by restoring the node's snapshot
   (a topology with ``snapshot_nodes = True`` has one taken at every decision node) or else by
   a rebuild (:mod:`bpo_algos.recovery`); the tree is finalized when the hook names no more
   nodes.

**One seeding rule.** Every tree's randomness is its own stream, keyed by the engine's seed and
the tree's index in the batch (:func:`~bpo_algos.paths.path_stream`): its reset seed, and for
each of its paths a stream of its own from which the path draws its tie-breaks and its sampled
actions (``policy.sample(contexts, n, rngs=...)``: one generator per context). Policy calls stay
batched over every path in flight, yet a tree is the same whether it is built alone, among 16
others, or on another data-parallel rank (the trainer gives each rank the tree indices it
builds: ``tree_indices``); its edges are ordered by the paths' keys, not by who stepped first.
Tree ``i`` is built on task ``tasks[i % len(tasks)]``; a
topology with ``trees_per_task = m`` (Tree-GRPO) builds ``m`` trees per index.

Trees in flight at once are bounded by ``max_parallel_trees``. Under a :class:`Budget` a new
tree starts only while the batch is expected to end closer to the budget with it
(:func:`~bpo_algos.compute.should_start`), every started tree counted at its expected cost: the
mean cost of the previous batch's trees and of this batch's finished ones, or, before any
tree's cost is known, the topology's prior (root branches x the env's step limit for a tree
that does not branch below the root); in a unit no prior covers, trees start one at a time
until one has finished. A tree in progress is always finished (cutting it would bias the
estimate). The schedule (which paths step together, in which order the policy sees them)
depends only on the pool's free-slot bookkeeping, so two pools with the same number of envs
and the same ``acquire``/``release`` semantics (:class:`~bpo_envs.pool.EnvPool` and
:class:`bpo_envs.ray_pool.RayEnvPool`) give the same batch for the same seeds.

Every cost lands in the batch meter and in the meter of the tree it served
(:class:`~bpo_algos.compute.ComputeMeter`): env steps (replays by ``ReplaySnapshot`` restores
included, read with :func:`bpo_envs.replayed_steps`), tokens the policy reports (generation,
prefill, scoring), the tokens the learner will train on for each recorded step
(``train_tokens``, the policy's :meth:`~bpo_algos.policy.base.Policy.train_tokens`), their
``flops`` (:func:`~bpo_algos.compute.cost_flops`), and the policy's and the env's time.

Env failures are retried, rebuilt or dropped by :class:`~bpo_algos.recovery.FailureHandler`
(see :mod:`bpo_algos.recovery` for what that does to the estimate).

Reading guide: ``# ALGO LOGIC: ...`` / ``# end ALGO LOGIC`` banners mark the algorithms' own
rules (which task a tree is on, where to branch and how many siblings, how siblings are
sampled and continued, the tree's edges and weights, Tree-GRPO's expansions); everything else
is metering, scheduling and failure recovery, which never changes what is estimated.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

import bpo_envs
from bpo_algos.compute import Budget, ComputeMeter, cost_flops, should_start
from bpo_algos.paths import PathState, SharedSnapshot, TreeBuild, path_stream
from bpo_algos.policy.base import Action, Context, Policy, admissible_of
from bpo_algos.recovery import EnvFailureError, FailureHandler, FailureRecord, ReplayMismatchError
from bpo_algos.tree import Edge, Node, RolloutTree
from bpo_envs.pool import EnvFn, EnvPool, StepResult

logger = logging.getLogger(__name__)

__all__ = [
    "EngineResult",
    "EngineRun",
    "EnvFailureError",
    "EnvFn",
    "EnvPool",
    "FailureRecord",
    "PathState",
    "ReplayMismatchError",
    "RolloutEngine",
    "StepResult",
    "Topology",
    "TreeBuild",
    "run_together",
]


class Topology:
    """Where a tree branches: everything the engine asks the algorithm, each with its default
    (one path from the root, no branching). :class:`~bpo_algos.algorithm.Algorithm` subclasses it.
    """

    root_branches: int = 1
    """I.i.d. actions sampled at the root (``N`` or ``K0``)."""
    trees_per_task: int = 1
    """Trees the engine builds per task index (Tree-GRPO: ``m``)."""
    snapshot_nodes: bool = False
    """Snapshot every decision node while its tree is open (for :meth:`expansions`)."""

    def wants_entropy(self, path: PathState) -> bool:
        """Whether the branch decision at this path's current node needs the entropy."""
        return False

    def fork_count(self, path: PathState, entropy: float | None) -> int:
        """How many i.i.d. actions to sample here (1 = no branch). Must not look at actions."""
        return 1

    def draws_distinct(self, path: PathState) -> bool:
        """Whether the ``n > 1`` actions at this path's current node are drawn without
        replacement (``policy.sample_distinct``: at most ``n``, all different; docs/unbiasedness.md,
        rule 7) rather than i.i.d. Asked only where ``n > 1``."""
        return False

    def expansions(self, tree: RolloutTree, round: int) -> Sequence[Node]:
        """Nodes of the finished ``tree`` to grow by one more path each (called with round 0, 1,
        ... until it names none); by default none."""
        return ()

    def tree_prior(self, step_limit: int) -> dict[str, float]:
        """A tree's expected cost in some units before any tree has been measured (the budget's
        start rule); by default the root's branches each run to the step limit and nothing
        else branches."""
        k = self.root_branches
        return {"env_steps": float(k * step_limit), "leaves": float(k)}


@dataclass
class EngineResult:
    trees: list[RolloutTree]
    """The finished trees, by index."""
    compute: ComputeMeter
    entropies: list[float] = field(default_factory=list)
    """The decision entropies computed, tree by tree (in index order)."""
    failures: list[FailureRecord] = field(default_factory=list)


def tree_entropies(tree: RolloutTree) -> list[float]:
    """The decision entropies computed in ``tree``, in a fixed (depth-first) order."""
    return [node.entropy for node in tree.nodes() if node.entropy is not None]


def _shares(total: int, weights: Sequence[int]) -> list[int]:
    """``total`` split in proportion to ``weights`` (integers summing to ``total``; the rounding
    remainder to the first; evenly where the weights are all zero)."""
    if not weights:
        return []
    if sum(weights) <= 0:
        weights = [1] * len(weights)
    shares = [total * w // sum(weights) for w in weights]
    shares[0] += total - sum(shares)
    return shares


_DONE = object()
_TOKEN_FIELDS = ("prefill_tokens", "gen_tokens", "score_tokens", "train_tokens")


class RolloutEngine:
    """Builds rollout trees through an :class:`~bpo_envs.pool.EnvPool` (see the module docstring)."""

    def __init__(self, pool: EnvPool, *, max_parallel_trees: int | None = None, seed: int = 0) -> None:
        self.pool = pool
        self.max_parallel_trees = max_parallel_trees or len(pool)
        if self.max_parallel_trees < 1:
            raise ValueError(f"max_parallel_trees must be >= 1, got {max_parallel_trees}")
        self.seed = int(seed)
        self._seeds: list[int] | None = None  # a run's per-tree seeds (run's seeds=)
        self.retries = pool.retries
        self.max_failures = pool.max_failures

    def run(
        self,
        policy: Policy,
        topology: Topology,
        tasks: Sequence[Any],
        budget: Budget | None = None,
        prior_costs: Sequence[float] | None = None,
        *,
        tree_indices: Iterable[int] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> EngineResult:
        """Build trees for ``tasks``: tree ``i`` on ``tasks[i % len(tasks)]``, for ``i`` in
        ``tree_indices`` (default: ``0 .. len(tasks) - 1``, or ``0, 1, 2, ...`` while a budget
        remains), each with its own random stream (see the module docstring).

        ``prior_costs``: the cost, in the budget's unit, of each tree of an earlier batch (the
        start rule's estimate of a tree not yet finished; see the module docstring).

        ``seeds``: one seed per task; tree ``i`` then draws from the streams of tree 0 of an
        engine seeded ``seeds[i]`` instead of tree ``i`` of this engine's, so it equals the tree
        such an engine builds alone (evaluation episodes, each on its own seed, run in one
        batch this way). Only without a budget, ``tree_indices`` or several trees per task.
        """
        steps = self.steps(policy, topology, tasks, budget, prior_costs, tree_indices=tree_indices, seeds=seeds)
        while True:
            try:
                next(steps)
            except StopIteration as stop:
                return stop.value

    def steps(
        self,
        policy: Policy,
        topology: Topology,
        tasks: Sequence[Any],
        budget: Budget | None = None,
        prior_costs: Sequence[float] | None = None,
        *,
        tree_indices: Iterable[int] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> Generator[list[Context], None, EngineResult]:
        """:meth:`run` one engine step at a time: yields,
        before each step, the contexts of the paths that decide in it (a caller may open one
        ``policy.shared_pass`` over them and other engines' before resuming it:
        :func:`run_together`); returns the :class:`EngineResult`."""
        if not tasks:
            raise ValueError("tasks must not be empty")
        if topology.root_branches < 1:
            raise ValueError("the root needs at least one branch")
        if seeds is not None:
            if len(seeds) != len(tasks):
                raise ValueError(f"{len(seeds)} seeds for {len(tasks)} tasks")
            if budget is not None or tree_indices is not None or topology.trees_per_task != 1:
                raise ValueError("seeds= builds one tree per task: no budget, tree_indices or trees_per_task > 1")
        self._seeds = None if seeds is None else [int(s) for s in seeds]
        self._begin(policy, topology, prior_costs)
        meter, start = self._meter, self._start
        if tree_indices is None:
            tree_indices = itertools.count() if budget is not None else range(len(tasks))
        # ALGO LOGIC: which task each tree is on
        per_task = topology.trees_per_task
        # (tree index, task): the m trees of an index j*m .. j*m + m - 1, all on task j
        task_iter = ((i * per_task + k, tasks[i % len(tasks)]) for i in tree_indices for k in range(per_task))
        # end ALGO LOGIC
        trees: list[RolloutTree] = []
        builds: list[TreeBuild] = []
        entropies: list[float] = []
        ready: list[PathState] = []  # paths that hold an env
        waiting: deque[PathState] = deque()  # forked siblings (and failed paths) waiting for an env
        in_flight = 0
        tasks_left = True

        while True:
            self._attach_waiting(waiting, ready)
            in_flight -= self._finish_done(trees, waiting)
            while (
                tasks_left
                and in_flight < self.max_parallel_trees
                and self.pool.n_free > 0
                and all(self._pinned(p) for p in waiting)
                and self._budget_allows(budget, builds)
            ):
                item = next(task_iter, _DONE)
                if item is _DONE:
                    tasks_left = False
                    break
                path = self._start_tree(*item, trees, builds)
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
            yield [p.context for p in ready if p.pending is None]
            self._advance(ready, waiting, entropies)
            in_flight -= self._finish_done(trees, waiting)
            ready = [p for p in ready if p.env is not None]

        meter.seconds = time.perf_counter() - start
        trees.sort(key=lambda t: t.index)
        return EngineResult(trees, meter, [h for t in trees for h in tree_entropies(t)], self._failures.records)

    def _begin(self, policy: Policy, topology: Topology, prior_costs: Sequence[float] | None) -> None:
        """A run's state: the policy and topology, a fresh meter, the failure handler."""
        self._policy = policy
        self._params = policy.flops_parameters()
        self._topology = topology
        self._meter = ComputeMeter()
        self._done: list[TreeBuild] = []
        self._failures = FailureHandler(
            self.pool,
            self._meter,
            charge=self._charge,
            restore=self._restore,
            done=self._done,
            min_root_lines=min(2, topology.root_branches),
        )
        self._prior_costs = [float(c) for c in prior_costs or ()]
        self._static_prior: dict[str, float] | None = None
        self._start = time.perf_counter()

    # ---- the budget's start rule ----------------------------------------------------------
    def _budget_allows(self, budget: Budget | None, builds: list[TreeBuild]) -> bool:
        """Whether to start another tree (see :func:`~bpo_algos.compute.should_start`)."""
        if budget is None or not builds:
            return True  # a batch has at least one tree
        unit = budget.unit
        spent = time.perf_counter() - self._start if unit == "seconds" else self._meter.get(unit)
        open_costs = [b.tree.compute.get(unit) for b in builds if not b.finished]
        # the previous batch's trees and this batch's finished ones (which lean cheap: they
        # finished first; the open trees' conditional costs make up for it)
        known = self._prior_costs + [b.tree.compute.get(unit) for b in builds if b.finished]
        if not known:
            prior = (self._static_prior or {}).get(unit)
            if prior is None:  # no estimate yet: one tree at a time until one finishes
                return not open_costs and spent < budget.amount
            known = [prior]
        return should_start(budget.amount, spent, open_costs, known)

    def _tree_prior(self, env: gym.Env) -> dict[str, float]:
        """A tree's expected cost before any was measured (see :class:`Topology`)."""
        owner = bpo_envs.declared(env)  # None for an env that is not ours: no declared limit
        limit = owner.max_episode_steps if owner is not None else None
        if not isinstance(limit, int | np.integer) or limit < 1:
            return {}
        return dict(self._topology.tree_prior(int(limit)))

    # ---- metering -----------------------------------------------------------------------
    def _charge(self, build: TreeBuild, **amounts: float) -> None:
        """Add ``amounts`` to the batch meter and to ``build``'s tree meter (with the flops of the
        tokens among them)."""
        tokens = {k: v for k, v in amounts.items() if k in _TOKEN_FIELDS}
        if tokens:
            amounts = {**amounts, "flops": amounts.get("flops", 0.0) + cost_flops(self._params, **tokens)}
        for meter in (self._meter, build.tree.compute):  # only the fields charged (x + 0 == x)
            for unit, amount in amounts.items():
                setattr(meter, unit, getattr(meter, unit) + amount)

    def _restore(self, build: TreeBuild, env: gym.Env, snap: Any) -> None:
        """Restore ``snap`` into ``env``, metering the restore and the steps it replayed."""
        replayed = bpo_envs.replayed_steps(env)
        try:
            bpo_envs.restore(env, snap)
        finally:
            replayed = bpo_envs.replayed_steps(env) - replayed
            self._charge(build, env_steps=replayed, replay_steps=replayed)
        self._charge(build, restores=1)

    def _call(self, paths: Sequence[PathState], fn: Callable[[], Any], generated: Callable[[Any], list[int]] | None = None) -> Any:
        """A policy call: the usage the policy metered (the engine counts no token itself) and
        the call's time, charged to the trees it served. Prefill and score tokens are shared
        evenly among ``paths``; generated tokens in proportion to ``generated(out)`` (each path's
        sampled tokens), so each tree gets exactly its own when the policy's count agrees."""
        # only the four fields a policy call moves are read (not a copy of the whole meter)
        policy_meter = self._policy.meter
        before = (policy_meter.policy_calls, policy_meter.prefill_tokens, policy_meter.score_tokens, policy_meter.gen_tokens)
        t0 = time.perf_counter()
        out = fn()
        elapsed = time.perf_counter() - t0
        policy_meter = self._policy.meter
        calls, prefill_tokens, score_tokens, gen_tokens = (
            policy_meter.policy_calls - before[0], policy_meter.prefill_tokens - before[1],
            policy_meter.score_tokens - before[2], policy_meter.gen_tokens - before[3])
        meter = self._meter
        meter.policy_calls += calls
        meter.prefill_tokens += prefill_tokens
        meter.score_tokens += score_tokens
        meter.gen_tokens += gen_tokens
        flops = cost_flops(self._params, prefill_tokens=prefill_tokens, score_tokens=score_tokens)
        meter.flops += flops + cost_flops(self._params, gen_tokens=gen_tokens)
        n = max(len(paths), 1)
        prefill, prefill_rest = divmod(prefill_tokens, n)
        score, score_rest = divmod(score_tokens, n)
        gen = _shares(gen_tokens, generated(out) if generated is not None else [1] * len(paths))
        seen: set[int] = set()
        for i, path in enumerate(paths):
            tc = path.build.tree.compute
            tc.prefill_tokens += prefill + (prefill_rest if i == 0 else 0)
            tc.score_tokens += score + (score_rest if i == 0 else 0)
            tc.flops += flops / n
            tc.gen_tokens += gen[i]
            tc.flops += cost_flops(self._params, gen_tokens=gen[i])
            tc.seconds += elapsed / n
            if id(path.build) not in seen:
                tc.policy_calls += 1
                seen.add(id(path.build))
        return out

    # ---- one step of every ready path ---------------------------------------------------
    def _advance(self, ready: list[PathState], waiting: deque[PathState], entropies: list[float]) -> None:
        """One step for every ready path (finished trees go to ``self._done``)."""
        deciding = [p for p in ready if p.pending is None]
        if deciding:
            with ExitStack() as scope:
                # one forward pass over every path that decides here, of every tree in flight;
                # the entropy and the samples below read it (Policy.shared_pass). It meters
                # nothing: the calls that read it meter their tokens and calls as before
                t0 = time.perf_counter()
                scope.enter_context(self._policy.shared_pass([p.context for p in deciding]))
                share = (time.perf_counter() - t0) / len(deciding)
                for path in deciding:
                    path.build.tree.compute.seconds += share
                self._decide(deciding, waiting, entropies)

        stepping = [p for p in ready if p.env is not None]
        actions = [p.pending for p in stepping]
        t0 = time.perf_counter()
        results = self.pool.step_many([p.env for p in stepping], [a.command for a in actions])
        share = (time.perf_counter() - t0) / max(len(stepping), 1)
        for path, action, result in zip(stepping, actions, results, strict=True):
            path.build.tree.compute.seconds += share
            if isinstance(result, BaseException):
                self._failures.fail(path, "step", result, waiting)  # path.pending stays: retried as is
                continue
            path.pending = None
            if self._record(path, action, result):
                self.pool.release(path.env)
                path.env = None
                if path.close():
                    self._done.append(path.build)

    def _decide(self, deciding: list[PathState], waiting: deque[PathState], entropies: list[float]) -> None:
        """Entropy where the topology wants it, then the branch factor and the samples of every
        deciding path (forks queued in ``waiting``)."""
        topology = self._topology
        # ALGO LOGIC: branch-point selection and sibling count (self._call only meters the calls)
        # rule 1: entropy (and so the branch decision) before any action is sampled here
        need_h = [p for p in deciding if not p.is_root and topology.wants_entropy(p)]
        if need_h:
            values = self._call(need_h, lambda: self._policy.decision_entropy([p.context for p in need_h]))
            for path, h in zip(need_h, values, strict=True):
                path.node.entropy = float(h)
                entropies.append(float(h))
        groups: dict[tuple[int, bool], list[PathState]] = {}
        for path in deciding:
            n = topology.root_branches if path.is_root else topology.fork_count(path, path.node.entropy)
            if n < 1:
                raise ValueError(f"branch factor must be >= 1, got {n}")
            groups.setdefault((n, n > 1 and topology.draws_distinct(path)), []).append(path)
        for (n, distinct), paths in groups.items():
            if distinct:  # rule 7: at most n different actions (fewer where fewer are admissible)
                def call(paths: list[PathState] = paths, n: int = n) -> Any:
                    return self._policy.sample_distinct([p.context for p in paths], n, rngs=[p.random for p in paths])
            else:
                def call(paths: list[PathState] = paths, n: int = n) -> Any:
                    return self._policy.sample([p.context for p in paths], n, rngs=[p.random for p in paths])
            samples = self._call(paths, call, generated=lambda rows: [sum(len(a.token_ids) for a in row) for row in rows])
            for path, actions in zip(paths, samples, strict=True):
                if len(actions) != n and not (distinct and 1 <= len(actions) < n):
                    raise RuntimeError(f"policy returned {len(actions)} samples, asked for {n}")
                path.pending = actions[0]  # the backbone continues with its own sample
                if len(actions) > 1:
                    self._fork(path, actions, waiting)
        # end ALGO LOGIC

    def _fork(self, path: PathState, actions: list[Action], waiting: deque[PathState]) -> None:
        node = path.node
        node.branch_factor = len(actions)
        t0 = time.perf_counter()
        try:
            snap = bpo_envs.snapshot(path.env)
        except Exception as exc:  # noqa: BLE001 - siblings are then rebuilt by replay
            snap, error = None, exc
        else:
            self._charge(path.build, snapshots=1)
        path.build.tree.compute.seconds += time.perf_counter() - t0
        shared = None
        if snap is not None:
            shared = SharedSnapshot(snap, path.env, pending=len(actions) - 1, node=node)
            path.build.snapshots[id(node)] = shared
        # ALGO LOGIC: the other n - 1 samples become siblings, each rolled on from this node
        sibling_level = path.level if path.is_root else path.level + 1
        for j, action in enumerate(actions[1:], start=1):
            waiting.append(
                PathState(path.build, node, level=sibling_level, snapshot=shared, pending=action, rebuild=shared is None,
                          key=(*path.key, node.depth + 1, j))
            )
        path.build.open_paths += len(actions) - 1
        if not path.is_root:
            path.branch_points += 1
        # end ALGO LOGIC
        if snap is None:
            self._failures.fail(path, "snapshot", error, waiting)

    def _record(self, path: PathState, action: Action, result: StepResult) -> bool:
        """Add the step's edge to the tree; True when the path's episode ended."""
        obs, reward, terminated, truncated, info = result
        # ALGO LOGIC: the step's edge in the tree (reward, termination; what advantages read)
        node = path.node
        child = Node(
            context=node.context.child(action.command, obs, admissible_of(info)),
            info=info,
            depth=node.depth + 1,
        )
        edge = Edge(node, child, action, float(reward), bool(terminated), bool(truncated), info)
        child.parent = edge
        path.build.add_child(node, edge, path.key)
        # end ALGO LOGIC
        # the env step and the tokens the learner will spend on it, in one charge (each field once)
        self._charge(path.build, env_steps=1, train_tokens=int(self._policy.train_tokens(edge)))
        path.node = child
        path.is_root = False
        if terminated or truncated:
            self._charge(path.build, leaves=1)
            return True
        if self._topology.snapshot_nodes:
            try:
                snap = bpo_envs.snapshot(path.env)
            except Exception:  # noqa: BLE001 - an expansion from here then rebuilds by replay
                logger.warning("snapshot of a node for later expansion failed", exc_info=True)
            else:
                self._charge(path.build, snapshots=1)
                path.build.snapshots[id(child)] = SharedSnapshot(snap, path.env, pending=0, node=child)
        return False

    # ---- envs for waiting paths ---------------------------------------------------------
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
        owner = bpo_envs.declared(shared.origin)
        return owner is not None and owner.restore_prefers_origin

    def _attach_waiting(self, waiting: deque[PathState], ready: list[PathState]) -> None:
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
            stage = "restore" if shared is not None and not path.rebuild else "rebuild"
            t0 = time.perf_counter()
            try:
                if stage == "restore":
                    self._restore(path.build, env, shared.snapshot)
                else:
                    self._failures.rebuild(path, env)
            except Exception as exc:  # noqa: BLE001 - an env failure
                self._failures.fail(path, stage, exc, waiting)
                continue
            finally:
                path.build.tree.compute.seconds += time.perf_counter() - t0
            if stage == "restore":
                path.consume_snapshot()
            path.rebuild = False
            ready.append(path)

    # ---- trees: start and finish --------------------------------------------------------
    def _start_tree(self, index: int, task: Any, trees: list[RolloutTree], builds: list[TreeBuild]) -> PathState | None:
        meter = self._meter
        # the tree's stream: (engine seed, index), or (its own seed, 0) (see run's seeds=)
        batch_seed, stream_index = (self.seed, index) if self._seeds is None else (self._seeds[index], 0)
        seed = int(path_stream(batch_seed, stream_index, ()).integers(2**31 - 1))
        for attempt in range(self.retries + 1):
            env = self.pool.acquire()
            if env is None:
                break
            t0 = time.perf_counter()
            try:
                obs, info = env.reset(seed=seed, options={"task_id": task})
            except Exception as exc:  # noqa: BLE001 - an env failure, handled below
                meter.resets += 1
                outcome = "retried" if attempt < self.retries else "task skipped"
                self._failures.record(None, task, 0, "reset", exc, outcome)
                self.pool.release(env, failed=True)
                continue
            meter.resets += 1
            if self._static_prior is None:
                self._static_prior = self._tree_prior(env)
            context = Context(
                task_id=info.get("task_id", task),
                observation=obs,
                admissible_actions=admissible_of(info),
                initial_observation=obs,
            )
            tree = RolloutTree(task_id=context.task_id, root=Node(context=context, info=info), seed=seed, index=index)
            tree.compute.resets += 1
            tree.compute.seconds += time.perf_counter() - t0
            trees.append(tree)
            build = TreeBuild(tree, open_paths=1, started=time.perf_counter(), task=task, seed=seed,
                              batch_seed=batch_seed, index=stream_index)
            builds.append(build)
            return PathState(build, tree.root, env=env, is_root=True)
        return None

    def _finish_done(self, trees: list[RolloutTree], waiting: deque[PathState]) -> int:
        """Finalize the trees whose last path ended (unless the topology grows them again);
        returns how many."""
        done = list(self._done)
        self._done.clear()
        finished = 0
        for build in done:
            if not build.dropped and self._expand(build, waiting):
                continue
            finished += 1
            build.finished = True
            for shared in list(build.snapshots.values()):
                shared.snapshot.release()
            build.snapshots.clear()
            if self._failures.tree_lost(build):
                trees.remove(build.tree)
                continue
            # ALGO LOGIC: weights (rule 3) and edge values, once the tree is whole
            build.tree.finalize()
            # end ALGO LOGIC
        return finished

    def _expand(self, build: TreeBuild, waiting: deque[PathState]) -> bool:
        """Queue the topology's expansions of ``build``'s finished tree; True if any."""
        # ALGO LOGIC: the topology's expansions (Tree-GRPO): one more i.i.d. path from each node
        nodes = list(self._topology.expansions(build.tree, build.expansion_round))
        build.expansion_round += 1
        for i, node in enumerate(nodes):
            if node.is_leaf:
                raise ValueError("an expansion node must be a decision point, not a leaf")
            node.branch_factor = max(node.branch_factor, len(node.children)) + 1
            waiting.append(PathState(build, node, rebuild=True, key=(1, build.expansion_round - 1, i)))
        build.open_paths += len(nodes)
        # end ALGO LOGIC
        return bool(nodes)


@dataclass
class EngineRun:
    """One of the runs :func:`run_together` advances: an engine (on a pool of its own) and the
    arguments of its :meth:`RolloutEngine.run`."""

    engine: RolloutEngine
    topology: Topology
    tasks: Sequence[Any]
    budget: Budget | None = None
    prior_costs: Sequence[float] | None = None


def run_together(policy: Policy, runs: Sequence[EngineRun]) -> list[EngineResult]:
    """The results of ``runs``, each what ``run.engine.run(policy, ...)`` gives alone, built in
    lock step: at every step one ``policy.shared_pass`` over the deciding paths of every run
    still under way, which each run's own pass then reads (``ChoicePolicy.shared_pass``: a pass
    nested in one that covers its contexts scores nothing again). Every run keeps its own
    engine, pool, budget, meter and random streams, so its trees are those it builds alone (the
    scores up to float rounding in the larger pass); only the per-step work is shared.

    Each run's ``compute.seconds`` is the wall time of the whole lock step (the runs share
    it), so a budget in seconds would not be a run's own: such a run is refused. The engines
    must not share a pool (each run's schedule is its own pool's free-slot bookkeeping). A policy
    that samples from a seed of its own (``samples_from_rngs`` False) gets the runs one after the
    other, as its samples depend on the order of the calls."""
    pools = [id(r.engine.pool) for r in runs]
    if len(set(pools)) != len(pools):
        raise ValueError("run_together needs a pool per run (a shared pool would change each run's schedule)")
    if any(r.budget is not None and r.budget.unit == "seconds" for r in runs):
        raise ValueError("run_together cannot hold a budget in seconds: the runs share the wall time")
    if not policy.samples_from_rngs:  # its samples depend on the order of the calls: one run at a time
        return [r.engine.run(policy, r.topology, r.tasks, r.budget, r.prior_costs) for r in runs]
    steps = [r.engine.steps(policy, r.topology, r.tasks, r.budget, r.prior_costs) for r in runs]
    results: list[EngineResult | None] = [None] * len(runs)
    deciding: dict[int, list[Context]] = {}

    def resume(i: int) -> None:
        try:
            deciding[i] = next(steps[i])
        except StopIteration as stop:
            results[i] = stop.value
            deciding.pop(i, None)

    try:
        for i in range(len(runs)):
            resume(i)
        while deciding:
            contexts = [c for i in sorted(deciding) for c in deciding[i]]
            with policy.shared_pass(contexts):
                for i in sorted(deciding):
                    resume(i)
    finally:
        for step in steps:
            step.close()
    return [r for r in results if r is not None]

"""``BPO-TreeMDP-v0``: a random deterministic tree MDP with an exactly computable policy gradient.

Every episode lasts exactly ``depth`` valid steps; the admissible actions are ``a0 .. a{A-1}``
everywhere; the observation names the node by its path from the root; the reward, in [0, 1]
and fixed by ``seed``, comes at the leaf. Invalid actions leave the node unchanged (they still
count towards ``max_episode_steps``, default ``2 * depth``).

Two reward structures:

* ``decisive_levels=None`` (random): ``R(leaf) = u(leaf)``, one uniform draw per leaf.
* ``decisive_levels=(l1, l2, ...)`` (agent-like): ``R = sum_l w_l u_l(d_<l, a_l) / sum_l w_l``
  with one uniform draw per (level, decisive actions before it, own action), ``w_l = 1`` at
  decisive levels and ``routine_weight`` (default 0.05) elsewhere. The action moves the return
  a lot at a few levels and barely at the others, as in agent episodes: a routine action
  changes only its own small term, never what the later decisions are worth.

With ``observe="state"`` the observation is the Markov state (depth, decisive actions so far)
instead of the path, so many paths share a state (a DAG MDP).

``won`` is ``R >= win_threshold`` (default 0.5). ``n_tasks`` independent trees share the env;
the task id (an int) is part of every observation.

``expected_return(log_probs)`` enumerates the tree: with a differentiable ``log_probs(obs,
actions)`` it gives the exact expected return, whose gradient is the ground truth for estimator
tests.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from bpo_envs.core import SnapshotEnv, SnapshotError

LogProbFn = Callable[[str, Sequence[str]], Any]


def _uniform(*key: int) -> float:
    """A uniform draw in [0, 1) fixed by ``key`` (the same in every process)."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


class TreeMDPEnv(SnapshotEnv):
    """A depth-``depth`` tree with ``n_actions`` actions per node; reward at the leaf."""

    def __init__(
        self,
        depth: int = 4,
        n_actions: int = 3,
        seed: int = 0,
        *,
        decisive_levels: Sequence[int] | None = None,
        routine_weight: float = 0.05,
        n_tasks: int = 1,
        observe: str = "path",
        win_threshold: float = 0.5,
        max_episode_steps: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        for name, value, low in (("depth", depth, 1), ("n_actions", n_actions, 2), ("n_tasks", n_tasks, 1)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if decisive_levels is not None:
            decisive_levels = tuple(int(level) for level in decisive_levels)
            bad = [level for level in decisive_levels if not 0 <= level < depth]
            if bad or not decisive_levels:
                raise ValueError(
                    f"decisive_levels must be non-empty levels in [0, {depth}), got {decisive_levels}"
                )
        if observe not in ("path", "state"):
            raise ValueError(f"observe must be 'path' or 'state', got {observe!r}")
        if observe == "state" and decisive_levels is None:
            raise ValueError("observe='state' needs decisive_levels (the state is the decisions made)")
        if not 0.0 <= routine_weight <= 1.0:
            raise ValueError(f"routine_weight must be in [0, 1], got {routine_weight}")
        super().__init__(
            max_episode_steps=2 * depth if max_episode_steps is None else max_episode_steps,
            render_mode=render_mode,
        )
        self.depth = int(depth)
        self.n_actions = int(n_actions)
        self.seed_value = int(seed)
        self.decisive_levels = decisive_levels
        self.routine_weight = float(routine_weight)
        self.n_tasks = int(n_tasks)
        self.win_threshold = float(win_threshold)
        self.observe = observe
        self.actions: tuple[str, ...] = tuple(f"a{i}" for i in range(self.n_actions))
        self._action_index = {a: i for i, a in enumerate(self.actions)}
        self._path: tuple[int, ...] = ()
        self._best = lru_cache(maxsize=None)(self._best_from)

    # ---- tree ----------------------------------------------------------------------------
    def task_ids(self) -> list[int]:
        return list(range(self.n_tasks))

    def observation_of(self, task: int, path: Sequence[int]) -> str:
        """The observation at a node (the key a tabular policy learns under).

        ``observe="path"`` names the node by its path from the root; ``observe="state"`` (agent-
        like trees only) by its depth and the decisive actions taken so far, which is all the
        reward depends on: routine detours lead to the same state, as in agent tasks where a
        harmless extra ``look`` does not change what the next decision is worth.
        """
        if self.observe == "state":
            decided = [self.actions[path[d]] for d in self.decisive_levels if d < len(path)]
            name = f"state[{len(path)}; decided {'/'.join(decided) or '-'}]"
        else:
            name = "/".join(["root", *(self.actions[i] for i in path)])
        if len(path) == self.depth:
            return f"tree {task} leaf {name}: reward {self.reward_of(task, path):.4f}"
        return (
            f"tree {task} node {name} (depth {len(path)} of {self.depth}). "
            f"Actions: {', '.join(self.actions)}"
        )

    def reward_of(self, task: int, path: Sequence[int]) -> float:
        """The leaf reward of ``path`` (a tuple of ``depth`` action indices)."""
        path = tuple(path)
        if len(path) != self.depth:
            raise ValueError(f"a leaf path has {self.depth} actions, got {len(path)}")
        if self.decisive_levels is None:
            return _uniform(self.seed_value, task, self.depth, self.n_actions, *path)
        total = weight = 0.0
        for level in range(self.depth):
            w = 1.0 if level in self.decisive_levels else self.routine_weight
            # a level's draw depends on its own action and the decisive actions before it only,
            # so routine actions move the return by their own small term and nothing else
            decided = tuple(path[d] for d in self.decisive_levels if d < level)
            total += w * _uniform(self.seed_value, task, level, self.n_actions, decided, path[level])
            weight += w
        return total / weight

    def leaves(self, task: int = 0) -> list[tuple[int, ...]]:
        """Every leaf path of tree ``task`` (``n_actions ** depth`` of them)."""
        return [tuple(p) for p in np.ndindex(*([self.n_actions] * self.depth))]

    def _best_from(self, task: int, path: tuple[int, ...]) -> tuple[float, tuple[int, ...]]:
        if len(path) == self.depth:
            return self.reward_of(task, path), ()
        best = max(
            ((self._best(task, (*path, a))[0], a) for a in range(self.n_actions)),
            key=lambda x: x[0],
        )
        return best[0], (best[1], *self._best(task, (*path, best[1]))[1])

    def expected_return(self, log_probs: LogProbFn, task: int = 0) -> Any:
        """``J = sum_leaf pi(leaf) R(leaf)`` by enumeration, with ``log_probs(obs, actions)``.

        ``log_probs`` returns log-probabilities over ``actions`` (a tensor or array); with a
        differentiable one the result is differentiable and its gradient is exact.
        """

        def value(path: tuple[int, ...]) -> Any:
            if len(path) == self.depth:
                return self.reward_of(task, path)
            logp = log_probs(self.observation_of(task, path), self.actions)
            probs = logp.exp() if hasattr(logp, "exp") else np.exp(logp)
            return sum(probs[a] * value((*path, a)) for a in range(self.n_actions))

        return value(())

    # ---- SnapshotEnv ---------------------------------------------------------------------
    def _snapshot_kind(self) -> Any:
        return (
            "TreeMDP",
            self.depth,
            self.n_actions,
            self.seed_value,
            self.decisive_levels,
            self.routine_weight,
            self.n_tasks,
            self.win_threshold,
            self.observe,
        )

    def _info(self) -> dict[str, Any]:
        at_leaf = len(self._path) == self.depth
        return {
            "admissible_actions": [] if at_leaf else list(self.actions),
            "depth": len(self._path),
        }

    def _reset_task(self, task_id: int) -> tuple[str, dict[str, Any]]:
        self._path = ()
        return self.observation_of(task_id, self._path), self._info()

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        index = self._action_index.get(action.strip().lower())
        if index is None:
            obs = (
                f"Invalid action {action[:80]!r}: choose one of {', '.join(self.actions)}. "
                + self.observation_of(self.task_id, self._path)
            )
            info = self._info()
            info["invalid_action"] = True
            return obs, 0.0, False, info
        self._path = (*self._path, index)
        info = self._info()
        if len(self._path) < self.depth:
            return self.observation_of(self.task_id, self._path), 0.0, False, info
        reward = self.reward_of(self.task_id, self._path)
        info["won"] = reward >= self.win_threshold
        return self.observation_of(self.task_id, self._path), reward, True, info

    def _get_state(self) -> tuple[int, ...]:
        return self._path

    def _set_state(self, state: tuple[int, ...]) -> None:
        self._path = state

    def _task_state_from_portable(self, obj: Any) -> tuple[int, ...]:
        if not (isinstance(obj, tuple) and len(obj) <= self.depth
                and all(type(a) is int and 0 <= a < self.n_actions for a in obj)):
            raise SnapshotError("portable bytes: not a path of this tree")
        return obj

    def agent_prior(self, confidence: float = 3.0) -> dict[str, list[float]]:
        """Logits of a "pretrained agent" for every state of an ``observe="state"`` tree.

        Routine decisions get ``confidence`` on the action with the best own reward term
        (a competent agent rarely fumbles routine steps), decisive ones zeros (it does not know
        which decision wins): the low-entropy-everywhere-but-the-decisions regime of an
        SFT-warmed LLM agent, for tabular experiments. Keyed by observation, for every task.
        """
        if self.observe != "state" or self.decisive_levels is None:
            raise ValueError("agent_prior needs an agent-like tree with observe='state'")
        prior: dict[str, list[float]] = {}
        for task in range(self.n_tasks):
            for level in range(self.depth):
                n_decided = sum(1 for d in self.decisive_levels if d < level)
                for decided in np.ndindex(*([self.n_actions] * n_decided)):
                    path = [0] * level
                    for d, a in zip([d for d in self.decisive_levels if d < level], decided, strict=True):
                        path[d] = a
                    logits = [0.0] * self.n_actions
                    if level not in self.decisive_levels:
                        own = [_uniform(self.seed_value, task, level, self.n_actions, tuple(decided), a) for a in range(self.n_actions)]
                        logits[int(np.argmax(own))] = float(confidence)
                    prior[self.observation_of(task, path)] = logits
        return prior

    def expert_actions(self) -> list[str]:
        """The path from the current node to the best leaf below it."""
        _, rest = self._best(self.task_id, self._path)
        return [self.actions[a] for a in rest]

    def sample_action(self, rng: np.random.Generator) -> str:
        return self.actions[int(rng.integers(self.n_actions))]

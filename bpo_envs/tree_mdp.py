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

The regimes of agent tasks (docs/envs.md, TreeMDP):

* ``reward="binary"``: ``R = 1`` when won, else 0 (ALFWorld's and SWE-bench's success reward).
  In an agent-like tree the outcome is decided by the decisive actions alone: won when their
  mean draw ``S = mean_l u_l(d_<l, a_l)`` reaches the task's threshold, which ``success_rate``
  sets so that that share of the ``A^n`` decisive combinations wins (at least one: every task is
  solvable); in a random tree won when ``u(leaf) >= 1 - success_rate``. Without
  ``success_rate`` the threshold is ``win_threshold``.
* ``slip=p``: with probability ``p`` the env executes a uniformly random action instead of the
  agent's (``info["slipped"]``). The draw is a hash of a nonce and the chosen action; the nonce
  is drawn at reset and moves on with every step, and it is part of the state, so a snapshot
  replays the same outcome for the same actions, while siblings choosing different actions draw
  independently.
* ``observe="state"`` with any ``depth`` (32 and more): the state is (depth, decisive actions
  so far), so :meth:`expected_return` and :meth:`variance_by_depth` are exact by dynamic
  programming over the states, not by enumerating ``A^depth`` paths.
* :meth:`agent_prior` sets how sure a "pretrained agent" is on routine, early and decisive
  decisions (the early-decision entropy of the regime map).

``expected_return(log_probs)`` gives the exact expected return (enumeration, or the DP over
states); with a differentiable ``log_probs(obs, actions)`` its gradient is the ground truth for
estimator tests. ``variance_by_depth(log_probs)`` gives ``E_h Var(R | h_d)`` for every depth:
where the outcome is decided, under a policy.
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

    step_may_block = False  # a table lookup: bounded by construction
    has_expert = True  # the optimal path, by enumeration

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
        reward: str = "dense",
        success_rate: float | None = None,
        slip: float = 0.0,
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
        if reward not in ("dense", "binary"):
            raise ValueError(f"reward must be 'dense' or 'binary', got {reward!r}")
        if success_rate is not None and not 0.0 < success_rate <= 1.0:
            raise ValueError(f"success_rate must be in (0, 1], got {success_rate}")
        if success_rate is not None and reward != "binary":
            raise ValueError("success_rate sets the binary reward's threshold: it needs reward='binary'")
        if not 0.0 <= slip <= 1.0:
            raise ValueError(f"slip must be in [0, 1], got {slip}")
        if not 0.0 <= routine_weight <= 1.0:
            raise ValueError(f"routine_weight must be in [0, 1], got {routine_weight}")
        super().__init__(
            max_episode_steps=2 * depth if max_episode_steps is None else max_episode_steps,
            render_mode=render_mode,
        )
        self.depth = int(depth)
        self.n_actions = int(n_actions)
        self.seed_value = int(seed)
        self.decisive_levels = None if decisive_levels is None else tuple(sorted(set(decisive_levels)))
        self.reward = reward
        self.success_rate = None if success_rate is None else float(success_rate)
        self.slip = float(slip)
        self.routine_weight = float(routine_weight)
        self.n_tasks = int(n_tasks)
        self.win_threshold = float(win_threshold)
        self.observe = observe
        self.actions: tuple[str, ...] = tuple(f"a{i}" for i in range(self.n_actions))
        self._action_index = {a: i for i, a in enumerate(self.actions)}
        self._path: tuple[int, ...] = ()
        self._nonce = 0
        self._best = lru_cache(maxsize=None)(self._best_from)
        self._threshold = lru_cache(maxsize=None)(self._binary_threshold)

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
        if self.reward == "binary":
            return self._leaf_value(task, self._memory(path))
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

    # ---- exact values: a DP over nodes (paths, or states with observe="state") -----------
    # A node is (level, memory): memory is the path (observe="path") or the decisive actions so
    # far (observe="state"), all the future depends on. R = sum of step rewards + leaf value.
    def _memory(self, path: Sequence[int]) -> tuple[int, ...]:
        if self.observe == "path" or self.decisive_levels is None:
            return tuple(path)
        return tuple(path[d] for d in self.decisive_levels if d < len(path))

    def _representative(self, level: int, memory: tuple[int, ...]) -> tuple[int, ...]:
        """A path to the node (level, memory) (routine actions 0 where the memory has none)."""
        if self.observe == "path" or self.decisive_levels is None:
            return memory
        path = [0] * level
        for d, a in zip([d for d in self.decisive_levels if d < level], memory, strict=True):
            path[d] = a
        return tuple(path)

    def _step_reward(self, task: int, level: int, memory: tuple[int, ...], action: int) -> float:
        """The part of ``R`` that the action at ``level`` adds (dense agent-like trees)."""
        if self.reward == "binary" or self.decisive_levels is None:
            return 0.0
        w = 1.0 if level in self.decisive_levels else self.routine_weight
        total = len(self.decisive_levels) + self.routine_weight * (self.depth - len(self.decisive_levels))
        decided = memory if self.observe == "state" else tuple(memory[d] for d in self.decisive_levels if d < level)
        return w * _uniform(self.seed_value, task, level, self.n_actions, decided, action) / total

    def _next(self, level: int, memory: tuple[int, ...], action: int) -> tuple[int, ...]:
        if self.observe == "state" and self.decisive_levels is not None and level not in self.decisive_levels:
            return memory
        return (*memory, action)

    def _decisive_score(self, task: int, decided: tuple[int, ...]) -> float:
        levels = self.decisive_levels or ()
        return float(np.mean([
            _uniform(self.seed_value, task, level, self.n_actions, decided[:i], decided[i]) for i, level in enumerate(levels)
        ]))

    def _binary_threshold(self, task: int) -> float:
        if self.success_rate is None:
            return self.win_threshold
        if self.decisive_levels is None:
            return 1.0 - self.success_rate
        scores = sorted(
            (self._decisive_score(task, tuple(c)) for c in np.ndindex(*([self.n_actions] * len(self.decisive_levels)))),
            reverse=True,
        )
        wins = max(1, int(round(self.success_rate * len(scores))))
        return scores[wins - 1]

    def _leaf_value(self, task: int, memory: tuple[int, ...]) -> float:
        """The leaf's share of ``R``: all of it in random and binary trees, 0 in dense agent-like."""
        if self.reward == "binary":
            if self.decisive_levels is None:
                score = _uniform(self.seed_value, task, self.depth, self.n_actions, *memory)
            else:
                decided = memory if self.observe == "state" else tuple(memory[d] for d in self.decisive_levels)
                score = self._decisive_score(task, decided)
            return float(score >= self._threshold(task))
        if self.decisive_levels is None:
            return _uniform(self.seed_value, task, self.depth, self.n_actions, *memory)
        return 0.0

    def transition_probs(self, probs: Any) -> Any:
        """Probabilities of the *executed* actions when the agent's are ``probs``:
        ``(1 - slip) probs + slip / A`` (``probs`` itself without slip; tensors stay tensors)."""
        if self.slip == 0.0:
            return probs
        return (1.0 - self.slip) * probs + self.slip / self.n_actions

    def _require_exact(self) -> None:
        """Exact values enumerate every node: with ``observe="path"`` that is ``n_actions ** depth``
        leaves, so deep path trees can be played and drawn but not solved exactly."""
        if self.observe == "path" and self.n_actions**self.depth > 3**14:
            raise ValueError(
                f"exact values with observe='path' enumerate {self.n_actions}**{self.depth} leaves: "
                "use observe='state' for deep trees"
            )

    def _best_from(self, task: int, level: int, memory: tuple[int, ...]) -> tuple[float, tuple[int, ...]]:
        if level == self.depth:
            return self._leaf_value(task, memory), ()
        options = []
        for a in range(self.n_actions):
            value, rest = self._best(task, level + 1, self._next(level, memory, a))
            options.append((self._step_reward(task, level, memory, a) + value, a, rest))
        value, a, rest = max(options, key=lambda x: x[0])
        return value, (a, *rest)

    def expected_return(self, log_probs: LogProbFn, task: int = 0) -> Any:
        """``J = E_pi[R]``, exact, with ``log_probs(obs, actions)`` (slip included).

        ``log_probs`` returns log-probabilities over ``actions`` (a tensor or array); with a
        differentiable one the result is differentiable and its gradient is exact.
        """
        self._require_exact()
        memo: dict[tuple[int, tuple[int, ...]], Any] = {}

        def value(level: int, memory: tuple[int, ...]) -> Any:
            key = (level, memory)
            if key not in memo:
                if level == self.depth:
                    memo[key] = self._leaf_value(task, memory)
                else:
                    q = self._executed(log_probs, task, level, memory)
                    memo[key] = sum(
                        q[a] * (self._step_reward(task, level, memory, a) + value(level + 1, self._next(level, memory, a)))
                        for a in range(self.n_actions)
                    )
            return memo[key]

        return value(0, ())

    def agent_probs(self, log_probs: LogProbFn, task: int, level: int, memory: tuple[int, ...]) -> np.ndarray:
        """The agent's action probabilities (float64, before slip) at the node ``(level, memory)``."""
        logp = log_probs(self.observation_of(task, self._representative(level, memory)), self.actions)
        if hasattr(logp, "detach"):  # third-party: a torch tensor (bpo_envs does not import torch) or an array
            return logp.detach().double().exp().numpy()
        return np.exp(np.asarray(logp, dtype=float))

    def _executed(self, log_probs: LogProbFn, task: int, level: int, memory: tuple[int, ...]) -> Any:
        logp = log_probs(self.observation_of(task, self._representative(level, memory)), self.actions)
        # float64: float32 probabilities make E Var(R | h_d) wobble by 1e-8 across depths
        # third-party: a torch tensor (bpo_envs does not import torch) or an array, by hasattr
        probs = logp.double().exp() if hasattr(logp, "double") else np.exp(np.asarray(logp, dtype=float))
        return self.transition_probs(probs)

    def variance_by_depth(self, log_probs: LogProbFn, task: int = 0, *, siblings: bool = False) -> list[float]:
        """``E_h Var(R | h_d)`` for ``d = 0 .. depth`` under the policy (exact; ``h_d`` the history
        of the first ``d`` steps). Entry 0 is ``Var(R)``; ``1 - v[d] / v[0]`` is the share of the
        return variance the first ``d`` steps explain, and ``v[d] - v[d + 1]`` is what the
        decision at depth ``d`` (and its slip) settles.

        ``siblings=True``: the variance among siblings forked from a snapshot at depth ``d``
        instead, ``E Var(R | s_d)`` with ``s_d`` the whole state, the slip nonce included.
        Siblings that choose the same action share its slip draw and the nonce after it, so
        with slip this is below ``E Var(R | h_d)`` (equal without slip). With ``pi`` the agent's
        probabilities, ``q_a(e) = (1 - slip) [e = a] + slip / A`` the executed ones, ``m`` and
        ``M2`` the moments of the return to come and ``mu_a = sum_e q_a(e) (r_e + m(e))``,
        ``G = E_nonce (E[R | s])^2`` obeys (``G = v^2`` at a leaf of value ``v``)::

            G = m^2 - sum_a pi_a^2 mu_a^2 + sum_a pi_a^2 sum_e q_a(e) (r_e^2 + 2 r_e m(e) + G(e))

        (two siblings choosing different actions draw their slips independently; choosing the
        same, they share the draw), and ``Var(R | s) = M2 - G`` on average over the nonce."""
        self._require_exact()
        probs: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}

        def executed(level: int, memory: tuple[int, ...]) -> np.ndarray:
            key = (level, memory)
            if key not in probs:
                q = self._executed(log_probs, task, level, memory)
                # third-party: a torch tensor or an array, by hasattr (as above)
                probs[key] = np.asarray(q.detach().double().numpy() if hasattr(q, "detach") else q, dtype=float)
            return probs[key]

        moments: dict[tuple[int, tuple[int, ...]], tuple[float, float]] = {}

        def future(level: int, memory: tuple[int, ...]) -> tuple[float, float]:
            # first and second moments of the return still to come from this node
            key = (level, memory)
            if key not in moments:
                if level == self.depth:
                    v = self._leaf_value(task, memory)
                    moments[key] = (v, v * v)
                else:
                    q = executed(level, memory)
                    m1 = m2 = 0.0
                    for a in range(self.n_actions):
                        r = self._step_reward(task, level, memory, a)
                        c1, c2 = future(level + 1, self._next(level, memory, a))
                        m1 += q[a] * (r + c1)
                        m2 += q[a] * (r * r + 2 * r * c1 + c2)
                    moments[key] = (m1, m2)
            return moments[key]

        shared: dict[tuple[int, tuple[int, ...]], float] = {}

        def square(level: int, memory: tuple[int, ...]) -> float:
            # G: the mean product of two siblings' returns to come from one snapshot here
            key = (level, memory)
            if key not in shared:
                m1 = future(level, memory)[0]
                if level == self.depth or self.slip == 0.0:
                    shared[key] = m1 * m1
                else:
                    pi = self.agent_probs(log_probs, task, level, memory)
                    total = m1 * m1
                    for a in range(self.n_actions):
                        q = np.full(self.n_actions, self.slip / self.n_actions)
                        q[a] += 1.0 - self.slip
                        mu = same = 0.0
                        for e in range(self.n_actions):
                            r = self._step_reward(task, level, memory, e)
                            child = self._next(level, memory, e)
                            c1 = future(level + 1, child)[0]
                            mu += q[e] * (r + c1)
                            same += q[e] * (r * r + 2 * r * c1 + square(level + 1, child))
                        total += pi[a] ** 2 * (same - mu * mu)
                    shared[key] = total
            return shared[key]

        def spread(level: int, memory: tuple[int, ...]) -> float:
            m1, m2 = future(level, memory)
            return m2 - (square(level, memory) if siblings else m1 * m1)

        # the return to come given h depends on h only through its node: E Var(R | h_d) =
        # sum over depth-d nodes of P(node) Var(future | node)
        out = []
        layer = {(): 1.0}
        for level in range(self.depth + 1):
            out.append(float(sum(p * spread(level, m) for m, p in layer.items())))
            if level == self.depth:
                break
            nxt: dict[tuple[int, ...], float] = {}
            for memory, p in layer.items():
                q = executed(level, memory)
                for a in range(self.n_actions):
                    child = self._next(level, memory, a)
                    nxt[child] = nxt.get(child, 0.0) + p * q[a]
            layer = nxt
        return [max(v, 0.0) for v in out]

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
            self.reward,
            self.success_rate,
            self.slip,
        )

    def _info(self) -> dict[str, Any]:
        at_leaf = len(self._path) == self.depth
        return {
            "admissible_actions": [] if at_leaf else list(self.actions),
            "depth": len(self._path),
        }

    def _reset_task(self, task_id: int) -> tuple[str, dict[str, Any]]:
        self._path = ()
        self._nonce = int(self.np_random.integers(2**62))
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
        executed = index
        if self.slip > 0.0:
            draw = (self.seed_value, "slip", self.task_id, self._nonce, index)
            if _uniform(*draw) < self.slip:
                executed = min(int(_uniform(*draw, "to") * self.n_actions), self.n_actions - 1)
            self._nonce = int(_uniform(*draw, "nonce") * 2**62)
        self._path = (*self._path, executed)
        info = self._info()
        if executed != index:
            info["slipped"] = True
        if len(self._path) < self.depth:
            return self.observation_of(self.task_id, self._path), 0.0, False, info
        reward = self.reward_of(self.task_id, self._path)
        info["won"] = reward >= (0.5 if self.reward == "binary" else self.win_threshold)
        return self.observation_of(self.task_id, self._path), reward, True, info

    def _get_state(self) -> tuple[tuple[int, ...], int]:
        return self._path, self._nonce

    def _set_state(self, state: tuple[tuple[int, ...], int]) -> None:
        path, nonce = state
        self._path, self._nonce = tuple(int(a) for a in path), int(nonce)

    def _task_state_from_portable(self, obj: Any) -> tuple[tuple[int, ...], int]:
        path, nonce = obj if isinstance(obj, tuple) and len(obj) == 2 else (None, None)
        if not (isinstance(path, tuple) and len(path) <= self.depth and type(nonce) is int
                and all(type(a) is int and 0 <= a < self.n_actions for a in path)):
            raise SnapshotError("portable bytes: not a path of this tree")
        return path, nonce

    def agent_prior(
        self,
        confidence: float = 3.0,
        *,
        decisive_confidence: float = 0.0,
        early_confidence: float | None = None,
    ) -> dict[str, list[float]]:
        """Logits of a "pretrained agent" for every state of an ``observe="state"`` tree.

        Routine decisions get ``confidence`` on the action with the best own reward term
        (a competent agent rarely fumbles routine steps); routine decisions before the first
        decisive level get ``early_confidence`` instead (default ``confidence``; 0: the early
        steps are uniformly random, as an agent exploring an unfamiliar start). Decisive ones get
        ``decisive_confidence`` on one action fixed by the seed, not the best one (default 0: it
        does not know which decision wins; higher: a prior that commits early, right or wrong).
        The default is the low-entropy-everywhere-but-the-decisions regime of an SFT-warmed LLM
        agent, for tabular experiments. Keyed by observation, for every task.
        """
        if self.observe != "state" or self.decisive_levels is None:
            raise ValueError("agent_prior needs an agent-like tree with observe='state'")
        first = min(self.decisive_levels)
        prior: dict[str, list[float]] = {}
        for task in range(self.n_tasks):
            for level in range(self.depth):
                n_decided = sum(1 for d in self.decisive_levels if d < level)
                for decided in np.ndindex(*([self.n_actions] * n_decided)):
                    logits = [0.0] * self.n_actions
                    if level in self.decisive_levels:
                        pick = int(_uniform(self.seed_value, task, "prior", level, tuple(decided)) * self.n_actions)
                        logits[min(pick, self.n_actions - 1)] = float(decisive_confidence)
                    else:
                        own = [_uniform(self.seed_value, task, level, self.n_actions, tuple(decided), a) for a in range(self.n_actions)]
                        sure = confidence if early_confidence is None or level > first else early_confidence
                        logits[int(np.argmax(own))] = float(sure)
                    prior[self.observation_of(task, self._representative(level, tuple(decided)))] = logits
        return prior

    def expert_actions(self) -> list[str]:
        """The path from the current node to the best leaf below it."""
        _, rest = self._best(self.task_id, len(self._path), self._memory(self._path))
        return [self.actions[a] for a in rest]

    def sample_action(self, rng: np.random.Generator) -> str:
        return self.actions[int(rng.integers(self.n_actions))]

"""One client's session: its env, its episode, and where its env calls run.

An env call (reset, step, snapshot, restore, ...) runs in the server's thread pool, so one slow
step does not stall the other sessions; a call that runs past the per-step deadline is answered
with an error and ends the session (the env, in an unknown state, is closed once the call
returns, not reused). The hop to a pool thread and back costs about as much as a WebShop step,
so :class:`EnvCalls` runs a kind of call on the event loop instead while that kind stays quick
(docs/serving.md). A call on the event loop cannot be interrupted, so the deadline guards the
pool's calls only: one call that blocks sends its kind back to the pool, and an env whose calls
may hang without warning is served with ``inline_ms=None``. SWE-bench's and ALFWorld's calls
(milliseconds and more) never qualify.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from concurrent.futures import Executor
from typing import Any

import gymnasium as gym

from bpo_envs.core import restore, snapshot
from bpo_envs.serve.protocol import RESET_ARGS, WSErrorCode, error, json_safe, observation_data
from bpo_envs.serve.snapshots import SnapshotStore


class DeadlineExceeded(RuntimeError):
    """An env call ran past the per-step deadline; the session ends."""


def _reset(env: gym.Env, seed: int | None, options: dict[str, Any] | None) -> dict[str, Any]:
    obs, info = env.reset(seed=seed, options=options)
    return {"type": "observation", "data": observation_data(obs, None, False, False, info)}


def _step(env: gym.Env, text: str) -> dict[str, Any]:
    obs, reward, terminated, truncated, info = env.step(text)
    return {"type": "observation", "data": observation_data(obs, reward, terminated, truncated, info)}


INLINE_STREAK = 64
"""Calls of a kind, none of them blocking, after which that kind may run on the event loop."""
BLOCKING_FACTOR = 20
"""A call that took this many times ``inline_ms`` blocked (it waited on a subprocess, the network
or a lock, or the machine starved it): its kind goes back to the thread pool."""
EWMA_WEIGHT = 1 / 16


class EnvCalls:
    """Runs the env calls of all sessions of a server, in the thread pool or on the event loop.

    A kind of call (``"step"``, ``"reset"``, ...) runs on the event loop while it is quick: its
    last :data:`INLINE_STREAK` calls blocked none (each under ``BLOCKING_FACTOR * inline_ms``)
    and the moving average of their durations (weight :data:`EWMA_WEIGHT`) is under
    ``inline_ms`` milliseconds. Wall time, not CPU time: a thread's CPU clock costs a system call
    per read, and a call the machine preempts holds the GIL in a pool thread just the same.
    ``inline_ms=None``: always the pool.
    """

    def __init__(self, executor: Executor, deadline: float | None, inline_ms: float | None) -> None:
        self.executor = executor
        self.deadline = deadline
        self.inline_s = None if inline_ms is None else inline_ms / 1000
        self._streak: dict[str, int] = {}
        self._mean: dict[str, float] = {}
        self.inline: Counter[str] = Counter()
        """Calls run on the event loop, by kind (``/health``)."""
        self.pooled: Counter[str] = Counter()
        """Calls run in the thread pool, by kind (``/health``)."""

    def _timed(self, kind: str, fn: Any, *args: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:  # updates from pool threads may interleave: at worst a kind is inlined later
            took = time.perf_counter() - t
            mean = self._mean.get(kind)
            self._mean[kind] = took if mean is None else mean + EWMA_WEIGHT * (took - mean)
            self._streak[kind] = 0 if took >= BLOCKING_FACTOR * self.inline_s else self._streak.get(kind, 0) + 1

    def quick(self, kind: str) -> bool:
        """Whether calls of ``kind`` run on the event loop now."""
        return (
            self.inline_s is not None
            and self._streak.get(kind, 0) >= INLINE_STREAK
            and self._mean[kind] < self.inline_s
        )

    async def run(self, session: Session, kind: str, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` for ``session``: on the event loop while ``kind`` is quick, else in the
        thread pool under the per-step deadline."""
        if self.inline_s is None:
            future = asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        elif self.quick(kind):
            self.inline[kind] += 1
            return self._timed(kind, fn, *args)
        else:
            future = asyncio.get_running_loop().run_in_executor(self.executor, self._timed, kind, fn, *args)
        self.pooled[kind] += 1
        session.pending = future
        if self.deadline is None:
            return await future
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.deadline)
        except TimeoutError:
            session.broken = True
            raise DeadlineExceeded(
                f"the env call ran past the server's per-step deadline ({self.deadline:g} s); "
                "the session is closed"
            ) from None


class Session:
    """The state of one WebSocket session (the server's event loop only touches it)."""

    def __init__(self, session_id: str, env: gym.Env, calls: EnvCalls, store: SnapshotStore) -> None:
        self.id = session_id
        self.env = env
        self.broken = False
        """An env call failed its deadline: the env must not be reused."""
        self.pending: asyncio.Future | None = None
        self._calls = calls
        self._store = store
        self._episode_id: str | None = None
        self._steps = 0
        self._last: dict[str, Any] | None = None  # the last observation message sent
        self._done = False

    async def run(self, kind: str, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, an env call of ``kind``, where :class:`EnvCalls` puts it."""
        return await self._calls.run(self, kind, fn, *args)

    async def reset(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            return error(WSErrorCode.VALIDATION_ERROR, "reset's data must be a JSON object")
        unknown = sorted(set(data) - set(RESET_ARGS))
        if unknown:
            return error(
                WSErrorCode.VALIDATION_ERROR,
                f"unknown reset argument(s) {unknown}; supported: {list(RESET_ARGS)}",
            )
        if data.get("snapshot_id") is not None:
            if data.get("task_id") is not None or data.get("seed") is not None:
                return error(WSErrorCode.VALIDATION_ERROR, "reset takes snapshot_id alone, or task_id/seed")
            return await self._fork(data["snapshot_id"])
        seed = data.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            return error(WSErrorCode.VALIDATION_ERROR, f"seed must be a non-negative integer, got {seed!r}")
        options = {"task_id": data["task_id"]} if data.get("task_id") is not None else None
        reply = await self.run("reset", _reset, self.env, seed, options)
        episode_id = data.get("episode_id")
        self._episode_id = str(episode_id) if episode_id is not None else uuid.uuid4().hex
        self._steps = 0
        return self._sent(reply)

    async def _fork(self, snapshot_id: Any) -> dict[str, Any]:
        entry = self._store.get(snapshot_id)  # UnknownSnapshotError names the id
        await self.run("restore", restore, self.env, entry.snapshot)
        self._episode_id, self._steps = entry.episode_id, entry.steps
        reply = entry.reply
        return self._sent({"type": "observation", "data": {**reply["data"], "reward": None}})

    async def step(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict) or not isinstance(data.get("text"), str):
            return error(WSErrorCode.VALIDATION_ERROR, 'step\'s data must be an action {"text": str}')
        extra = sorted(set(data) - {"text", "metadata"})
        if extra:
            return error(WSErrorCode.VALIDATION_ERROR, f"unknown action field(s) {extra}; an action is {{\"text\": str}}")
        if self._last is None:
            return error(WSErrorCode.EXECUTION_ERROR, "call reset before step")
        if self._done:
            return error(WSErrorCode.EXECUTION_ERROR, "the episode has ended; reset (or reset to a snapshot_id)")
        reply = await self.run("step", _step, self.env, data["text"])
        self._steps += 1
        return self._sent(reply)

    async def state(self) -> dict[str, Any]:
        snapshot_id = None
        task_id = None
        if self._last is not None:
            snap = await self.run("snapshot", snapshot, self.env)
            snapshot_id = self._store.put(self.id, snap, self._last, self._episode_id, self._steps)
            task_id = self._last["data"]["observation"]["task_id"]
        # models.ServedState's fields, built as a dict on the hot path
        state = {"episode_id": self._episode_id, "step_count": self._steps, "snapshot_id": snapshot_id, "task_id": task_id, "done": self._done}
        return {"type": "state", "data": state}

    async def task_ids(self) -> dict[str, Any]:
        ids = await self.run("task_ids", lambda: list(self.env.unwrapped.task_ids()))
        return {"type": "task_ids", "data": {"task_ids": json_safe(ids)}}

    async def expert_actions(self) -> dict[str, Any]:
        if self._last is None:
            return error(WSErrorCode.EXECUTION_ERROR, "call reset before expert_actions")
        actions = await self.run("expert_actions", lambda: list(self.env.unwrapped.expert_actions()))
        return {"type": "expert_actions", "data": {"actions": [str(a) for a in actions]}}

    def _sent(self, reply: dict[str, Any]) -> dict[str, Any]:
        self._last = reply
        self._done = reply["data"]["done"]
        return reply


__all__ = ["BLOCKING_FACTOR", "EWMA_WEIGHT", "INLINE_STREAK", "DeadlineExceeded", "EnvCalls", "Session"]

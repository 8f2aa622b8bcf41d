"""One client's session: its env, its episode and the env work it runs off the event loop.

Every env call (make, reset, step, snapshot, restore, close) runs in the server's thread pool,
never on the event loop, so one slow step does not stall the other sessions. A call that runs
past the per-step deadline is answered with an error and ends the session: the env is in an
unknown state, so it is closed (after the call returns) rather than reused.
"""

from __future__ import annotations

import asyncio
import uuid
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


class Session:
    """The state of one WebSocket session (the server's event loop only touches it)."""

    def __init__(self, session_id: str, env: gym.Env, executor: Executor, store: SnapshotStore, deadline: float | None) -> None:
        self.id = session_id
        self.env = env
        self.broken = False
        """An env call failed its deadline: the env must not be reused."""
        self.pending: asyncio.Future | None = None
        self._executor = executor
        self._store = store
        self._deadline = deadline
        self._episode_id: str | None = None
        self._steps = 0
        self._last: dict[str, Any] | None = None  # the last observation message sent
        self._done = False

    async def run(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` in the thread pool, under the per-step deadline."""
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, fn, *args)
        self.pending = future
        if self._deadline is None:
            return await future
        try:
            return await asyncio.wait_for(asyncio.shield(future), self._deadline)
        except TimeoutError:
            self.broken = True
            raise DeadlineExceeded(
                f"the env call ran past the server's per-step deadline ({self._deadline:g} s); "
                "the session is closed"
            ) from None

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
        reply = await self.run(_reset, self.env, seed, options)
        episode_id = data.get("episode_id")
        self._episode_id = str(episode_id) if episode_id is not None else uuid.uuid4().hex
        self._steps = 0
        return self._sent(reply)

    async def _fork(self, snapshot_id: Any) -> dict[str, Any]:
        entry = self._store.get(snapshot_id)  # UnknownSnapshotError names the id
        await self.run(restore, self.env, entry.snapshot)
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
        reply = await self.run(_step, self.env, data["text"])
        self._steps += 1
        return self._sent(reply)

    async def state(self) -> dict[str, Any]:
        snapshot_id = None
        task_id = None
        if self._last is not None:
            snap = await self.run(snapshot, self.env)
            snapshot_id = self._store.put(self.id, snap, self._last, self._episode_id, self._steps)
            task_id = self._last["data"]["observation"]["task_id"]
        # models.ServedState's fields, built as a dict on the hot path
        state = {"episode_id": self._episode_id, "step_count": self._steps, "snapshot_id": snapshot_id, "task_id": task_id, "done": self._done}
        return {"type": "state", "data": state}

    async def task_ids(self) -> dict[str, Any]:
        ids = await self.run(lambda: list(self.env.unwrapped.task_ids()))
        return {"type": "task_ids", "data": {"task_ids": json_safe(ids)}}

    async def expert_actions(self) -> dict[str, Any]:
        if self._last is None:
            return error(WSErrorCode.EXECUTION_ERROR, "call reset before expert_actions")
        actions = await self.run(lambda: list(self.env.unwrapped.expert_actions()))
        return {"type": "expert_actions", "data": {"actions": [str(a) for a in actions]}}

    def _sent(self, reply: dict[str, Any]) -> dict[str, Any]:
        self._last = reply
        self._done = reply["data"]["done"]
        return reply


__all__ = ["DeadlineExceeded", "Session"]

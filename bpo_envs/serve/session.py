"""One client's session: its env, its episode, and where its env calls run.

Where an env call (reset, step, snapshot, restore, ...) runs is the env's declared capability,
read from its class (``bpo_envs.core.SnapshotEnv.step_may_block``), never probed: an env whose
every call is bounded by construction (WebShop, TreeMDP: ``step_may_block = False``) is called
on the event loop, with no hand-off to a thread (the hop costs about as much as a WebShop step);
every other env (ALFWorld, SWE-bench, a remote env, anything not a ``SnapshotEnv``) is called
in the server's thread pool, so one slow step does not stall the other sessions, and a call that
runs past the per-step deadline is answered with an error and ends the session (the env, in an
unknown state, is closed once the call returns, not reused). A call on the event loop cannot be
interrupted, which is why only a declared-bounded env runs there (docs/serving.md).
"""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import Executor
from typing import Any

import gymnasium as gym

from bpo_envs.capabilities import EnvCapabilities, declared, fixed_declarations
from bpo_envs.core import SnapshotEnv, restore, snapshot
from bpo_envs.serve.protocol import (
    MAX_ID_CHARS,
    MAX_SEED,
    MAX_TASK_ID_BYTES,
    RESET_ARGS,
    WSErrorCode,
    dumps,
    error,
    json_safe,
    observation_data,
    shown,
)
from bpo_envs.serve.snapshots import SnapshotStore

_NOTHING_DECLARED = EnvCapabilities()
"""The declarations of a served env that is not ours: the defaults."""


class DeadlineExceeded(RuntimeError):
    """An env call ran past the per-step deadline; the session ends."""


def _reset(env: gym.Env, seed: int | None, options: dict[str, Any] | None) -> dict[str, Any]:
    obs, info = env.reset(seed=seed, options=options)
    return {"type": "observation", "data": observation_data(obs, None, False, False, info)}


def _step(env: gym.Env, text: str) -> dict[str, Any]:
    obs, reward, terminated, truncated, info = env.step(text)
    return {"type": "observation", "data": observation_data(obs, reward, terminated, truncated, info)}


def runs_inline(env: gym.Env) -> bool:
    """Whether ``env``'s calls may run on the event loop: its class is a ``SnapshotEnv`` that
    declares ``step_may_block = False`` (read from the class, as declared)."""
    cls = type(env.unwrapped)
    return issubclass(cls, SnapshotEnv) and not cls.step_may_block


class EnvCalls:
    """Runs the env calls of all sessions of a server: on the event loop when ``inline`` (the
    served env declares its calls bounded, :func:`runs_inline`), else in the thread pool under
    the per-step deadline (``None``: no deadline)."""

    def __init__(self, executor: Executor, deadline: float | None, inline: bool) -> None:
        self.executor = executor
        self.deadline = deadline
        self.inline = inline

    async def run(self, session: Session, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` for ``session``: on the event loop when ``inline``, else in the thread
        pool under the per-step deadline."""
        if self.inline:
            return fn(*args)
        future = asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
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


def _reset_problem(data: dict[str, Any]) -> str | None:
    """What is wrong with ``reset``'s arguments (types and sizes; protocol.py's limits), or None."""
    seed = data.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED):
        return f"seed must be an integer from 0 to 2**64 - 1, got {shown(seed)}"
    episode_id = data.get("episode_id")
    if episode_id is not None and (
        isinstance(episode_id, bool) or not isinstance(episode_id, str | int) or len(str(episode_id)) > MAX_ID_CHARS
    ):
        return f"episode_id must be a string (or integer) of at most {MAX_ID_CHARS} characters, got {shown(episode_id)}"
    task_id = data.get("task_id")
    if task_id is not None and len(dumps(task_id)) > MAX_TASK_ID_BYTES:
        return f"task_id must be at most {MAX_TASK_ID_BYTES} bytes of JSON, got {shown(task_id)}"
    snapshot_id = data.get("snapshot_id")
    if snapshot_id is not None and (not isinstance(snapshot_id, str) or len(snapshot_id) > MAX_ID_CHARS):
        return f"snapshot_id must be a string of at most {MAX_ID_CHARS} characters, got {shown(snapshot_id)}"
    return None


class Session:
    """The state of one WebSocket session (the server's event loop only touches it)."""

    def __init__(self, session_id: str, env: gym.Env, calls: EnvCalls, store: SnapshotStore) -> None:
        self.id = session_id
        self.env = env
        self.broken = False
        """An env call failed its deadline: the env must not be reused."""
        self.pending: asyncio.Future | None = None
        self.idle_since = 0.0
        """Event-loop time of the session's last message (or its start)."""
        self.waiting = False
        """The session waits for its next message (nothing of it runs)."""
        self.stopper: asyncio.Timeout | None = None
        """Ends the session's wait for a message when rescheduled (the server's event loop)."""
        self.stop_reason: str | None = None
        """Why the server ended the session (idle, or its slot went to a newcomer)."""
        self.idle_timer: asyncio.TimerHandle | None = None
        self._calls = calls
        self._store = store
        self._episode_id: str | None = None
        self._steps = 0
        self._last: dict[str, Any] | None = None  # the last observation message sent
        self._done = False

    async def run(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, an env call, where :class:`EnvCalls` puts it."""
        if self._calls.inline:  # the hot path: no coroutine between the loop and the env
            return fn(*args)
        return await self._calls.run(self, fn, *args)

    def stop(self, reason: str) -> bool:
        """End the session's wait for its next message (it then ends, sending ``reason``);
        False where it is not waiting (it is running a call: the wait is never cut into one)."""
        if not self.waiting or self.stopper is None or self.stop_reason is not None:
            return False
        self.stop_reason = reason
        self.stopper.reschedule(asyncio.get_running_loop().time())
        return True

    async def reset(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            return error(WSErrorCode.VALIDATION_ERROR, "reset's data must be a JSON object")
        unknown = sorted(set(data) - set(RESET_ARGS))
        if unknown:
            return error(
                WSErrorCode.VALIDATION_ERROR,
                f"unknown reset argument(s) {shown(unknown)}; supported: {list(RESET_ARGS)}",
            )
        problem = _reset_problem(data)
        if problem is not None:
            return error(WSErrorCode.VALIDATION_ERROR, problem)
        if data.get("snapshot_id") is not None:
            if data.get("task_id") is not None or data.get("seed") is not None:
                return error(WSErrorCode.VALIDATION_ERROR, "reset takes snapshot_id alone, or task_id/seed")
            return await self._fork(data["snapshot_id"])
        options = {"task_id": data["task_id"]} if data.get("task_id") is not None else None
        reply = await self.run(_reset, self.env, data.get("seed"), options)
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
        text = data.get("text") if isinstance(data, dict) else None
        if not isinstance(text, str):
            return error(WSErrorCode.VALIDATION_ERROR, 'step\'s data must be an action {"text": str}')
        if len(data) > 1:
            extra = sorted(set(data) - {"text", "metadata"})
            if extra:
                return error(WSErrorCode.VALIDATION_ERROR, f"unknown action field(s) {shown(extra)}; an action is {{\"text\": str}}")
            if not isinstance(data.get("metadata", {}), dict):
                return error(WSErrorCode.VALIDATION_ERROR, "an action's metadata, where sent, is a JSON object")
        if self._last is None:
            return error(WSErrorCode.EXECUTION_ERROR, "call reset before step")
        if self._done:
            return error(WSErrorCode.EXECUTION_ERROR, "the episode has ended; reset (or reset to a snapshot_id)")
        calls = self._calls
        reply = _step(self.env, text) if calls.inline else await calls.run(self, _step, self.env, text)
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

    @property
    def declarations(self) -> EnvCapabilities:
        """The served env's declarations (docs/envs.md); the defaults for an env that is not ours."""
        return declared(self.env) or _NOTHING_DECLARED

    async def capabilities(self) -> dict[str, Any]:
        owner = self.declarations
        data = {**fixed_declarations(owner), "provenance": json_safe(await self.run(owner.provenance))}
        return {"type": "capabilities", "data": data}

    async def task_ids(self) -> dict[str, Any]:
        ids = await self.run(self.declarations.task_ids)
        return {"type": "task_ids", "data": {"task_ids": None if ids is None else json_safe(list(ids))}}

    async def expert_actions(self) -> dict[str, Any]:
        if self._last is None:
            return error(WSErrorCode.EXECUTION_ERROR, "call reset before expert_actions")
        actions = await self.run(lambda: list(self.declarations.expert_actions()))
        return {"type": "expert_actions", "data": {"actions": [str(a) for a in actions]}}

    def _sent(self, reply: dict[str, Any]) -> dict[str, Any]:
        self._last = reply
        self._done = reply["data"]["done"]
        return reply


__all__ = ["DeadlineExceeded", "EnvCalls", "Session", "runs_inline"]

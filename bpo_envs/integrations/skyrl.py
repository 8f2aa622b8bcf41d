"""The BPO envs as SkyRL-gym text envs (``skyrl_gym.envs.base_text_env.BaseTextEnv``).

SkyRL builds an env per trajectory with ``skyrl_gym.make(env_class, env_config=..., extras=...)``
(``extras`` is the dataset row's ``env_extras``), calls ``init(prompt)`` for the first chat and
then ``step(llm_output)`` until ``done``. Importing this module registers every ``BPO-*`` id
with ``skyrl_gym``'s registry, so ``skyrl_gym.make("BPO-WebShop-v0", env_config={...},
extras={"task_id": 3})`` works, and so does ``SkyRLEnv(env_config, extras)`` directly.

* ``env_config["env_id"]`` names the env (the registered id fills it in); the rest of
  ``env_config`` goes to ``gym.make`` (``max_episode_steps``, ``split``, ...), plus an optional
  ``prompt_config`` (:class:`~bpo_envs.prompting.PromptConfig` or a dict of its fields).
* ``extras["task_id"]`` picks the task (or ``extras["seed"]``); ``extras["state"]`` (bytes from
  :meth:`SkyRLEnv.portable_state`) resumes a saved mid-episode state.
* ``init(prompt)`` returns this project's chat (:func:`bpo_envs.prompting.build_messages`:
  system + user with the task, recent steps, observation and admissible actions) in place of
  the dataset prompt, and ``{"task_id", "admissible_actions"}``.
* ``step(text)`` parses the action between the tags (``<action>...</action>``; unparsable text
  goes to the env as is, and the env answers with an invalid-action observation), takes one env
  step and returns ``BaseTextEnvStepOutput``: the next observation as a user message (empty
  when done), the step's reward, ``done`` (terminated or truncated) and ``metadata`` with
  ``won``, ``admissible_actions``, ``task_id``, ``invalid_action``, ``terminated``,
  ``truncated`` and ``action`` (the parsed action sent to the env). ``postprocessed_action`` is
  always None: SkyRL-train replaces the model's generated tokens with a non-None
  ``postprocessed_action`` (re-tokenised), which would drop the tags and any reasoning from the
  trained sequence and misalign its sampling log-probs; with None the model's own tokens are
  what is trained (token-in, token-out).
* ``snapshot()`` / ``restore(snap)`` pass through to :func:`bpo_envs.snapshot` /
  :func:`bpo_envs.restore` (docs/snapshots.md); the adapter's turn count and history travel
  with the snapshot.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

import bpo_envs
from bpo_envs.capabilities import declared
from bpo_envs.core import SnapshotError, check_step_limit, decode_portable
from bpo_envs.integrations import require, require_summary_layout
from bpo_envs.portable import dumps
from bpo_envs.prompting import (
    Context,
    PromptConfig,
    build_messages,
    context_data,
    context_from_data,
    env_action,
)

skyrl_gym = require("skyrl_gym", "skyrl-gym", "skyrl", minimum="0.1.1")
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput  # noqa: E402

_STATE_FORMAT = "bpo-skyrl-episode-v1"


@dataclass
class _Progress:
    """The adapter's part of an episode (what a snapshot must carry besides the env)."""

    context: Context
    turns: int = 0
    done: bool = False
    won: bool = False


# the adapter's progress for each live snapshot taken by SkyRLEnv.snapshot(), any instance
_ALL_STATES: weakref.WeakKeyDictionary[bpo_envs.Snapshot, _Progress] = weakref.WeakKeyDictionary()


def _as_dict(value: Any, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    try:  # SkyRL passes OmegaConf configs
        from omegaconf import DictConfig, OmegaConf

        if isinstance(value, DictConfig):
            return dict(OmegaConf.to_container(value, resolve=True))  # type: ignore[arg-type]
    except ImportError:
        pass
    raise TypeError(f"{name} must be a mapping, got {type(value).__name__}")


class SkyRLEnv(BaseTextEnv):
    """A ``BPO-*`` env behind SkyRL-gym's text-env interface.

    Args:
        env_config: ``{"env_id": "BPO-...", **gym.make kwargs}`` (optionally ``prompt_config``).
        extras: the row's env extras: ``task_id`` (or ``seed``, or ``state``).
    """

    def __init__(self, env_config: Any = None, extras: Any = None) -> None:
        super().__init__()
        config = _as_dict(env_config, "env_config")
        self.extras = _as_dict(extras, "extras")
        env_id = config.pop("env_id", None)
        if not env_id:
            raise ValueError(
                f"env_config needs an env_id naming the env, one of {', '.join(bpo_envs.ENV_IDS)}"
            )
        prompt = config.pop("prompt_config", None)
        self.prompt_config = require_summary_layout(
            prompt if isinstance(prompt, PromptConfig) else PromptConfig(**_as_dict(prompt, "prompt_config")), "SkyRL")
        self.env_id = str(env_id)
        self.env = gym.make(self.env_id, **config)
        check_step_limit(self.env)
        owner = declared(self.env)  # None for an env that is not ours: only its TimeLimit counts
        limits = [owner.max_episode_steps if owner is not None else None,
                  self.env.spec.max_episode_steps if self.env.spec is not None else None]
        limits = [int(n) for n in limits if n]  # gym.make's max_episode_steps= adds a TimeLimit
        self.max_turns = min(limits) if limits else self.max_turns
        self._progress: _Progress | None = None

    # SkyRL's interface

    def init(self, prompt: Any = None) -> tuple[list[dict[str, str]], dict[str, Any]]:
        """Reset to ``extras``' task; the first chat in this project's format (the dataset prompt
        is replaced: the env states the task) and ``{"task_id", "admissible_actions"}``."""
        if self.extras.get("state") is not None:
            self.restore(self.extras["state"])
        else:
            task_id, seed = self.extras.get("task_id"), self.extras.get("seed")
            if task_id is None and seed is None:
                raise ValueError(f"extras for {self.env_id} need a task_id (or a seed); got keys {sorted(self.extras)}")
            obs, info = self.env.reset(seed=seed, options={"task_id": task_id} if task_id is not None else None)
            admissible = info.get("admissible_actions")
            context = Context(info["task_id"], obs, tuple(admissible) if admissible is not None else None, (), obs)
            self._progress = _Progress(context)
        self.turns = self._progress.turns
        context = self._progress.context
        return build_messages(context, self.prompt_config), {
            "task_id": context.task_id,
            "admissible_actions": list(context.admissible_actions) if context.admissible_actions is not None else None,
        }

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """One env step with the action parsed from the model's ``action`` text."""
        progress = self._need_progress()
        if progress.done:
            raise RuntimeError("the episode is over (done=True was returned); call init() for a new one")
        text = action if isinstance(action, str) else str(action)
        command = env_action(text, self.prompt_config)
        obs, reward, terminated, truncated, info = self.env.step(command)
        admissible = info.get("admissible_actions")
        progress.context = progress.context.child(command, obs, admissible)
        progress.turns += 1
        progress.done = bool(terminated or truncated)
        progress.won = bool(info.get("won", False))
        self.turns = progress.turns
        observations = [] if progress.done else [{"role": "user", "content": self._message(progress.context)}]
        metadata = {
            "task_id": info.get("task_id"),
            "won": bool(info.get("won", False)),
            "admissible_actions": list(admissible) if admissible is not None else None,
            "invalid_action": bool(info.get("invalid_action", False)),
            "terminated": bool(terminated),
            "truncated": bool(truncated),
            "action": command,
        }
        if progress.done:
            metadata["final_observation"] = obs
        return BaseTextEnvStepOutput(
            observations=observations,
            reward=float(reward),
            done=progress.done,
            metadata=metadata,
            postprocessed_action=None,  # the model's tokens stay what is trained (module docstring)
        )

    def close(self) -> None:
        self.env.close()

    def get_metrics(self) -> dict[str, Any]:
        progress = self._progress
        if progress is None:
            return {}
        return {"steps": progress.turns, "won": float(progress.won)}

    # snapshots (docs/snapshots.md)

    def snapshot(self) -> bpo_envs.Snapshot:
        """``bpo_envs.snapshot(self.env)``; the adapter's turn count and history are kept with it."""
        progress = self._need_progress()
        snap = bpo_envs.snapshot(self.env)
        _ALL_STATES[snap] = copy.deepcopy(progress)
        return snap

    def restore(self, snap: bpo_envs.Snapshot | bytes) -> None:
        """Return to ``snap`` (from :meth:`snapshot` of any instance of the same env, or
        :meth:`portable_state` bytes)."""
        if isinstance(snap, (bytes, bytearray, memoryview)):
            payload = _decode(bytes(snap))
            if payload["env_id"] != self.env_id:
                raise ValueError(f"a state of {payload['env_id']} cannot resume a {self.env_id} env")
            saved = payload["progress"]
            turns, done, won = saved.get("turns"), saved.get("done"), saved.get("won")
            if isinstance(turns, bool) or not isinstance(turns, int) or not isinstance(done, bool) or not isinstance(won, bool):
                raise ValueError("SkyRLEnv.portable_state() bytes: the turn count or flags have the wrong types")
            progress = _Progress(context_from_data(saved.get("context")), turns, done, won)
            bpo_envs.restore(self.env, payload["env"])
            self._progress = progress
        elif isinstance(snap, bpo_envs.Snapshot):
            progress = _ALL_STATES.get(snap)
            if progress is None:
                raise ValueError(
                    "this snapshot was not taken by SkyRLEnv.snapshot(), so the chat history is unknown; "
                    "take snapshots with env.snapshot()"
                )
            bpo_envs.restore(self.env, snap)
            self._progress = copy.deepcopy(progress)
        else:
            raise TypeError(f"restore() takes a Snapshot or portable_state() bytes, not {type(snap).__name__}")
        self.turns = self._progress.turns

    def portable_state(self) -> bytes:
        """This episode as bytes for ``extras["state"]`` or ``restore`` in another process:
        plain data (:mod:`bpo_envs.portable`), restoring from them never runs code."""
        progress = self._need_progress()
        payload = {
            "env_id": self.env_id,
            "env": bpo_envs.snapshot(self.env).portable(),
            "progress": {"context": context_data(progress.context), "turns": progress.turns, "done": progress.done,
                         "won": progress.won},
        }
        return dumps(_STATE_FORMAT, payload)

    # helpers

    @property
    def context(self) -> Context:
        """The current decision point (observation, admissible actions, history)."""
        return self._need_progress().context

    def _need_progress(self) -> _Progress:
        if self._progress is None:
            raise RuntimeError("call init() first")
        return self._progress

    def _message(self, context: Context) -> str:
        """Later turns: the current observation and admissible actions (the chat holds the history)."""
        current = Context(context.task_id, context.observation, context.admissible_actions, (), context.observation)
        return build_messages(current, self.prompt_config)[1]["content"]


def _decode(blob: bytes) -> dict[str, Any]:
    try:
        return decode_portable(blob, format=_STATE_FORMAT, what="SkyRLEnv.portable_state() bytes",
                               fields={"env_id": str, "env": bytes, "progress": dict})
    except SnapshotError as exc:
        raise ValueError(str(exc)) from exc


def _creator(env_id: str) -> Any:
    def make(env_config: Any = None, extras: Any = None, **kwargs: Any) -> SkyRLEnv:
        config = {"env_id": env_id, **_as_dict(env_config, "env_config"), **kwargs}
        return SkyRLEnv(config, extras)

    make.__name__ = f"make_{env_id.replace('-', '_')}"
    return make


def register_skyrl_envs() -> list[str]:
    """Register every ``BPO-*`` id with ``skyrl_gym`` (idempotent); returns the ids."""
    for env_id in bpo_envs.ENV_IDS:
        if env_id not in skyrl_gym.registry:
            skyrl_gym.register(id=env_id, entry_point=_creator(env_id))
    return list(bpo_envs.ENV_IDS)


register_skyrl_envs()
